//===- TemplateValue.cpp - the renderer's values: JS-like, from and to JSON ---===//
#include "runtime/data/TemplateDetail.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace hflow::data::tmpl {

namespace {
/// A value of type `t` whose one payload, `field`, is `x`.
template <class Field, class X> Value tagged(VT t, Field Value::*field, X x) {
  Value v;
  v.t = t;
  v.*field = std::move(x);
  return v;
}
} // namespace

Value mkUndef() { return Value(); }

Value mkNull() {
  Value v;
  v.t = VT::Null;
  return v;
}

Value mkBool(bool b) { return tagged(VT::Bool, &Value::b, b); }

Value mkInt(double n) { return tagged(VT::Int, &Value::n, n); }

Value mkFloat(double n) { return tagged(VT::Float, &Value::n, n); }

Value mkStr(std::string s) {
  if (s.size() > kMaxTemplateBytes)
    throw JsError("a string grew to " + std::to_string(s.size()) + " bytes, more than the " +
                  std::to_string(kMaxTemplateBytes >> 20) + " MiB a template may make (the limit)");
  return tagged(VT::String, &Value::s,
                std::make_shared<const std::string>(std::move(s)));
}

Value mkArr(Array a, VT t) {
  return tagged(t, &Value::a, std::make_shared<const Array>(std::move(a)));
}

Value mkObj(std::shared_ptr<ObjData> o, VT t) {
  return tagged(t, &Value::o, std::move(o));
}

Value mkFunc(FuncData::Kind kind, std::string name, Value receiver, const Node *macro) {
  auto f = std::make_shared<FuncData>();
  f->kind = kind;
  f->name = std::move(name);
  f->receiver = std::move(receiver);
  f->macro = macro;
  return tagged(VT::Function, &Value::f, std::move(f));
}

Value mkNumber(double n) { return isIntegral(n) ? mkInt(n) : mkFloat(n); }

const char *typeName(const Value &v) {
  switch (v.t) {
  case VT::Undefined: return "UndefinedValue";
  case VT::Null: return "NullValue";
  case VT::Bool: return "BooleanValue";
  case VT::Int: return "IntegerValue";
  case VT::Float: return "FloatValue";
  case VT::String: return "StringValue";
  case VT::Array: return "ArrayValue";
  case VT::Tuple: return "TupleValue";
  case VT::Object: return "ObjectValue";
  case VT::KwArgs: return "KeywordArgumentsValue";
  case VT::Namespace: return "NamespaceValue";
  case VT::Function: return "FunctionValue";
  }
  return "?";
}

bool truthy(const Value &v) {
  switch (v.t) {
  case VT::Undefined: case VT::Null: return false;
  case VT::Bool: return v.b;
  case VT::Int: case VT::Float: return v.n != 0 && !std::isnan(v.n);
  case VT::String: return !v.s->empty();
  case VT::Array: case VT::Tuple: return !v.a->empty();
  case VT::Object: case VT::KwArgs: return !v.o->items.empty();
  case VT::Namespace: case VT::Function: return true;
  }
  return false;
}

bool isArrayIndexKey(const std::string &k, double &out) {
  if (k.empty() || k.size() > 10 || (k.size() > 1 && k[0] == '0'))
    return false;
  for (char c : k)
    if (c < '0' || c > '9')
      return false;
  out = std::strtod(k.c_str(), nullptr);
  return out < 4294967295.0;
}

Value fromJson(const nlohmann::ordered_json &j) {
  switch (j.type()) {
  case nlohmann::ordered_json::value_t::null: return mkNull();
  case nlohmann::ordered_json::value_t::boolean: return mkBool(j.get<bool>());
  case nlohmann::ordered_json::value_t::number_integer: return mkInt(static_cast<double>(j.get<int64_t>()));
  case nlohmann::ordered_json::value_t::number_unsigned: return mkInt(static_cast<double>(j.get<uint64_t>()));
  case nlohmann::ordered_json::value_t::number_float: return mkNumber(j.get<double>());
  case nlohmann::ordered_json::value_t::string: return mkStr(j.get<std::string>());
  case nlohmann::ordered_json::value_t::array: {
    Array a;
    a.reserve(j.size());
    for (auto &e : j)
      a.push_back(fromJson(e));
    return mkArr(std::move(a));
  }
  case nlohmann::ordered_json::value_t::object: {
    auto o = std::make_shared<ObjData>();
    std::vector<std::pair<double, std::string>> indexKeys;
    for (auto it = j.begin(); it != j.end(); ++it) {
      double idx;
      if (isArrayIndexKey(it.key(), idx))
        indexKeys.emplace_back(idx, it.key());
    }
    std::sort(indexKeys.begin(), indexKeys.end());
    for (auto &ik : indexKeys)
      o->items.emplace_back(ik.second, fromJson(j.at(ik.second)));
    for (auto it = j.begin(); it != j.end(); ++it) {
      double idx;
      if (!isArrayIndexKey(it.key(), idx))
        o->set(it.key(), fromJson(it.value()));
    }
    return mkObj(std::move(o));
  }
  default:
    throw JsError("unsupported JSON value (binary or discarded)");
  }
}

