//===- HflowOps.h - the hflow dialect's attributes, types and ops ----------===//
#ifndef HFLOW_DIALECT_HFLOWOPS_H
#define HFLOW_DIALECT_HFLOWOPS_H

#include "dialects/hflow/HflowDialect.h"
#include "runtime/schema/ModelShape.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/hflow/HflowOpsEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/hflow/HflowOpsAttributes.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/hflow/HflowOpsTypes.h.inc"

#define GET_OP_CLASSES
#include "dialects/hflow/HflowOps.h.inc"

#endif // HFLOW_DIALECT_HFLOWOPS_H
