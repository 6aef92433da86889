//===- PlanArgs.h - the plan's typed keyword arguments, by name ------------===//
//
// plan.fbs holds a call's keyword arguments (CallArgs) and a role's options
// (RoleOptions) as typed fields. This is the one list of those fields by
// name: the plan emitter sets them from the compiler's attributes, the
// loader checks every field a plan sets against the shared tables
// (RoleMethods.h, BuiltinTable.h) and their ranges, the JSON printer shows
// them. The runtime reads the generated accessors themselves.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_PLANARGS_H
#define HFLOW_RUNTIME_SCHEMA_PLANARGS_H

#include "runtime/schema/RoleMethods.h"
#include "runtime/schema/plan_generated.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hflow::planargs {

/// How a field is stored in the plan.
enum class Storage { Int, Real, Bool, Text };

/// One value, in the storage its field has (or, going into the builder, the
/// storage the compiler's attribute had: converted where exact).
struct ArgValue {
  Storage storage = Storage::Int;
  int64_t i = 0;
  double x = 0;
  bool b = false;
  std::string text;

  static ArgValue integer(int64_t v) { ArgValue a; a.storage = Storage::Int; a.i = v; return a; }
  static ArgValue real(double v) { ArgValue a; a.storage = Storage::Real; a.x = v; return a; }
  static ArgValue boolean(bool v) { ArgValue a; a.storage = Storage::Bool; a.b = v; return a; }
  static ArgValue string(std::string v) {
    ArgValue a; a.storage = Storage::Text; a.text = std::move(v); return a;
  }
};

using Named = std::vector<std::pair<std::string, ArgValue>>;

struct Field {
  std::string_view name;
  Storage storage;
};

/// The fields of CallArgs / RoleOptions, in the schema's order.
const std::vector<Field> &callFields();
const std::vector<Field> &roleOptionFields();

/// The storage a keyword of type `t` is held in.
Storage storageOf(methods::ArgType t);

/// The fields set, sorted by name. A null table has none.
Named setFields(const plan::CallArgs *a);
Named setFields(const plan::RoleOptions *o);

/// Builds the table from name/value pairs. False, with `*err` saying which
/// name and why, for a name the table has no field for or a value its
/// field's storage cannot hold exactly (a fraction for a count, a number
/// for a flag).
bool buildCallArgs(flatbuffers::FlatBufferBuilder &b, const Named &values,
                   flatbuffers::Offset<plan::CallArgs> &out, std::string *err);
bool buildRoleOptions(flatbuffers::FlatBufferBuilder &b, const Named &values,
                      flatbuffers::Offset<plan::RoleOptions> &out, std::string *err);

/// Why `v` (in its field's storage) is not a value keyword `k` accepts;
/// empty when it is.
std::string checkValue(const methods::KeywordArg &k, const ArgValue &v);

/// The value as the program would write it (17 significant digits for a
/// number that is not an integer).
std::string show(const ArgValue &v);

} // namespace hflow::planargs

#endif // HFLOW_RUNTIME_SCHEMA_PLANARGS_H