std::string jsonQuote(const std::string &s, bool ensureAscii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t c = decodeUtf8Lenient(s, i);
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default: {
      char buf[16];
      if (c < 0x20 || (c >= 0xD800 && c <= 0xDFFF)) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else if (ensureAscii && c >= 0x7F) {
        if (c >= 0x10000) {
          uint32_t v = c - 0x10000;
          std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        }
        out += buf;
      } else {
        out.append(s, start, i - start);
      }
    }
    }
  }
  out += '"';
  return out;
}

std::string toJson(const Value &v, const JsonOpts &o, int depth, bool undefToNull) {
  std::string itemSep, keySep;
  if (o.hasSeparators) {
    itemSep = o.itemSep;
    keySep = o.keySep;
  } else if (o.indent) {
    itemSep = ",";
    keySep = ": ";
  } else {
    itemSep = ", ";
    keySep = ": ";
  }
  switch (v.t) {
  case VT::Null: return "null";
  case VT::Undefined: return undefToNull ? "null" : "undefined";
  case VT::Int: case VT::Float: return std::isfinite(v.n) ? jsNumber(v.n) : "null";
  case VT::Bool: return v.b ? "true" : "false";
  case VT::String: return jsonQuote(v.str(), o.ensureAscii);
  case VT::Array: case VT::Object: case VT::Namespace: {
    std::string indentStr(o.indent > 0 ? o.indent : 0, ' ');
    std::string base = "\n";
    for (int i = 0; i < depth; ++i)
      base += indentStr;
    std::string child = base + indentStr;
    std::string out;
    if (v.t == VT::Array) {
      if (o.indent && !v.a->empty()) {
        out = "[" + child;
        for (size_t i = 0; i < v.a->size(); ++i) {
          if (i)
            out += itemSep + child;
          out += toJson((*v.a)[i], o, depth + 1, undefToNull);
        }
        out += base + "]";
      } else {
        out = "[";
        for (size_t i = 0; i < v.a->size(); ++i) {
          if (i)
            out += itemSep;
          out += toJson((*v.a)[i], o, depth + 1, undefToNull);
        }
        out += "]";
      }
      return out;
    }
    out = "{";
    bool first = true;
    for (auto &kv : v.o->items) {
      if (!first)
        out += itemSep;
      first = false;
      if (o.indent)
        out += child;
      out += jsonQuote(kv.first, o.ensureAscii) + keySep + toJson(kv.second, o, depth + 1, undefToNull);
    }
    if (o.indent && !v.o->items.empty())
      out += base;
    out += "}";
    return out;
  }
  default:
    throw JsError(std::string("Cannot convert to JSON: ") + typeName(v));
  }
}

std::string toStr(const Value &v) {
  switch (v.t) {
  case VT::Undefined: return "undefined";
  case VT::Null: return "undefined"; // a NullValue holds JavaScript undefined
  case VT::Bool: return v.b ? "true" : "false";
  case VT::Int: return jsNumber(v.n);
  case VT::Float: return jsFloatString(v.n);
  case VT::String: return v.str();
  case VT::Array: case VT::Tuple: case VT::Object: case VT::Namespace:
    return toJson(v, JsonOpts(), 0, false);
  case VT::KwArgs: return toJson(v, JsonOpts(), 0, false);
  case VT::Function: throw JsError("cannot render a function as text");
  }
  return "";
}

