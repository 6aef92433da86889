// Planted: the dialect including the front end, and a generated header.
#include "dialects/hflow/HflowOps.h.inc"
#include "compiler/frontend/AST.h"
