#include "runtime/schema/Shape.h"
