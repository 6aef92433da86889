//===- HflowOps.h - the hflow dialect's attributes, types and ops ----------===//
#ifndef HFLOW_DIALECT_HFLOWOPS_H
#define HFLOW_DIALECT_HFLOWOPS_H

#include "hflow/HflowDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "hflow/HflowOpsEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "hflow/HflowOpsAttributes.h.inc"

#define GET_TYPEDEF_CLASSES
#include "hflow/HflowOpsTypes.h.inc"

#define GET_OP_CLASSES
#include "hflow/HflowOps.h.inc"

#endif // HFLOW_DIALECT_HFLOWOPS_H
