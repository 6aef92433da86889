//===- PlanArgs.cpp - the plan's typed keyword arguments, by name ----------===//
#include "runtime/schema/PlanArgs.h"

#include "runtime/schema/BuiltinTable.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

namespace hflow::planargs {

// Each table's fields once, as plan.fbs declares them: (name, storage).
#define HFLOW_CALL_ARGS(X)                                                      \
  X(n, Int) X(max_tokens, Int) X(temperature, Real) X(top_p, Real)              \
  X(top_k, Int) X(greedy, Bool) X(stop, Text) X(max_num_seqs, Int)              \
  X(kv_block_size, Int) X(max_batch_tokens, Int) X(micro_batch, Int)            \
  X(minibatch, Int) X(epochs, Int) X(lr, Real) X(clip, Real) X(clip_low, Real)  \
  X(clip_high, Real) X(clip_ratio_c, Real) X(kl_coef, Real) X(kl, Text)         \
  X(entropy_coef, Real) X(loss_agg, Text) X(clip_value, Real) X(gamma, Real)    \
  X(lam, Real) X(norm_by_std, Bool) X(epsilon, Real) X(kind, Text) X(min, Real) \
  X(max, Real) X(scalar, Real) X(scalar_lhs, Bool) X(scale_rhs, Real)          \
  X(rollout_is, Text) X(rollout_is_threshold, Real) X(rollout_rs, Text)         \
  X(rollout_rs_threshold, Text) X(policy_loss, Text) X(buffer, Int) X(factor, Real) \
  X(max_draws, Int) X(env, Text) X(max_turns, Int) X(turn_tokens, Int)                \
  X(env_timeout, Real) X(env_memory_mb, Int) X(env_isolate, Bool)

#define HFLOW_ROLE_OPTIONS(X)                                                   \
  X(optimizer, Text) X(lr, Real) X(weight_decay, Real) X(clip_grad, Real)       \
  X(warmup, Int) X(temperature, Real) X(top_p, Real) X(top_k, Int)              \
  X(memory_utilization, Real) X(dtype, Text) X(transfer_dtype, Text)           \
  X(routing_replay, Bool) X(recompute, Text) X(offload_optimizer, Real) \
  X(offload_params, Real)

namespace {

// Reading one field: present or not, by storage.
bool read(flatbuffers::Optional<int64_t> v, ArgValue &out) {
  if (!v.has_value())
    return false;
  out = ArgValue::integer(*v);
  return true;
}
bool read(flatbuffers::Optional<double> v, ArgValue &out) {
  if (!v.has_value())
    return false;
  out = ArgValue::real(*v);
  return true;
}
bool read(flatbuffers::Optional<bool> v, ArgValue &out) {
  if (!v.has_value())
    return false;
  out = ArgValue::boolean(*v);
  return true;
}
bool read(const flatbuffers::String *v, ArgValue &out) {
  if (!v)
    return false;
  out = ArgValue::string(v->str());
  return true;
}

/// `v` in storage `s`, where the conversion is exact.
bool convert(const ArgValue &v, Storage s, ArgValue &out) {
  switch (s) {
  case Storage::Int:
    if (v.storage == Storage::Int) {
      out = v;
      return true;
    }
    if (v.storage == Storage::Real && std::isfinite(v.x) && v.x == std::floor(v.x) &&
        std::fabs(v.x) < 9.0e15) {
      out = ArgValue::integer(int64_t(v.x));
      return true;
    }
    return false;
  case Storage::Real:
    if (v.storage == Storage::Real || v.storage == Storage::Int) {
      out = ArgValue::real(v.storage == Storage::Real ? v.x : double(v.i));
      return true;
    }
    return false;
  case Storage::Bool:
    if (v.storage == Storage::Bool) {
      out = v;
      return true;
    }
    if (v.storage == Storage::Text && (v.text == "true" || v.text == "false")) {
      out = ArgValue::boolean(v.text == "true");
      return true;
    }
    return false;
  case Storage::Text:
    if (v.storage != Storage::Text)
      return false;
    out = v;
    return true;
  }
  return false;
}

const char *storageName(Storage s) {
  switch (s) {
  case Storage::Int: return "an integer";
  case Storage::Real: return "a number";
  case Storage::Bool: return "true or false";
  case Storage::Text: return "a string";
  }
  return "?";
}

/// The values converted to their fields' storage, or false with *err.
bool typed(const std::vector<Field> &fields, const Named &values, const char *table,
           std::vector<std::pair<const Field *, ArgValue>> &out, std::string *err) {
  for (const auto &[name, v] : values) {
    auto f = std::find_if(fields.begin(), fields.end(),
                          [&](const Field &f) { return f.name == name; });
    if (f == fields.end()) {
      if (err)
        *err = "'" + name + "' has no field in the plan's " + table;
      return false;
    }
    ArgValue c;
    if (!convert(v, f->storage, c)) {
      if (err)
        *err = "'" + name + "' must be " + storageName(f->storage) + ", got " + show(v);
      return false;
    }
    out.push_back({&*f, std::move(c)});
  }
  return true;
}

void sortByName(Named &n) {
  std::sort(n.begin(), n.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
}

} // namespace

#define HFLOW_FIELD_ENTRY(fld, storage) Field{#fld, Storage::storage},

const std::vector<Field> &callFields() {
  static const std::vector<Field> fields = {HFLOW_CALL_ARGS(HFLOW_FIELD_ENTRY)};
  return fields;
}

const std::vector<Field> &roleOptionFields() {
  static const std::vector<Field> fields = {HFLOW_ROLE_OPTIONS(HFLOW_FIELD_ENTRY)};
  return fields;
}

Storage storageOf(methods::ArgType t) {
  using methods::ArgType;
  switch (t) {
  case ArgType::Count:
  case ArgType::Natural: return Storage::Int;
  case ArgType::Bool: return Storage::Bool;
  case ArgType::Choice:
  case ArgType::String:
  case ArgType::NotYet: return Storage::Text;
  default: return Storage::Real;
  }
}

namespace {

#define HFLOW_READ_FIELD(fld, storage)                                          \
  if (ArgValue v; read(t.fld(), v))                                             \
    out.push_back({#fld, std::move(v)});

void readFields(const plan::CallArgs &t, Named &out) { HFLOW_CALL_ARGS(HFLOW_READ_FIELD) }
void readFields(const plan::RoleOptions &t, Named &out) { HFLOW_ROLE_OPTIONS(HFLOW_READ_FIELD) }

template <typename Table> Named setFieldsOf(const Table *t) {
  Named out;
  if (t)
    readFields(*t, out);
  sortByName(out);
  return out;
}

} // namespace

Named setFields(const plan::CallArgs *t) { return setFieldsOf(t); }
Named setFields(const plan::RoleOptions *t) { return setFieldsOf(t); }

namespace {

using TextOffsets = std::map<std::string, flatbuffers::Offset<flatbuffers::String>>;

// Adding one field, by name, to its table's builder.
#define HFLOW_ADD_Int(fld) tb.add_##fld(v.i);
#define HFLOW_ADD_Real(fld) tb.add_##fld(v.x);
#define HFLOW_ADD_Bool(fld) tb.add_##fld(v.b);
#define HFLOW_ADD_Text(fld) tb.add_##fld(text.at(#fld));
#define HFLOW_ADD_FIELD(fld, storage)                                           \
  if (f.name == #fld) {                                                         \
    HFLOW_ADD_##storage(fld) return;                                            \
  }

void addField(plan::CallArgsBuilder &tb, const Field &f, const ArgValue &v,
              const TextOffsets &text) {
  HFLOW_CALL_ARGS(HFLOW_ADD_FIELD)
}
void addField(plan::RoleOptionsBuilder &tb, const Field &f, const ArgValue &v,
              const TextOffsets &text) {
  HFLOW_ROLE_OPTIONS(HFLOW_ADD_FIELD)
}

/// One table from name/value pairs: the values typed, their strings
/// created first (FlatBuffers does not nest them in a table being built),
/// then each field added.
template <typename TableBuilder>
bool buildTable(flatbuffers::FlatBufferBuilder &b, const std::vector<Field> &fields,
                const Named &values, const char *table,
                flatbuffers::Offset<typename TableBuilder::Table> &out, std::string *err) {
  std::vector<std::pair<const Field *, ArgValue>> vals;
  if (!typed(fields, values, table, vals, err))
    return false;
  TextOffsets text;
  for (const auto &[f, v] : vals)
    if (f->storage == Storage::Text)
      text[std::string(f->name)] = b.CreateString(v.text);
  TableBuilder tb(b);
  for (const auto &[f, v] : vals)
    addField(tb, *f, v, text);
  out = tb.Finish();
  return true;
}

} // namespace

bool buildCallArgs(flatbuffers::FlatBufferBuilder &b, const Named &values,
                   flatbuffers::Offset<plan::CallArgs> &out, std::string *err) {
  return buildTable<plan::CallArgsBuilder>(b, callFields(), values, "call arguments", out, err);
}

bool buildRoleOptions(flatbuffers::FlatBufferBuilder &b, const Named &values,
                      flatbuffers::Offset<plan::RoleOptions> &out, std::string *err) {
  return buildTable<plan::RoleOptionsBuilder>(b, roleOptionFields(), values, "role options",
                                              out, err);
}

std::string checkValue(const methods::KeywordArg &k, const ArgValue &v) {
  using methods::ArgType;
  if (v.storage != storageOf(k.type))
    return std::string("must be ") + storageName(storageOf(k.type)) + ", got " + show(v);
  const double x = v.x;
  const bool finite = std::isfinite(x);
  switch (k.type) {
  case ArgType::Count:
    return v.i >= 1 ? "" : "must be positive, got " + show(v);
  case ArgType::Natural:
    return v.i >= 0 ? "" : "must not be negative, got " + show(v);
  case ArgType::NonNegative:
    return finite && x >= 0 ? "" : "must be a finite number >= 0, got " + show(v);
  case ArgType::Fraction:
    return x >= 0 && x <= 1 ? "" : "must be in [0, 1], got " + show(v);
  case ArgType::Probability:
    return x > 0 && x <= 1 ? "" : "must be in (0, 1], got " + show(v);
  case ArgType::Positive:
    return finite && x > 0 ? "" : "must be a finite number > 0, got " + show(v);
  case ArgType::Number:
    return finite ? "" : "must be a finite number, got " + show(v);
  case ArgType::AboveOne:
    return finite && x > 1 ? "" : "must be a finite number > 1, got " + show(v);
  case ArgType::Bool:
    return "";
  case ArgType::Choice:
    return builtins::isChoice(k, v.text)
               ? ""
               : "must be one of " + std::string(k.choices) + ", got '" + v.text + "'";
  case ArgType::String:
    return v.text.empty() ? "must not be empty" : "";
  case ArgType::NotYet:
    return "is not executed by this runtime (" + std::string(k.choices) + ")";
  }
  return "has an unknown type";
}

std::string show(const ArgValue &v) {
  switch (v.storage) {
  case Storage::Int: return std::to_string(v.i);
  case Storage::Real: {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v.x);
    return buf;
  }
  case Storage::Bool: return v.b ? "true" : "false";
  case Storage::Text: return "'" + v.text + "'";
  }
  return "?";
}

} // namespace hflow::planargs
