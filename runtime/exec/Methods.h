//===- Methods.h - which role methods the engine executes -------------------===//
//
// The engine's executors are found by name (Methods.cpp); the names a plan
// may use are runtime/schema/RoleMethods.h's table. MethodsTest keeps the
// two equal.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_METHODS_H
#define HFLOW_RUNTIME_EXEC_METHODS_H

#include <string_view>

namespace hflow::exec {

/// True when the engine has an executor for the role method `name`.
bool executesMethod(std::string_view name);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_METHODS_H
