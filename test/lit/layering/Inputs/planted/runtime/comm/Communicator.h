// Planted: a bare include and a runtime header pulling in MLIR.
#include "Rendezvous.h"
#include "mlir/IR/MLIRContext.h"
