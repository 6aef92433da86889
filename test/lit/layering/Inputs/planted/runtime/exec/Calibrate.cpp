// Planted: the runtime reaching into the compiler's cost model.
#include "runtime/comm/Communicator.h"
#include "compiler/planner/CostModel.h"
