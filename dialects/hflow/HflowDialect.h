//===- HflowDialect.h - the hflow dialect ----------------------------------===//
#ifndef HFLOW_DIALECT_HFLOWDIALECT_H
#define HFLOW_DIALECT_HFLOWDIALECT_H

#include "mlir/IR/Dialect.h"

#include "dialects/hflow/HflowOpsDialect.h.inc"

#endif // HFLOW_DIALECT_HFLOWDIALECT_H
