//===- HflowDialect.cpp - the hflow dialect --------------------------------===//

#include "hflow/HflowDialect.h"
#include "hflow/HflowOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::hflow;

#include "hflow/HflowOpsDialect.cpp.inc"
#include "hflow/HflowOpsEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "hflow/HflowOpsAttributes.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "hflow/HflowOpsTypes.cpp.inc"

void HflowDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "hflow/HflowOpsAttributes.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "hflow/HflowOpsTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "hflow/HflowOps.cpp.inc"
      >();
}

LogicalResult
LayoutAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t dp,
                   int64_t tp, int64_t pp) {
  if (dp < 0)
    return emitError() << "layout dp must be positive, or 0 for 'inferred', got "
                       << dp;
  if (tp < 1 || pp < 1)
    return emitError() << "layout tp and pp must be positive, got tp = " << tp
                       << ", pp = " << pp;
  return success();
}