std::string rawStr(const Value &v) {
  switch (v.t) {
  case VT::Undefined: return "undefined";
  case VT::Null: return "undefined";
  case VT::Bool: return v.b ? "true" : "false";
  case VT::Int: case VT::Float: return jsNumber(v.n);
  case VT::String: return v.str();
  case VT::Array: case VT::Tuple: {
    std::string out;
    for (size_t i = 0; i < v.a->size(); ++i) {
      if (i)
        out += ",";
      out += toStr((*v.a)[i]);
    }
    return out;
  }
  case VT::Object: case VT::KwArgs: case VT::Namespace: return "[object Map]";
  case VT::Function: throw JsError("cannot convert a function to text");
  }
  return "";
}

bool strictEq(const Value &x, const Value &y) {
  auto nullish = [](const Value &v) { return v.t == VT::Null || v.t == VT::Undefined; };
  if (nullish(x) || nullish(y))
    return nullish(x) && nullish(y);
  auto cls = [](const Value &v) {
    switch (v.t) {
    case VT::Int: case VT::Float: return 1;
    default: return static_cast<int>(v.t) + 10;
    }
  };
  if (cls(x) != cls(y)) {
    // Arrays and tuples are both JavaScript arrays; objects of all kinds Maps.
    if (x.isArray() && y.isArray())
      return x.a == y.a;
    if (x.isAttrContainer() && y.isAttrContainer())
      return x.o == y.o;
    return false;
  }
  switch (x.t) {
  case VT::Undefined: case VT::Null: return true;
  case VT::Bool: return x.b == y.b;
  case VT::Int: case VT::Float: return x.n == y.n;
  case VT::String: return x.str() == y.str();
  case VT::Array: case VT::Tuple: return x.a == y.a;
  case VT::Object: case VT::KwArgs: case VT::Namespace: return x.o == y.o;
  case VT::Function: return x.f == y.f;
  }
  return false;
}

bool looseEq(const Value &x, const Value &y) {
  auto nullish = [](const Value &v) { return v.t == VT::Null || v.t == VT::Undefined; };
  auto isObj = [](const Value &v) { return v.isArray() || v.isAttrContainer() || v.t == VT::Function; };
  if (nullish(x) || nullish(y))
    return nullish(x) && nullish(y);
  if (isObj(x) && isObj(y))
    return strictEq(x, y);
  if (x.isNumber() && y.isNumber())
    return x.n == y.n;
  if (x.t == VT::String && y.t == VT::String)
    return x.str() == y.str();
  if (x.t == VT::Bool && y.t == VT::Bool)
    return x.b == y.b;
  if (x.t == VT::Bool)
    return looseEq(mkInt(x.b ? 1 : 0), y);
  if (y.t == VT::Bool)
    return looseEq(x, mkInt(y.b ? 1 : 0));
  if (x.isNumber() && y.t == VT::String)
    return x.n == jsToNumber(y.str());
  if (x.t == VT::String && y.isNumber())
    return jsToNumber(x.str()) == y.n;
  if (isObj(x)) {
    if (x.t == VT::Function)
      return false;
    return looseEq(mkStr(rawStr(x)), y);
  }
  if (isObj(y)) {
    if (y.t == VT::Function)
      return false;
    return looseEq(x, mkStr(rawStr(y)));
  }
  return false;
}

int compareValues(const Value &a, const Value &b, bool caseSensitive) {
  if (a.t == VT::Null && b.t == VT::Null)
    return 0;
  if (a.t == VT::Null || b.t == VT::Null)
    throw JsError(std::string("Cannot compare ") + typeName(a) + " with " + typeName(b));
  if (a.t == VT::Undefined && b.t == VT::Undefined)
    return 0;
  if (a.t == VT::Undefined || b.t == VT::Undefined)
    throw JsError(std::string("Cannot compare ") + typeName(a) + " with " + typeName(b));
  auto numLike = [](const Value &v) { return v.isNumber() || v.t == VT::Bool; };
  auto num = [](const Value &v) { return v.t == VT::Bool ? (v.b ? 1.0 : 0.0) : v.n; };
  if (numLike(a) && numLike(b)) {
    double x = num(a), y = num(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.t != b.t)
    throw JsError(std::string("Cannot compare different types: ") + typeName(a) + " and " + typeName(b));
  if (a.t == VT::String) {
    std::string x = a.str(), y = b.str();
    if (!caseSensitive) {
      x = jsCase(x, false);
      y = jsCase(y, false);
    }
    // UTF-16 code unit order.
    auto ux = toUtf16(x), uy = toUtf16(y);
    return ux < uy ? -1 : ux > uy ? 1 : 0;
  }
  throw JsError(std::string("Cannot compare type: ") + typeName(a));
}

} // namespace hflow::data::tmpl
