//===- HflowDialect.cpp - the hflow dialect --------------------------------===//

#include "dialects/hflow/HflowDialect.h"
#include "dialects/hflow/HflowOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::hflow;

#include "dialects/hflow/HflowOpsDialect.cpp.inc"
#include "dialects/hflow/HflowOpsEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/hflow/HflowOpsAttributes.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialects/hflow/HflowOpsTypes.cpp.inc"

void HflowDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/hflow/HflowOpsAttributes.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialects/hflow/HflowOpsTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialects/hflow/HflowOps.cpp.inc"
      >();
}

LogicalResult
LayoutAttr::verify(function_ref<InFlightDiagnostic()> emitError, int64_t dp,
                   int64_t tp, int64_t pp, int64_t fsdp, int64_t sp, int64_t cp,
                   int64_t ep, int64_t fold) {
  if (tp == 0) {
    if (dp != 0 || pp != 0 || fsdp != 1 || sp != 1 || cp != 1 || ep != 1 || fold != 0)
      return emitError() << "an auto layout (tp = 0) has dp = 0, pp = 0 and "
                            "no other degrees";
    return success();
  }
  if (dp < 0 || fsdp < 0)
    return emitError() << "layout dp and fsdp must be positive, or 0 for "
                          "'inferred', got dp = "
                       << dp << ", fsdp = " << fsdp;
  if (dp == 0 && fsdp == 0)
    return emitError() << "only one of dp and fsdp can be inferred (0)";
  if (pp < 1 || sp < 1 || cp < 1)
    return emitError() << "layout tp, pp, sp and cp must be positive, got tp = "
                       << tp << ", pp = " << pp << ", sp = " << sp
                       << ", cp = " << cp;
  if (ep < 1)
    return emitError() << "layout ep must be positive, got ep = " << ep;
  if (fold != 0 && fold != 1)
    return emitError() << "layout fold is 0 or 1, got " << fold;
  if (fold && (tp < 2 || ep != 1))
    return emitError() << "a folded layout (fold = 1: the experts whole over the tp ranks) "
                          "has tp > 1 and ep = 1, got tp = "
                       << tp << ", ep = " << ep;
  if (dp > 0 && dp % ep != 0)
    return emitError() << "layout ep = " << ep << " does not divide dp = " << dp
                       << " (ep splits the experts over data-parallel ranks)";
  for (int64_t d : {dp, tp, pp, fsdp, sp, cp, ep})
    if (d > (int64_t(1) << 20))
      return emitError() << "layout degree " << d << " is larger than any mesh";
  return success();
}
