//===- ChatTemplate.cpp - Hugging Face chat-template renderer ---------------===//
//
// A small Jinja2 subset with the semantics of @huggingface/jinja 0.5.x. The
// pipeline: preprocess (the text rewrites that renderer applies before
// lexing, with a map back to source positions) -> tokens -> AST (checked for
// the supported subset) -> tree-walking interpreter over JS-like values.
// See ChatTemplate.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/ChatTemplate.h"

#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwctype>
#include <functional>
#include <locale.h>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace hflow {
namespace data {

namespace {

//===----------------------------------------------------------------------===//
// Unicode helpers. Runtime strings are UTF-8; JavaScript's view of them
// (UTF-16 code units for length and indexing, code points for slicing) is
// computed where it matters.
//===----------------------------------------------------------------------===//

void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one code point at s[i], advancing i. Invalid bytes decode as
// U+FFFD (one byte each).
uint32_t decodeUtf8(const std::string &s, size_t &i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  i += len;
  return cp;
}

std::u32string toU32(const std::string &s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();)
    out += decodeUtf8(s, i);
  return out;
}

std::string toUtf8(const std::u32string &s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s)
    appendUtf8(out, c);
  return out;
}

size_t utf16Length(const std::string &s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();)
    n += decodeUtf8(s, i) >= 0x10000 ? 2 : 1;
  return n;
}

std::vector<uint16_t> toUtf16(const std::string &s) {
  std::vector<uint16_t> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = decodeUtf8(s, i);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out.push_back(static_cast<uint16_t>(0xD800 + (cp >> 10)));
      out.push_back(static_cast<uint16_t>(0xDC00 + (cp & 0x3FF)));
    } else {
      out.push_back(static_cast<uint16_t>(cp));
    }
  }
  return out;
}

// JavaScript's WhiteSpace and LineTerminator (what \s, trim() match).
bool isJsSpace(uint32_t c) {
  switch (c) {
  case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20:
  case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
  case 0x205F: case 0x3000: case 0xFEFF:
    return true;
  default:
    return c >= 0x2000 && c <= 0x200A;
  }
}

std::string trimStart(const std::string &s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!isJsSpace(decodeUtf8(s, j)))
      break;
    i = j;
  }
  return s.substr(i);
}

std::string trimEnd(const std::string &s) {
  // Walk forwards remembering where the last non-space code point ended.
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = decodeUtf8(s, i);
    if (!isJsSpace(cp))
      end = i;
  }
  return s.substr(0, end);
}

std::string trimBoth(const std::string &s) { return trimEnd(trimStart(s)); }

bool isAsciiWord(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

locale_t utf8Locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    if (!l)
      l = newlocale(LC_CTYPE_MASK, "C.utf8", static_cast<locale_t>(0));
    return l;
  }();
  return loc;
}

// A template is code from a downloaded file: parsing and rendering it are
// bounded, so that a hostile one is refused with its limit named instead of
// overflowing the stack, growing until the kernel kills the process, or
// running forever (docs/data.md, "Chat templates").
/// The deepest a template's syntax tree may be.
constexpr int kMaxTemplateDepth = 256;
/// The most statements and expressions one render may evaluate (a real
/// chat template renders a long conversation in well under a million).
constexpr uint64_t kMaxTemplateSteps = 20000000;
/// The longest string a render may make, and its output: 64 MiB.
constexpr size_t kMaxTemplateBytes = size_t(64) << 20;
/// How deep a render may nest evaluations (macros calling macros included).
constexpr int kMaxRenderDepth = 2000;

struct JsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Code points whose JavaScript case mapping is not one-to-one (or depends on
// context); refused rather than mapped differently.
bool hasSpecialUpper(uint32_t c) {
  return c == 0xDF || c == 0x149 || c == 0x1F0 || c == 0x390 || c == 0x3B0 || c == 0x587 ||
         (c >= 0x1E96 && c <= 0x1E9A) || c == 0x1F50 || c == 0x1F52 || c == 0x1F54 ||
         c == 0x1F56 || (c >= 0x1F80 && c <= 0x1FAF) || (c >= 0x1FB2 && c <= 0x1FB4) ||
         c == 0x1FB6 || c == 0x1FB7 || c == 0x1FBC || (c >= 0x1FC2 && c <= 0x1FC4) ||
         c == 0x1FC6 || c == 0x1FC7 || c == 0x1FCC || c == 0x1FD2 || c == 0x1FD3 ||
         c == 0x1FD6 || c == 0x1FD7 || (c >= 0x1FE2 && c <= 0x1FE4) || c == 0x1FE6 ||
         c == 0x1FE7 || (c >= 0x1FF2 && c <= 0x1FF4) || c == 0x1FF6 || c == 0x1FF7 ||
         c == 0x1FFC || (c >= 0xFB00 && c <= 0xFB06) || (c >= 0xFB13 && c <= 0xFB17);
}

uint32_t mapCase(uint32_t c, bool upper) {
  if (c < 0x80) {
    if (upper && c >= 'a' && c <= 'z')
      return c - 32;
    if (!upper && c >= 'A' && c <= 'Z')
      return c + 32;
    return c;
  }
  if (upper ? hasSpecialUpper(c) : (c == 0x130 || c == 0x3A3)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s() of U+%04X is not supported", upper ? "upper" : "lower",
                  static_cast<unsigned>(c));
    throw JsError(buf);
  }
  locale_t loc = utf8Locale();
  if (!loc)
    throw JsError("case mapping of non-ASCII text needs the C.UTF-8 locale");
  return static_cast<uint32_t>(upper ? towupper_l(static_cast<wint_t>(c), loc)
                                     : towlower_l(static_cast<wint_t>(c), loc));
}

std::string jsCase(const std::string &s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();)
    appendUtf8(out, mapCase(decodeUtf8(s, i), upper));
  return out;
}

//===----------------------------------------------------------------------===//
// Numbers the JavaScript way.
//===----------------------------------------------------------------------===//

std::string jsNumber(double x) {
  if (std::isnan(x))
    return "NaN";
  if (std::isinf(x))
    return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0)
    return "0";
  std::string sign = x < 0 ? "-" : "";
  double ax = std::fabs(x);
  char buf[64];
  int p = 1;
  for (; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, ax);
    if (std::strtod(buf, nullptr) == ax)
      break;
  }
  // buf: d[.ddd]e[+-]XX
  std::string digits;
  const char *q = buf;
  for (; *q && *q != 'e'; ++q)
    if (*q >= '0' && *q <= '9')
      digits += *q;
  int e = std::atoi(q + 1);
  while (digits.size() > 1 && digits.back() == '0')
    digits.pop_back();
  int k = static_cast<int>(digits.size());
  int n = e + 1;
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(-n, '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1)
      out += "." + digits.substr(1);
    out += "e";
    out += (n - 1 >= 0) ? "+" : "-";
    out += std::to_string(std::abs(n - 1));
  }
  return sign + out;
}

// FloatValue.toString(): integral floats keep one decimal ("2.0").
std::string jsFloatString(double x) {
  if (x == 0 && std::signbit(x))
    return "-0.0";
  if (std::isfinite(x) && std::fmod(x, 1.0) == 0) {
    if (std::fabs(x) >= 1e21)
      return jsNumber(x);
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.1f", x);
    return buf;
  }
  return jsNumber(x);
}

// Number(string) (for loose equality).
double jsToNumber(const std::string &s0) {
  std::string s = trimBoth(s0);
  if (s.empty())
    return 0;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X' || s[1] == 'o' || s[1] == 'O' ||
                                      s[1] == 'b' || s[1] == 'B')) {
    int base = (s[1] == 'x' || s[1] == 'X') ? 16 : (s[1] == 'o' || s[1] == 'O') ? 8 : 2;
    double v = 0;
    for (size_t i = 2; i < s.size(); ++i) {
      int d;
      char c = s[i];
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        return NAN;
      if (d >= base)
        return NAN;
      v = v * base + d;
    }
    return v;
  }
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-')
    ++i;
  if (s.compare(i, std::string::npos, "Infinity") == 0)
    return s[0] == '-' ? -INFINITY : INFINITY;
  // Only a StrDecimalLiteral: digits, optional fraction, optional exponent.
  size_t j = i;
  bool any = false;
  while (j < s.size() && isdigit(static_cast<unsigned char>(s[j])))
    ++j, any = true;
  if (j < s.size() && s[j] == '.') {
    ++j;
    while (j < s.size() && isdigit(static_cast<unsigned char>(s[j])))
      ++j, any = true;
  }
  if (!any)
    return NAN;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    ++j;
    if (j < s.size() && (s[j] == '+' || s[j] == '-'))
      ++j;
    size_t d = j;
    while (j < s.size() && isdigit(static_cast<unsigned char>(s[j])))
      ++j;
    if (j == d)
      return NAN;
  }
  if (j != s.size())
    return NAN;
  return std::strtod(s.c_str(), nullptr);
}

// parseInt(s, 10)
double jsParseInt(const std::string &s0) {
  std::string s = trimStart(s0);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    neg = s[i++] == '-';
  size_t d = i;
  while (i < s.size() && isdigit(static_cast<unsigned char>(s[i])))
    ++i;
  if (i == d)
    return NAN;
  double v = std::strtod(s.substr(d, i - d).c_str(), nullptr);
  return neg ? -v : v;
}

// parseFloat(s)
double jsParseFloat(const std::string &s0) {
  std::string s = trimStart(s0);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    ++i;
  if (s.compare(i, 8, "Infinity") == 0)
    return s[0] == '-' ? -INFINITY : INFINITY;
  size_t j = i;
  bool any = false;
  while (j < s.size() && isdigit(static_cast<unsigned char>(s[j])))
    ++j, any = true;
  if (j < s.size() && s[j] == '.') {
    size_t k = j + 1;
    bool frac = false;
    while (k < s.size() && isdigit(static_cast<unsigned char>(s[k])))
      ++k, frac = true;
    if (any || frac) {
      j = k;
      any = true;
    }
  }
  if (!any)
    return NAN;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    size_t k = j + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-'))
      ++k;
    size_t d = k;
    while (k < s.size() && isdigit(static_cast<unsigned char>(s[k])))
      ++k;
    if (k > d)
      j = k;
  }
  return std::strtod(s.substr(0, j).c_str(), nullptr);
}

bool isIntegral(double x) { return std::isfinite(x) && std::floor(x) == x; }

//===----------------------------------------------------------------------===//
// Values: the runtime values of @huggingface/jinja. Arrays and objects are
// shared (compared by identity, like the JavaScript objects behind them).
//===----------------------------------------------------------------------===//

enum class VT { Undefined, Null, Bool, Int, Float, String, Array, Tuple, Object, KwArgs, Namespace, Function };

struct Value;
struct ObjData;
struct FuncData;
using Array = std::vector<Value>;

struct Value {
  VT t = VT::Undefined;
  bool b = false;
  double n = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const Array> a;
  std::shared_ptr<ObjData> o;
  std::shared_ptr<const FuncData> f;

  const std::string &str() const { return *s; }
  bool isArray() const { return t == VT::Array || t == VT::Tuple; }
  bool isObject() const { return t == VT::Object || t == VT::KwArgs; }
  bool isAttrContainer() const { return isObject() || t == VT::Namespace; }
  bool isNumber() const { return t == VT::Int || t == VT::Float; }
};

struct ObjData {
  std::vector<std::pair<std::string, Value>> items;
  const Value *find(const std::string &k) const {
    for (auto &kv : items)
      if (kv.first == k)
        return &kv.second;
    return nullptr;
  }
  void set(const std::string &k, Value v) {
    for (auto &kv : items)
      if (kv.first == k) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(k, std::move(v));
  }
};

struct Node;

struct FuncData {
  enum Kind { Global, Method, Macro } kind;
  std::string name;
  Value receiver;
  const Node *macro = nullptr;
};

Value mkUndef() { return Value(); }
Value mkNull() {
  Value v;
  v.t = VT::Null;
  return v;
}
Value mkBool(bool b) {
  Value v;
  v.t = VT::Bool;
  v.b = b;
  return v;
}
Value mkInt(double n) {
  Value v;
  v.t = VT::Int;
  v.n = n;
  return v;
}
Value mkFloat(double n) {
  Value v;
  v.t = VT::Float;
  v.n = n;
  return v;
}
Value mkStr(std::string s) {
  if (s.size() > kMaxTemplateBytes)
    throw JsError("a string grew to " + std::to_string(s.size()) + " bytes, more than the " +
                  std::to_string(kMaxTemplateBytes >> 20) + " MiB a template may make (the limit)");
  Value v;
  v.t = VT::String;
  v.s = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value mkArr(Array a, VT t = VT::Array) {
  Value v;
  v.t = t;
  v.a = std::make_shared<const Array>(std::move(a));
  return v;
}
Value mkObj(std::shared_ptr<ObjData> o, VT t = VT::Object) {
  Value v;
  v.t = t;
  v.o = std::move(o);
  return v;
}
Value mkFunc(FuncData::Kind kind, std::string name, Value receiver = Value(), const Node *macro = nullptr) {
  auto f = std::make_shared<FuncData>();
  f->kind = kind;
  f->name = std::move(name);
  f->receiver = std::move(receiver);
  f->macro = macro;
  Value v;
  v.t = VT::Function;
  v.f = std::move(f);
  return v;
}
// A JavaScript number converted as convertToRuntimeValues does.
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

// Integer-like keys first in ascending order, then the others in insertion
// order: the property order of a JavaScript object.
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

// JSON.stringify of a string.
std::string jsonQuote(const std::string &s, bool ensureAscii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t c = decodeUtf8(s, i);
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

struct JsonOpts {
  int indent = 0; // 0: none
  bool ensureAscii = false;
  bool hasSeparators = false;
  std::string itemSep, keySep;
};

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

// RuntimeValue.toString(): how a value renders in {{ }}.
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

// String(x) of the JavaScript value behind a runtime value (`+`, `~`,
// join): numbers print without ".0", arrays join their elements' toString()
// with ",", objects are "[object Map]", null and undefined are "" in join.
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

// The JavaScript `===` of the values behind two runtime values (none and
// undefined both hold JavaScript undefined).
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

// The JavaScript `==` of the values behind two runtime values.
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

// compareRuntimeValues (sort, dictsort).
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

//===----------------------------------------------------------------------===//
// Preprocessing and lexing.
//===----------------------------------------------------------------------===//

// Text with, for each character, its index in the original source.
struct MappedText {
  std::u32string s;
  std::vector<uint32_t> pos;
  void push(char32_t c, uint32_t p) {
    s += c;
    pos.push_back(p);
  }
};

bool isLineTerminator(char32_t c) { return c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029; }

MappedText preprocess(const std::u32string &src) {
  MappedText a;
  size_t n = src.size();
  if (n && src[n - 1] == '\n')
    --n;
  // lstrip_blocks: blanks at a line start before {%, {# or {-.
  for (size_t i = 0; i < n;) {
    if (i == 0 || isLineTerminator(src[i - 1])) {
      size_t j = i;
      while (j < n && (src[j] == ' ' || src[j] == '\t'))
        ++j;
      if (j + 1 < n && src[j] == '{' && (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
        i = j;
        a.push(src[i], static_cast<uint32_t>(i));
        ++i;
        continue;
      }
    }
    a.push(src[i], static_cast<uint32_t>(i));
    ++i;
  }
  // trim_blocks: the newline after %}, #} or -}.
  MappedText b;
  for (size_t i = 0; i < a.s.size();) {
    if (i + 2 < a.s.size() && (a.s[i] == '#' || a.s[i] == '%' || a.s[i] == '-') && a.s[i + 1] == '}' &&
        a.s[i + 2] == '\n') {
      b.push(a.s[i], a.pos[i]);
      b.push(a.s[i + 1], a.pos[i + 1]);
      i += 3;
      continue;
    }
    b.push(a.s[i], a.pos[i]);
    ++i;
  }
  // {% generation %} / {% endgeneration %} are dropped, with the blanks
  // around them when the tag has "-" on that side.
  MappedText c;
  const std::u32string &t = b.s;
  size_t floor = 0; // where the last match ended
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '{' && i + 1 < t.size() && t[i + 1] == '%') {
      size_t j = i + 2;
      bool lstrip = false, rstrip = false;
      if (j < t.size() && t[j] == '-')
        lstrip = true, ++j;
      while (j < t.size() && isJsSpace(t[j]))
        ++j;
      static const std::u32string kEnd = U"end", kGen = U"generation";
      if (t.compare(j, 3, kEnd) == 0)
        j += 3;
      if (t.compare(j, kGen.size(), kGen) == 0) {
        j += kGen.size();
        while (j < t.size() && isJsSpace(t[j]))
          ++j;
        if (j < t.size() && t[j] == '-')
          rstrip = true, ++j;
        if (j + 1 < t.size() && t[j] == '%' && t[j + 1] == '}') {
          j += 2;
          if (lstrip) {
            size_t k = c.s.size();
            // Drop the blanks just before (not before the previous match).
            size_t keep = i;
            while (keep > floor && isJsSpace(t[keep - 1]))
              --keep;
            size_t drop = i - keep;
            c.s.resize(k - drop);
            c.pos.resize(k - drop);
          }
          size_t after = j;
          while (after < t.size() && isJsSpace(t[after]))
            ++after;
          if (!rstrip)
            for (size_t k = j; k < after; ++k)
              c.push(t[k], b.pos[k]);
          i = after;
          floor = after;
          continue;
        }
      }
    }
    c.push(t[i], b.pos[i]);
    ++i;
  }
  return c;
}

enum class TT {
  Text, Numeric, String, Ident, Equals, OpenParen, CloseParen, OpenStmt, CloseStmt, OpenExpr, CloseExpr,
  OpenSquare, CloseSquare, OpenCurly, CloseCurly, Comma, Dot, Colon, Pipe, Additive, Multiplicative,
  Power, Comparison, Unary, Comment, End
};

const char *ttName(TT t) {
  switch (t) {
  case TT::Text: return "text";
  case TT::Numeric: return "number";
  case TT::String: return "string";
  case TT::Ident: return "identifier";
  case TT::Equals: return "'='";
  case TT::OpenParen: return "'('";
  case TT::CloseParen: return "')'";
  case TT::OpenStmt: return "'{%'";
  case TT::CloseStmt: return "'%}'";
  case TT::OpenExpr: return "'{{'";
  case TT::CloseExpr: return "'}}'";
  case TT::OpenSquare: return "'['";
  case TT::CloseSquare: return "']'";
  case TT::OpenCurly: return "'{'";
  case TT::CloseCurly: return "'}'";
  case TT::Comma: return "','";
  case TT::Dot: return "'.'";
  case TT::Colon: return "':'";
  case TT::Pipe: return "'|'";
  case TT::Additive: return "operator";
  case TT::Multiplicative: return "operator";
  case TT::Power: return "'**'";
  case TT::Comparison: return "comparison";
  case TT::Unary: return "unary operator";
  case TT::Comment: return "comment";
  case TT::End: return "end of template";
  }
  return "?";
}

struct Token {
  TT type;
  std::string value; // UTF-8
  uint32_t pos;      // index (in characters) in the original source
};

struct Located : std::runtime_error {
  uint32_t pos;
  Located(uint32_t p, const std::string &m) : std::runtime_error(m), pos(p) {}
};

std::vector<Token> tokenize(const MappedText &m, uint32_t endPos) {
  const std::u32string &s = m.s;
  const size_t n = s.size();
  std::vector<Token> toks;
  size_t cur = 0;
  int curlyDepth = 0;
  auto posAt = [&](size_t i) { return i < n ? m.pos[i] : endPos; };
  auto fail = [&](size_t i, const std::string &msg) { throw Located(posAt(i), msg); };
  auto at = [&](size_t i) -> char32_t { return i < n ? s[i] : 0; };
  auto startsWith = [&](size_t i, const char *lit) {
    for (size_t k = 0; lit[k]; ++k)
      if (at(i + k) != static_cast<char32_t>(lit[k]))
        return false;
    return true;
  };
  auto push = [&](TT t, std::string v, size_t i) { toks.push_back(Token{t, std::move(v), posAt(i)}); };
  auto stripTrailing = [&] {
    if (!toks.empty() && toks.back().type == TT::Text) {
      toks.back().value = trimEnd(toks.back().value);
      if (toks.back().value.empty())
        toks.pop_back();
    }
  };
  auto skipSpace = [&] {
    while (cur < n && isJsSpace(s[cur]))
      ++cur;
  };
  auto isDigit = [](char32_t c) { return c >= '0' && c <= '9'; };
  auto digits = [&] {
    std::string d;
    while (cur < n && isDigit(s[cur]))
      d += static_cast<char>(s[cur++]);
    return d;
  };
  static const std::pair<const char *, TT> table[] = {
      {"{%", TT::OpenStmt}, {"%}", TT::CloseStmt}, {"{{", TT::OpenExpr}, {"}}", TT::CloseExpr},
      {"(", TT::OpenParen}, {")", TT::CloseParen}, {"{", TT::OpenCurly}, {"}", TT::CloseCurly},
      {"[", TT::OpenSquare}, {"]", TT::CloseSquare}, {",", TT::Comma}, {".", TT::Dot},
      {":", TT::Colon}, {"|", TT::Pipe}, {"<=", TT::Comparison}, {">=", TT::Comparison},
      {"==", TT::Comparison}, {"!=", TT::Comparison}, {"<", TT::Comparison}, {">", TT::Comparison},
      {"+", TT::Additive}, {"-", TT::Additive}, {"~", TT::Additive}, {"**", TT::Power},
      {"*", TT::Multiplicative}, {"//", TT::Multiplicative}, {"/", TT::Multiplicative},
      {"%", TT::Multiplicative}, {"=", TT::Equals}};

  while (cur < n) {
    TT last = toks.empty() ? TT::End : toks.back().type;
    if (toks.empty() || last == TT::CloseStmt || last == TT::CloseExpr || last == TT::Comment) {
      size_t start = cur;
      std::u32string text;
      while (cur < n && !(s[cur] == '{' && (at(cur + 1) == '%' || at(cur + 1) == '{' || at(cur + 1) == '#')))
        text += s[cur++];
      if (!text.empty()) {
        push(TT::Text, toUtf8(text), start);
        continue;
      }
    }
    if (s[cur] == '{' && at(cur + 1) == '#') {
      size_t start = cur;
      cur += 2;
      bool stripBefore = at(cur) == '-';
      if (stripBefore)
        ++cur;
      std::u32string comment;
      while (!(at(cur) == '#' && at(cur + 1) == '}')) {
        if (cur + 2 >= n)
          fail(start, "missing end of comment tag '#}'");
        comment += s[cur++];
      }
      bool stripAfter = !comment.empty() && comment.back() == '-';
      if (stripAfter)
        comment.pop_back();
      if (stripBefore)
        stripTrailing();
      push(TT::Comment, toUtf8(comment), start);
      cur += 2;
      if (stripAfter)
        skipSpace();
      continue;
    }
    if (startsWith(cur, "{%-")) {
      stripTrailing();
      push(TT::OpenStmt, "{%", cur);
      cur += 3;
      continue;
    }
    if (startsWith(cur, "{{-")) {
      stripTrailing();
      push(TT::OpenExpr, "{{", cur);
      curlyDepth = 0;
      cur += 3;
      continue;
    }
    skipSpace();
    if (cur >= n)
      fail(cur, "unexpected end of template inside a tag");
    if (startsWith(cur, "-%}")) {
      push(TT::CloseStmt, "%}", cur);
      cur += 3;
      skipSpace();
      continue;
    }
    if (startsWith(cur, "-}}")) {
      push(TT::CloseExpr, "}}", cur);
      cur += 3;
      skipSpace();
      continue;
    }
    char32_t ch = s[cur];
    if (ch == '-' || ch == '+') {
      TT lt = toks.empty() ? TT::End : toks.back().type;
      if (toks.empty() || lt == TT::Text)
        fail(cur, std::string("unexpected character '") + static_cast<char>(ch) + "'");
      if (!(lt == TT::Ident || lt == TT::Numeric || lt == TT::String || lt == TT::CloseParen ||
            lt == TT::CloseSquare)) {
        size_t start = cur;
        ++cur;
        std::string num = digits();
        if (!num.empty() && at(cur) == '.' && isDigit(at(cur + 1))) {
          ++cur;
          num += "." + digits();
        }
        push(num.empty() ? TT::Unary : TT::Numeric, std::string(1, static_cast<char>(ch)) + num, start);
        continue;
      }
    }
    bool matched = false;
    for (auto &entry : table) {
      if (entry.second == TT::CloseExpr && curlyDepth > 0)
        continue;
      if (startsWith(cur, entry.first)) {
        push(entry.second, entry.first, cur);
        if (entry.second == TT::OpenExpr)
          curlyDepth = 0;
        else if (entry.second == TT::OpenCurly)
          ++curlyDepth;
        else if (entry.second == TT::CloseCurly)
          --curlyDepth;
        cur += std::strlen(entry.first);
        matched = true;
        break;
      }
    }
    if (matched)
      continue;
    if (ch == '\'' || ch == '"') {
      size_t start = cur;
      ++cur;
      std::string str;
      while (true) {
        if (cur >= n)
          fail(start, "unterminated string literal");
        char32_t c = s[cur];
        if (c == ch)
          break;
        if (c == '\\') {
          ++cur;
          if (cur >= n)
            fail(start, "unterminated string literal");
          char32_t e = s[cur++];
          if (e == 'x' || e == 'u') {
            size_t len = e == 'x' ? 2 : 4;
            uint32_t v = 0;
            for (size_t k = 0; k < len; ++k) {
              char32_t h = at(cur + k);
              int d = (h >= '0' && h <= '9')   ? int(h - '0')
                      : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                      : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                               : -1;
              if (d < 0)
                fail(cur - 2, "invalid hexadecimal escape sequence");
              v = v * 16 + static_cast<uint32_t>(d);
            }
            cur += len;
            // A UTF-16 surrogate pair written as two \u escapes.
            if (v >= 0xD800 && v <= 0xDBFF && at(cur) == '\\' && at(cur + 1) == 'u') {
              uint32_t lo = 0;
              bool ok = true;
              for (size_t k = 0; k < 4; ++k) {
                char32_t h = at(cur + 2 + k);
                int d = (h >= '0' && h <= '9')   ? int(h - '0')
                        : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                        : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10)
                                                 : -1;
                if (d < 0)
                  ok = false;
                else
                  lo = lo * 16 + static_cast<uint32_t>(d);
              }
              if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                cur += 6;
              }
            }
            appendUtf8(str, v);
            continue;
          }
          switch (e) {
          case 'n': str += '\n'; break;
          case 't': str += '\t'; break;
          case 'r': str += '\r'; break;
          case 'b': str += '\b'; break;
          case 'f': str += '\f'; break;
          case 'v': str += '\v'; break;
          case '\'': str += '\''; break;
          case '"': str += '"'; break;
          case '\\': str += '\\'; break;
          default: {
            std::string ec;
            appendUtf8(ec, e);
            fail(cur - 2, "unexpected escaped character '" + ec + "'");
          }
          }
          continue;
        }
        appendUtf8(str, c);
        ++cur;
      }
      push(TT::String, str, start);
      ++cur;
      continue;
    }
    if (isDigit(ch)) {
      size_t start = cur;
      std::string num = digits();
      if ((toks.empty() || toks.back().type != TT::Dot) && at(cur) == '.' && isDigit(at(cur + 1))) {
        ++cur;
        num += "." + digits();
      }
      push(TT::Numeric, num, start);
      continue;
    }
    if (isAsciiWord(ch)) {
      size_t start = cur;
      std::string w;
      while (cur < n && isAsciiWord(s[cur]))
        w += static_cast<char>(s[cur++]);
      push(TT::Ident, w, start);
      continue;
    }
    std::string cs;
    appendUtf8(cs, ch);
    fail(cur, "unexpected character '" + cs + "'");
  }
  return toks;
}

//===----------------------------------------------------------------------===//
// AST.
//===----------------------------------------------------------------------===//

enum class NK {
  // statements
  Text, Output, If, For, Set, Macro, Break, Continue, FilterBlock,
  // expressions
  IntLit, FloatLit, StrLit, Ident, ArrayLit, TupleLit, ObjectLit, Member, Slice, Call, Binary,
  Unary, Filter, Test, Select, Ternary, Kwarg
};

using NodeP = std::unique_ptr<Node>;

struct Node {
  NK k;
  uint32_t pos = 0;
  std::string s;
  double n = 0;
  bool flag = false;
  std::vector<NodeP> a, b, c;
  NodeP x, y, z;
  Node(NK kind, uint32_t p) : k(kind), pos(p) {}
};

NodeP node(NK k, uint32_t p) { return NodeP(new Node(k, p)); }

const std::set<std::string> kTests = {"boolean", "callable", "odd", "even", "false", "true", "none",
                                      "string", "number", "integer", "iterable", "mapping",
                                      "sequence", "lower", "upper", "defined", "undefined",
                                      "equalto", "eq"};
// Filters @huggingface/jinja applies without arguments (for some types).
const std::set<std::string> kPlainFilters = {
    "safe", "tojson", "list", "first", "last", "length", "reverse", "sort", "join", "string",
    "unique", "upper", "lower", "title", "capitalize", "trim", "indent", "int", "float",
    "abs", "items", "get", "keys", "values", "dictsort", "bool"};
// ... and with an argument list.
const std::set<std::string> kCallFilters = {
    "tojson", "join", "int", "float", "default", "sort", "selectattr", "rejectattr", "map",
    "indent", "replace", "get", "items", "keys", "values", "dictsort"};
const std::set<std::string> kMethods = {"upper", "lower", "strip", "title", "capitalize",
                                        "rstrip", "lstrip", "startswith", "endswith", "split",
                                        "replace", "get", "items", "keys", "values", "dictsort"};
const std::set<std::string> kGlobalFunctions = {"namespace", "raise_exception", "range",
                                                "strftime_now"};

class Parser {
public:
  explicit Parser(std::vector<Token> toks, uint32_t endPos) : t_(std::move(toks)), endPos_(endPos) {}

  std::vector<NodeP> parseProgram() {
    std::vector<NodeP> body;
    while (i_ < t_.size())
      body.push_back(parseAny());
    return body;
  }

  std::set<std::string> macroNames;
  std::vector<const Node *> calledNames; // Call nodes with an identifier callee

private:
  std::vector<Token> t_;
  size_t i_ = 0;
  uint32_t endPos_;
  int forDepth_ = 0;
  int depth_ = 0; ///< how deep the node being parsed will sit in the tree

  /// Bounds the tree's depth (kMaxTemplateDepth): every recursion and every
  /// link of a left-deep chain (a + b + c, a.b.c, x|f|g) goes one deeper,
  /// so neither the parser, nor the interpreter, nor the tree's destruction
  /// can overflow the stack on a hostile template.
  struct Deeper {
    Parser &p;
    int n = 0;
    explicit Deeper(Parser &parser, int initial = 1) : p(parser) {
      for (int k = 0; k < initial; ++k)
        more();
    }
    void more() {
      ++n;
      if (++p.depth_ > kMaxTemplateDepth)
        p.fail("the template nests deeper than " + std::to_string(kMaxTemplateDepth) +
               " levels (statements, expressions and chains of operators; the limit)");
    }
    ~Deeper() { p.depth_ -= n; }
    Deeper(const Deeper &) = delete;
    Deeper &operator=(const Deeper &) = delete;
  };

  const Token *peek(size_t k = 0) const { return i_ + k < t_.size() ? &t_[i_ + k] : nullptr; }
  uint32_t here() const { return i_ < t_.size() ? t_[i_].pos : endPos_; }
  [[noreturn]] void fail(const std::string &msg) const { throw Located(here(), msg); }
  [[noreturn]] void failAt(uint32_t p, const std::string &msg) const { throw Located(p, msg); }
  bool is(TT t) const { return i_ < t_.size() && t_[i_].type == t; }
  bool isIdent(const char *name, size_t k = 0) const {
    const Token *tk = peek(k);
    return tk && tk->type == TT::Ident && tk->value == name;
  }
  bool isStatement(std::initializer_list<const char *> names) const {
    const Token *a = peek(0), *b = peek(1);
    if (!a || a->type != TT::OpenStmt || !b || b->type != TT::Ident)
      return false;
    for (const char *nm : names)
      if (b->value == nm)
        return true;
    return false;
  }
  std::string found() const {
    if (i_ >= t_.size())
      return "end of template";
    const Token &tk = t_[i_];
    if (tk.type == TT::Ident || tk.type == TT::Additive || tk.type == TT::Multiplicative ||
        tk.type == TT::Comparison || tk.type == TT::Unary || tk.type == TT::Numeric)
      return "'" + tk.value + "'";
    if (tk.type == TT::String)
      return "string literal";
    return ttName(tk.type);
  }
  const Token &expect(TT type, const char *what) {
    if (!is(type))
      fail(std::string("expected ") + what + ", found " + found());
    return t_[i_++];
  }
  void expectIdent(const char *name) {
    if (!isIdent(name))
      fail(std::string("expected '") + name + "', found " + found());
    ++i_;
  }
  // Parses statements until one of `names` opens; fails at the end.
  void parseUntil(std::vector<NodeP> &out, std::initializer_list<const char *> names, uint32_t openPos,
                  const char *what) {
    while (!isStatement(names)) {
      if (i_ >= t_.size())
        failAt(openPos, std::string("unclosed '") + what + "' block (reached the end of the template)");
      out.push_back(parseAny());
    }
  }

  /// "{% NAME %}": the tag that closes a block.
  void expectEnd(const char *name) {
    expect(TT::OpenStmt, "'{%'");
    expectIdent(name);
    expect(TT::CloseStmt, "'%}'");
  }

  NodeP parseAny() {
    const Token &tk = t_[i_];
    switch (tk.type) {
    case TT::Comment:
      ++i_;
      return nullptr;
    case TT::Text: {
      NodeP nd = node(NK::Text, tk.pos);
      nd->s = tk.value;
      ++i_;
      return nd;
    }
    case TT::OpenStmt:
      return parseStatement();
    case TT::OpenExpr: {
      uint32_t p = tk.pos;
      ++i_;
      NodeP nd = node(NK::Output, p);
      nd->x = parseExpression();
      expect(TT::CloseExpr, "'}}'");
      return nd;
    }
    default:
      fail("unexpected " + found());
    }
  }

  NodeP parseStatement() {
    Deeper deeper(*this);
    uint32_t openPos = t_[i_].pos;
    ++i_;
    if (!is(TT::Ident))
      fail("expected a statement name after '{%', found " + found());
    std::string name = t_[i_].value;
    uint32_t namePos = t_[i_].pos;
    if (name == "set") {
      ++i_;
      return parseSet(openPos);
    }
    if (name == "if") {
      ++i_;
      NodeP nd = parseIf(openPos);
      expectEnd("endif");
      return nd;
    }
    if (name == "for") {
      ++i_;
      NodeP nd = parseFor(openPos);
      expectEnd("endfor");
      return nd;
    }
    if (name == "macro") {
      ++i_;
      NodeP nd = parseMacro(openPos);
      expectEnd("endmacro");
      return nd;
    }
    if (name == "break" || name == "continue") {
      if (forDepth_ == 0)
        failAt(namePos, "'" + name + "' outside a for loop");
      ++i_;
      expect(TT::CloseStmt, "'%}'");
      return node(name == "break" ? NK::Break : NK::Continue, namePos);
    }
    if (name == "filter") {
      ++i_;
      NodeP f = parseFilterCall(nullptr);
      expect(TT::CloseStmt, "'%}'");
      NodeP nd = node(NK::FilterBlock, openPos);
      nd->x = std::move(f);
      parseUntil(nd->a, {"endfilter"}, openPos, "filter");
      expectEnd("endfilter");
      return nd;
    }
    if (name == "call")
      failAt(namePos, "unsupported statement '{% call %}'");
    if (name == "else" || name == "elif" || name.compare(0, 3, "end") == 0)
      failAt(openPos, "unexpected '{% " + name + " %}' (no open block it belongs to)");
    failAt(namePos, "unsupported statement '" + name + "'");
  }

  NodeP parseSet(uint32_t openPos) {
    uint32_t targetPos = here();
    NodeP target = parseExpressionSequence(false);
    auto checkIdent = [&](const Node &nd) {
      if (nd.k != NK::Ident)
        failAt(nd.pos, "unsupported assignment target (expected a name)");
    };
    if (target->k == NK::TupleLit) {
      for (auto &e : target->a)
        checkIdent(*e);
    } else if (target->k == NK::Member) {
      if (target->flag)
        failAt(targetPos, "unsupported assignment target (only name.attribute)");
    } else {
      checkIdent(*target);
    }
    NodeP nd = node(NK::Set, openPos);
    nd->x = std::move(target);
    if (is(TT::Equals)) {
      ++i_;
      nd->y = parseExpressionSequence(false);
    } else {
      expect(TT::CloseStmt, "'=' or '%}'");
      parseUntil(nd->a, {"endset"}, openPos, "set");
      expect(TT::OpenStmt, "'{%'");
      expectIdent("endset");
    }
    expect(TT::CloseStmt, "'%}'");
    return nd;
  }

  NodeP parseIf(uint32_t openPos) {
    NodeP nd = node(NK::If, openPos);
    nd->x = parseExpression();
    expect(TT::CloseStmt, "'%}'");
    parseUntil(nd->a, {"elif", "else", "endif"}, openPos, "if");
    if (isStatement({"elif"})) {
      uint32_t p = t_[i_].pos;
      i_ += 2;
      nd->b.push_back(parseIf(p));
    } else if (isStatement({"else"})) {
      i_ += 2;
      expect(TT::CloseStmt, "'%}'");
      parseUntil(nd->b, {"endif"}, openPos, "if");
    }
    return nd;
  }

  NodeP parseFor(uint32_t openPos) {
    NodeP nd = node(NK::For, openPos);
    NodeP var = parseExpressionSequence(true);
    if (var->k == NK::Ident) {
      nd->a.push_back(std::move(var));
    } else if (var->k == NK::TupleLit) {
      for (auto &e : var->a) {
        if (e->k != NK::Ident)
          failAt(e->pos, "expected a name in the loop variables");
        nd->a.push_back(std::move(e));
      }
      nd->flag = true;
    } else {
      failAt(var->pos, "expected a name or names for the loop variable");
    }
    if (!isIdent("in"))
      fail("expected 'in' after the loop variable, found " + found());
    ++i_;
    NodeP iter = parseExpression();
    if (iter->k == NK::Select) {
      nd->x = std::move(iter->x);
      nd->y = std::move(iter->y);
    } else {
      nd->x = std::move(iter);
    }
    expect(TT::CloseStmt, "'%}'");
    ++forDepth_;
    parseUntil(nd->b, {"endfor", "else"}, openPos, "for");
    --forDepth_;
    if (isStatement({"else"})) {
      i_ += 2;
      expect(TT::CloseStmt, "'%}'");
      parseUntil(nd->c, {"endfor"}, openPos, "for");
    }
    return nd;
  }

  static bool mentions(const Node *nd, const std::set<std::string> &names) {
    if (!nd)
      return false;
    if (nd->k == NK::Ident && names.count(nd->s))
      return true;
    for (auto *v : {&nd->a, &nd->b, &nd->c})
      for (auto &ch : *v)
        if (mentions(ch.get(), names))
          return true;
    return mentions(nd->x.get(), names) || mentions(nd->y.get(), names) || mentions(nd->z.get(), names);
  }

  NodeP parseMacro(uint32_t openPos) {
    if (!is(TT::Ident))
      fail("expected the macro name, found " + found());
    NodeP nd = node(NK::Macro, openPos);
    nd->s = t_[i_++].value;
    expect(TT::OpenParen, "'('");
    std::set<std::string> seen;
    bool sawDefault = false;
    while (!is(TT::CloseParen)) {
      if (!is(TT::Ident))
        fail("expected a parameter name, found " + found());
      uint32_t p = here();
      std::string pname = t_[i_++].value;
      if (!seen.insert(pname).second)
        failAt(p, "duplicate parameter name '" + pname + "'");
      NodeP param;
      if (is(TT::Equals)) {
        ++i_;
        param = node(NK::Kwarg, p);
        param->s = pname;
        param->x = parseExpression();
        sawDefault = true;
      } else {
        if (sawDefault)
          failAt(p, "non-default parameter follows default parameter");
        param = node(NK::Ident, p);
        param->s = pname;
      }
      nd->a.push_back(std::move(param));
      if (is(TT::Comma))
        ++i_;
      else if (!is(TT::CloseParen))
        fail("expected ',' or ')', found " + found());
    }
    ++i_;
    expect(TT::CloseStmt, "'%}'");
    int savedFor = forDepth_;
    forDepth_ = 0;
    parseUntil(nd->b, {"endmacro"}, openPos, "macro");
    forDepth_ = savedFor;
    static const std::set<std::string> special = {"varargs", "kwargs", "caller"};
    for (auto &st : nd->b)
      if (mentions(st.get(), special))
        failAt(openPos, "unsupported in macros: varargs, kwargs and caller");
    for (auto &pa : nd->a)
      if (special.count(pa->s))
        failAt(pa->pos, "unsupported macro parameter '" + pa->s + "'");
    macroNames.insert(nd->s);
    return nd;
  }

  NodeP parseExpressionSequence(bool primary) {
    uint32_t p = here();
    NodeP first = primary ? parsePrimary() : parseExpression();
    if (!is(TT::Comma))
      return first;
    NodeP tup = node(NK::TupleLit, p);
    tup->a.push_back(std::move(first));
    while (is(TT::Comma)) {
      ++i_;
      tup->a.push_back(primary ? parsePrimary() : parseExpression());
    }
    return tup;
  }

  NodeP parseExpression() {
    Deeper deeper(*this);
    uint32_t p = here();
    NodeP a = parseOr();
    if (isIdent("if")) {
      ++i_;
      NodeP test = parseOr();
      if (isIdent("else")) {
        ++i_;
        NodeP f = parseExpression();
        NodeP nd = node(NK::Ternary, p);
        nd->x = std::move(test);
        nd->y = std::move(a);
        nd->z = std::move(f);
        return nd;
      }
      NodeP nd = node(NK::Select, p);
      nd->x = std::move(a);
      nd->y = std::move(test);
      return nd;
    }
    return a;
  }

  NodeP binary(const std::string &op, uint32_t p, NodeP l, NodeP r) {
    NodeP nd = node(NK::Binary, p);
    nd->s = op;
    nd->x = std::move(l);
    nd->y = std::move(r);
    return nd;
  }

  NodeP parseOr() {
    Deeper chain(*this, 0);
    NodeP l = parseAnd();
    while (isIdent("or")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      l = binary("or", p, std::move(l), parseAnd());
    }
    return l;
  }
  NodeP parseAnd() {
    Deeper chain(*this, 0);
    NodeP l = parseNot();
    while (isIdent("and")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      l = binary("and", p, std::move(l), parseNot());
    }
    return l;
  }
  NodeP parseNot() {
    if (isIdent("not")) {
      Deeper deeper(*this);
      uint32_t p = t_[i_++].pos;
      NodeP nd = node(NK::Unary, p);
      nd->s = "not";
      nd->x = parseNot();
      return nd;
    }
    return parseComparison();
  }
  NodeP parseComparison() {
    Deeper chain(*this, 0);
    NodeP l = parseAdditive();
    while (true) {
      std::string op;
      uint32_t p = here();
      if (isIdent("not") && isIdent("in", 1)) {
        op = "not in";
        i_ += 2;
      } else if (isIdent("in")) {
        op = "in";
        ++i_;
      } else if (is(TT::Comparison)) {
        op = t_[i_++].value;
      } else {
        break;
      }
      chain.more();
      l = binary(op, p, std::move(l), parseAdditive());
    }
    return l;
  }
  NodeP parseAdditive() {
    Deeper chain(*this, 0);
    NodeP l = parseMultiplicative();
    while (is(TT::Additive)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary(tk.value, tk.pos, std::move(l), parseMultiplicative());
    }
    return l;
  }
  NodeP parseMultiplicative() {
    Deeper chain(*this, 0);
    NodeP l = parsePower();
    while (is(TT::Multiplicative)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary(tk.value, tk.pos, std::move(l), parsePower());
    }
    return l;
  }
  NodeP parsePower() {
    Deeper chain(*this, 0);
    NodeP l = parseTest();
    while (is(TT::Power)) {
      chain.more();
      const Token &tk = t_[i_++];
      l = binary("**", tk.pos, std::move(l), parseTest());
    }
    return l;
  }
  NodeP parseTest() {
    Deeper chain(*this, 0);
    NodeP operand = parseFilter();
    while (isIdent("is")) {
      chain.more();
      uint32_t p = t_[i_++].pos;
      bool negate = false;
      if (isIdent("not")) {
        negate = true;
        ++i_;
      }
      if (!is(TT::Ident))
        fail("expected a test name after 'is', found " + found());
      const Token &tk = t_[i_++];
      if (!kTests.count(tk.value))
        failAt(tk.pos, "unsupported test '" + tk.value + "'");
      if (is(TT::OpenParen))
        fail("unsupported: arguments to test '" + tk.value + "'");
      NodeP nd = node(NK::Test, p);
      nd->s = tk.value;
      nd->flag = negate;
      nd->x = std::move(operand);
      operand = std::move(nd);
    }
    return operand;
  }
  NodeP parseFilter() {
    Deeper chain(*this, 0);
    NodeP operand = parseUnarySign();
    while (is(TT::Pipe)) {
      chain.more();
      ++i_;
      operand = parseFilterCall(std::move(operand));
    }
    return operand;
  }
  // The filter after '|' (or in {% filter %}), checked for the subset.
  NodeP parseFilterCall(NodeP operand) {
    if (!is(TT::Ident))
      fail("expected a filter name, found " + found());
    const Token &tk = t_[i_++];
    NodeP nd = node(NK::Filter, tk.pos);
    nd->s = tk.value;
    nd->x = std::move(operand);
    if (is(TT::OpenParen)) {
      nd->flag = true;
      parseArgs(nd->a);
      if (!kCallFilters.count(nd->s)) {
        if (kPlainFilters.count(nd->s))
          failAt(tk.pos, "unsupported: filter '" + nd->s + "' with arguments");
        failAt(tk.pos, "unsupported filter '" + nd->s + "'");
      }
      checkFilterArgs(*nd);
    } else if (!kPlainFilters.count(nd->s)) {
      if (kCallFilters.count(nd->s))
        failAt(tk.pos, "unsupported: filter '" + nd->s + "' without an argument list");
      failAt(tk.pos, "unsupported filter '" + nd->s + "'");
    }
    return nd;
  }
  void checkFilterArgs(const Node &f) {
    const std::string &nm = f.s;
    auto kwargNames = [&] {
      std::set<std::string> k;
      for (auto &a : f.a)
        if (a->k == NK::Kwarg)
          k.insert(a->s);
      return k;
    };
    size_t positional = 0;
    for (auto &a : f.a)
      if (a->k != NK::Kwarg)
        ++positional;
    if (nm == "tojson") {
      if (positional)
        failAt(f.pos, "unsupported: positional arguments to 'tojson' (use indent=...)");
      for (auto &k : kwargNames())
        if (k != "indent" && k != "ensure_ascii" && k != "separators")
          failAt(f.pos, "unsupported: tojson(" + k + "=...)");
    } else if (nm == "selectattr" || nm == "rejectattr") {
      if (f.a.empty() || f.a.size() > 3)
        failAt(f.pos, "'" + nm + "' takes 1 to 3 string arguments");
      for (auto &a : f.a)
        if (a->k != NK::StrLit)
          failAt(a->pos, "arguments of '" + nm + "' must be string literals");
      if (f.a.size() >= 2 && !kTests.count(f.a[1]->s))
        failAt(f.a[1]->pos, "unsupported test '" + f.a[1]->s + "'");
    } else if (nm == "map") {
      if (!kwargNames().count("attribute"))
        failAt(f.pos, "unsupported: 'map' without attribute=");
    }
  }
  NodeP parseUnarySign() {
    if (i_ < t_.size() && (t_[i_].type == TT::Unary || t_[i_].type == TT::Additive) &&
        (t_[i_].value == "-" || t_[i_].value == "+")) {
      Deeper deeper(*this);
      const Token &tk = t_[i_++];
      NodeP nd = node(NK::Unary, tk.pos);
      nd->s = tk.value;
      nd->x = parseUnarySign();
      return nd;
    }
    NodeP m = parseMember(parsePrimary());
    if (is(TT::OpenParen))
      return parseCall(std::move(m));
    return m;
  }
  NodeP parseCall(NodeP callee) {
    uint32_t p = here();
    NodeP nd = node(NK::Call, callee->pos);
    (void)p;
    // Known callees only.
    if (callee->k == NK::Member && !callee->flag) {
      const std::string &meth = callee->y->s;
      if (!kMethods.count(meth))
        failAt(callee->y->pos, "unsupported method '" + meth + "'");
    }
    nd->x = std::move(callee);
    parseArgs(nd->a);
    if (nd->x->k == NK::Ident)
      calledNames.push_back(nd.get());
    NodeP e = parseMember(std::move(nd));
    if (is(TT::OpenParen))
      e = parseCall(std::move(e));
    return e;
  }
  void parseArgs(std::vector<NodeP> &out) {
    expect(TT::OpenParen, "'('");
    bool sawKw = false;
    std::set<std::string> kwNames;
    while (!is(TT::CloseParen)) {
      if (is(TT::Power) || (is(TT::Multiplicative) && t_[i_].value == "*"))
        fail("unsupported: argument unpacking");
      uint32_t p = here();
      NodeP arg = parseExpression();
      if (is(TT::Equals)) {
        ++i_;
        if (arg->k != NK::Ident)
          failAt(p, "expected a name for the keyword argument");
        NodeP kw = node(NK::Kwarg, p);
        kw->s = arg->s;
        if (!kwNames.insert(kw->s).second)
          failAt(p, "keyword argument '" + kw->s + "' given twice");
        kw->x = parseExpression();
        arg = std::move(kw);
        sawKw = true;
      } else if (sawKw) {
        failAt(p, "positional argument after keyword argument");
      }
      out.push_back(std::move(arg));
      if (is(TT::Comma))
        ++i_;
      else if (!is(TT::CloseParen))
        fail("expected ',' or ')', found " + found());
    }
    ++i_;
  }
  NodeP parseMember(NodeP object) {
    Deeper chain(*this, 0);
    while (is(TT::Dot) || is(TT::OpenSquare)) {
      chain.more();
      const Token &op = t_[i_++];
      NodeP nd = node(NK::Member, op.pos);
      nd->x = std::move(object);
      if (op.type == TT::OpenSquare) {
        nd->flag = true;
        nd->y = parseSubscript(op.pos);
        expect(TT::CloseSquare, "']'");
      } else {
        if (is(TT::Ident)) {
          nd->y = node(NK::StrLit, t_[i_].pos);
          nd->y->s = t_[i_++].value;
        } else if (is(TT::Numeric) && t_[i_].value.find('.') == std::string::npos &&
                   t_[i_].value[0] != '-' && t_[i_].value[0] != '+') {
          nd->flag = true; // integer after '.': an index
          nd->y = node(NK::IntLit, t_[i_].pos);
          nd->y->n = std::strtod(t_[i_++].value.c_str(), nullptr);
        } else {
          fail("expected a name after '.', found " + found());
        }
      }
      object = std::move(nd);
    }
    return object;
  }
  NodeP parseSubscript(uint32_t p) {
    std::vector<NodeP> parts;
    bool isSlice = false;
    while (!is(TT::CloseSquare)) {
      if (i_ >= t_.size())
        fail("expected ']', found end of template");
      if (is(TT::Colon)) {
        parts.push_back(nullptr);
        ++i_;
        isSlice = true;
      } else {
        parts.push_back(parseExpression());
        if (is(TT::Colon)) {
          ++i_;
          isSlice = true;
        } else if (!is(TT::CloseSquare)) {
          fail("expected ':' or ']', found " + found());
        }
      }
    }
    if (parts.empty())
      failAt(p, "expected an index or slice inside '[]'");
    if (!isSlice) {
      return std::move(parts[0]);
    }
    if (parts.size() > 3)
      failAt(p, "a slice takes at most 3 parts");
    NodeP nd = node(NK::Slice, p);
    parts.resize(3);
    nd->x = std::move(parts[0]);
    nd->y = std::move(parts[1]);
    nd->z = std::move(parts[2]);
    return nd;
  }
  NodeP parsePrimary() {
    if (i_ >= t_.size())
      fail("expected an expression, found end of template");
    const Token &tk = t_[i_++];
    switch (tk.type) {
    case TT::Numeric: {
      bool isFloat = tk.value.find('.') != std::string::npos;
      NodeP nd = node(isFloat ? NK::FloatLit : NK::IntLit, tk.pos);
      nd->n = std::strtod(tk.value.c_str(), nullptr);
      return nd;
    }
    case TT::String: {
      NodeP nd = node(NK::StrLit, tk.pos);
      nd->s = tk.value;
      while (is(TT::String))
        nd->s += t_[i_++].value;
      return nd;
    }
    case TT::Ident: {
      NodeP nd = node(NK::Ident, tk.pos);
      nd->s = tk.value;
      return nd;
    }
    case TT::OpenParen: {
      NodeP e = parseExpressionSequence(false);
      expect(TT::CloseParen, "')'");
      return e;
    }
    case TT::OpenSquare: {
      NodeP nd = node(NK::ArrayLit, tk.pos);
      while (!is(TT::CloseSquare)) {
        nd->a.push_back(parseExpression());
        if (is(TT::Comma))
          ++i_;
        else if (!is(TT::CloseSquare))
          fail("expected ',' or ']', found " + found());
      }
      ++i_;
      return nd;
    }
    case TT::OpenCurly: {
      NodeP nd = node(NK::ObjectLit, tk.pos);
      while (!is(TT::CloseCurly)) {
        nd->a.push_back(parseExpression());
        expect(TT::Colon, "':'");
        nd->b.push_back(parseExpression());
        if (is(TT::Comma))
          ++i_;
        else if (!is(TT::CloseCurly))
          fail("expected ',' or '}', found " + found());
      }
      ++i_;
      return nd;
    }
    default:
      --i_;
      fail("unexpected " + found() + " in an expression");
    }
  }
};

//===----------------------------------------------------------------------===//
// Interpreter.
//===----------------------------------------------------------------------===//

struct Env {
  Env *parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  explicit Env(Env *p) : parent(p) {}
  Value *findLocal(const std::string &k) {
    for (auto &kv : vars)
      if (kv.first == k)
        return &kv.second;
    return nullptr;
  }
  void set(const std::string &k, Value v) {
    if (Value *p = findLocal(k))
      *p = std::move(v);
    else
      vars.emplace_back(k, std::move(v));
  }
  Value lookup(const std::string &k) {
    for (Env *e = this; e; e = e->parent)
      if (Value *p = e->findLocal(k))
        return *p;
    return mkUndef();
  }
};

struct BreakSignal {};
struct ContinueSignal {};
struct Raised {
  uint32_t pos;
  std::string msg;
};

class Interp {
public:
  explicit Interp(std::time_t now) : now_(now) {}

  void execBlock(const std::vector<NodeP> &body, Env &env, std::string &out) {
    for (auto &st : body)
      if (st)
        exec(*st, env, out);
  }

private:
  std::time_t now_;
  int depth_ = 0;
  int renderDepth_ = 0;
  uint64_t steps_ = 0;

  [[noreturn]] static void fail(const Node &nd, const std::string &msg) { throw Located(nd.pos, msg); }

  /// One more statement or expression evaluated at `nd`, one level deeper:
  /// refused past the render's limits (kMaxTemplateSteps, kMaxRenderDepth).
  struct Step {
    Interp &in;
    Step(Interp &interp, const Node &nd) : in(interp) {
      if (++in.steps_ > kMaxTemplateSteps)
        fail(nd, "the template ran " + std::to_string(kMaxTemplateSteps) +
                     " steps without finishing (the limit): a loop too long for a prompt, "
                     "or one that does not end");
      if (++in.renderDepth_ > kMaxRenderDepth) {
        --in.renderDepth_;
        fail(nd, "the template nests its evaluation deeper than " +
                     std::to_string(kMaxRenderDepth) + " levels (the limit)");
      }
    }
    ~Step() { --in.renderDepth_; }
  };
  static void checkSize(const Node &nd, const std::string &out) {
    if (out.size() > kMaxTemplateBytes)
      fail(nd, "the template's output grew to " + std::to_string(out.size()) +
                   " bytes, more than the " + std::to_string(kMaxTemplateBytes >> 20) +
                   " MiB a template may make (the limit)");
  }

  void exec(const Node &nd, Env &env, std::string &out) {
    Step step(*this, nd);
    switch (nd.k) {
    case NK::Text:
      out += nd.s;
      checkSize(nd, out);
      return;
    case NK::Output: {
      Value v = eval(*nd.x, env);
      if (v.t != VT::Null && v.t != VT::Undefined)
        out += located(*nd.x, [&] { return toStr(v); });
      checkSize(nd, out);
      return;
    }
    case NK::If:
      if (truthy(eval(*nd.x, env)))
        execBlock(nd.a, env, out);
      else
        execBlock(nd.b, env, out);
      return;
    case NK::For:
      execFor(nd, env, out);
      return;
    case NK::Set:
      execSet(nd, env);
      return;
    case NK::Macro:
      env.set(nd.s, mkFunc(FuncData::Macro, nd.s, Value(), &nd));
      return;
    case NK::Break:
      throw BreakSignal();
    case NK::Continue:
      throw ContinueSignal();
    case NK::FilterBlock: {
      std::string body;
      execBlock(nd.a, env, body);
      Value v = applyFilter(mkStr(body), *nd.x, env);
      if (v.t != VT::Null && v.t != VT::Undefined)
        out += located(nd, [&] { return toStr(v); });
      checkSize(nd, out);
      return;
    }
    default:
      fail(nd, "internal error: expression in statement position");
    }
  }

  template <typename F> auto located(const Node &nd, F &&f) -> decltype(f()) {
    try {
      return f();
    } catch (const JsError &e) {
      throw Located(nd.pos, e.what());
    }
  }

  void execSet(const Node &nd, Env &env) {
    Value rhs;
    if (nd.y) {
      rhs = eval(*nd.y, env);
    } else {
      std::string body;
      execBlock(nd.a, env, body);
      rhs = mkStr(body);
    }
    const Node &tgt = *nd.x;
    if (tgt.k == NK::Ident) {
      env.set(tgt.s, rhs);
    } else if (tgt.k == NK::TupleLit) {
      if (!rhs.isArray())
        fail(nd, std::string("Cannot unpack non-iterable type in set: ") + typeName(rhs));
      if (rhs.a->size() != tgt.a.size())
        fail(nd, std::string("Too ") + (tgt.a.size() > rhs.a->size() ? "few" : "many") +
                     " items to unpack in set");
      for (size_t i = 0; i < tgt.a.size(); ++i)
        env.set(tgt.a[i]->s, (*rhs.a)[i]);
    } else {
      Value obj = eval(*tgt.x, env);
      if (obj.t != VT::Namespace)
        fail(*tgt.x, "cannot assign attribute on non-namespace object");
      obj.o->set(tgt.y->s, rhs);
    }
  }

  void execFor(const Node &nd, Env &env, std::string &out) {
    Env scope(&env);
    Value iterable = eval(*nd.x, scope);
    if (!(iterable.isArray() || iterable.isObject()))
      fail(*nd.x, std::string("Expected iterable or object type in for loop: got ") + typeName(iterable));
    Array all;
    if (iterable.isObject()) {
      for (auto &kv : iterable.o->items)
        all.push_back(mkStr(kv.first));
    } else {
      all = *iterable.a;
    }
    auto bind = [&](Env &e, const Value &cur) {
      if (!nd.flag) {
        e.set(nd.a[0]->s, cur);
        return;
      }
      if (cur.t != VT::Array)
        fail(nd, std::string("Cannot unpack non-iterable type: ") + typeName(cur));
      if (cur.a->size() != nd.a.size())
        fail(nd, std::string("Too ") + (nd.a.size() > cur.a->size() ? "few" : "many") + " items to unpack");
      for (size_t j = 0; j < nd.a.size(); ++j)
        e.set(nd.a[j]->s, (*cur.a)[j]);
    };
    Array items;
    for (auto &cur : all) {
      Step step(*this, nd); // an iteration is a step, even with an empty body
      if (nd.y) {
        Env loopScope(&scope);
        bind(loopScope, cur);
        if (!truthy(eval(*nd.y, loopScope)))
          continue;
      }
      items.push_back(cur);
    }
    bool noIteration = true;
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      Step step(*this, nd);
      auto loop = std::make_shared<ObjData>();
      loop->items.emplace_back("index", mkInt(double(i + 1)));
      loop->items.emplace_back("index0", mkInt(double(i)));
      loop->items.emplace_back("revindex", mkInt(double(len - i)));
      loop->items.emplace_back("revindex0", mkInt(double(len - i - 1)));
      loop->items.emplace_back("first", mkBool(i == 0));
      loop->items.emplace_back("last", mkBool(i == len - 1));
      loop->items.emplace_back("length", mkInt(double(len)));
      loop->items.emplace_back("previtem", i > 0 ? items[i - 1] : mkUndef());
      loop->items.emplace_back("nextitem", i + 1 < len ? items[i + 1] : mkUndef());
      scope.set("loop", mkObj(loop));
      bind(scope, items[i]);
      size_t mark = out.size();
      try {
        execBlock(nd.b, scope, out);
      } catch (const ContinueSignal &) {
        out.resize(mark);
        continue;
      } catch (const BreakSignal &) {
        out.resize(mark);
        break;
      }
      noIteration = false;
    }
    if (noIteration)
      execBlock(nd.c, scope, out);
  }

  // Positional values, then a KeywordArgumentsValue when there are keywords
  // (the calling convention of @huggingface/jinja).
  Array evalArgs(const std::vector<NodeP> &args, Env &env, bool alwaysKw = false) {
    Array pos;
    auto kw = std::make_shared<ObjData>();
    for (auto &a : args)
      if (a->k != NK::Kwarg)
        pos.push_back(eval(*a, env));
    for (auto &a : args)
      if (a->k == NK::Kwarg)
        kw->items.emplace_back(a->s, eval(*a->x, env));
    if (!kw->items.empty() || alwaysKw)
      pos.push_back(mkObj(kw, VT::KwArgs));
    return pos;
  }
  void splitArgs(const std::vector<NodeP> &args, Env &env, Array &pos, std::shared_ptr<ObjData> &kw) {
    kw = std::make_shared<ObjData>();
    for (auto &a : args)
      if (a->k != NK::Kwarg)
        pos.push_back(eval(*a, env));
    for (auto &a : args)
      if (a->k == NK::Kwarg)
        kw->items.emplace_back(a->s, eval(*a->x, env));
  }

public:
  Value eval(const Node &nd, Env &env) {
    Step step(*this, nd);
    switch (nd.k) {
    case NK::IntLit: return mkInt(nd.n);
    case NK::FloatLit: return mkFloat(nd.n);
    case NK::StrLit: return mkStr(nd.s);
    case NK::Ident: return env.lookup(nd.s);
    case NK::ArrayLit:
    case NK::TupleLit: {
      Array a;
      for (auto &e : nd.a)
        a.push_back(eval(*e, env));
      return mkArr(std::move(a), nd.k == NK::ArrayLit ? VT::Array : VT::Tuple);
    }
    case NK::ObjectLit: {
      auto o = std::make_shared<ObjData>();
      for (size_t i = 0; i < nd.a.size(); ++i) {
        Value k = eval(*nd.a[i], env);
        if (k.t != VT::String)
          fail(*nd.a[i], std::string("Object keys must be strings: got ") + typeName(k));
        o->set(k.str(), eval(*nd.b[i], env));
      }
      return mkObj(o);
    }
    case NK::Member: return evalMember(nd, env);
    case NK::Call: return evalCall(nd, env);
    case NK::Binary: return evalBinary(nd, env);
    case NK::Unary: {
      Value v = eval(*nd.x, env);
      if (nd.s == "not")
        return mkBool(!truthy(v));
      double sign = nd.s == "-" ? -1 : 1;
      if (v.isNumber() || v.t == VT::Bool) {
        double x = v.t == VT::Bool ? (v.b ? 1 : 0) : v.n;
        return v.t == VT::Float ? mkFloat(sign * x) : mkInt(sign * x);
      }
      fail(nd, "Unknown operator \"" + nd.s + "\" for " + typeName(v));
    }
    case NK::Filter: {
      Value v = eval(*nd.x, env);
      return applyFilter(v, nd, env);
    }
    case NK::Test: {
      Value v = eval(*nd.x, env);
      bool r = located(nd, [&] { return runTest(nd.s, v, nullptr); });
      return mkBool(nd.flag ? !r : r);
    }
    case NK::Select: {
      if (!truthy(eval(*nd.y, env)))
        return mkUndef();
      return eval(*nd.x, env);
    }
    case NK::Ternary:
      return truthy(eval(*nd.x, env)) ? eval(*nd.y, env) : eval(*nd.z, env);
    default:
      fail(nd, "internal error: statement in expression position");
    }
  }

private:
  static bool runTest(const std::string &name, const Value &v, const Value *arg) {
    if (name == "boolean") return v.t == VT::Bool;
    if (name == "callable") return v.t == VT::Function;
    if (name == "odd" || name == "even") {
      if (v.t != VT::Int)
        throw JsError("cannot " + name + " on " + typeName(v));
      double r = std::fmod(v.n, 2);
      return name == "odd" ? r != 0 : r == 0;
    }
    if (name == "false") return v.t == VT::Bool && !v.b;
    if (name == "true") return v.t == VT::Bool && v.b;
    if (name == "none") return v.t == VT::Null;
    if (name == "string") return v.t == VT::String;
    if (name == "number") return v.isNumber();
    if (name == "integer") return v.t == VT::Int;
    if (name == "iterable") return v.t == VT::Array || v.t == VT::String;
    if (name == "mapping") return v.isObject();
    if (name == "sequence") return v.isArray() || v.isObject() || v.t == VT::String;
    if (name == "lower") return v.t == VT::String && v.str() == jsCase(v.str(), false);
    if (name == "upper") return v.t == VT::String && v.str() == jsCase(v.str(), true);
    if (name == "defined") return v.t != VT::Undefined;
    if (name == "undefined") return v.t == VT::Undefined;
    if (name == "equalto" || name == "eq") {
      if (!arg || !arg->s) // no value to compare with
        throw JsError("test '" + name + "' needs a value to compare with");
      return strictEq(v, *arg);
    }
    throw JsError("Unknown test: " + name);
  }

  Value evalMember(const Node &nd, Env &env) {
    Value obj = eval(*nd.x, env);
    if (nd.y->k == NK::Slice)
      return evalSlice(obj, *nd.y, env);
    Value prop = eval(*nd.y, env);
    auto needString = [&] {
      if (prop.t != VT::String)
        fail(nd, std::string("Cannot access property with non-string: got ") + typeName(prop));
    };
    if (obj.isAttrContainer()) {
      needString();
      if (const Value *v = obj.o->find(prop.str()))
        return *v;
      if (obj.isObject() && objectMethod(prop.str()))
        return mkFunc(FuncData::Method, prop.str(), obj);
      return mkUndef();
    }
    if (obj.isArray() || obj.t == VT::String) {
      if (prop.t == VT::Int) {
        if (obj.t == VT::String) {
          auto u = toUtf16(obj.str());
          double idx = prop.n < 0 ? prop.n + double(u.size()) : prop.n;
          if (!(idx >= 0 && idx < double(u.size())))
            return mkUndef();
          std::string out;
          appendUtf8(out, u[size_t(idx)]);
          return mkStr(out);
        }
        double idx = prop.n < 0 ? prop.n + double(obj.a->size()) : prop.n;
        if (!(idx >= 0 && idx < double(obj.a->size())))
          return mkUndef();
        return (*obj.a)[size_t(idx)];
      }
      if (prop.t == VT::String) {
        if (prop.str() == "length")
          return mkInt(double(obj.t == VT::String ? utf16Length(obj.str()) : obj.a->size()));
        if (obj.t == VT::String && stringMethod(prop.str()))
          return mkFunc(FuncData::Method, prop.str(), obj);
        return mkUndef();
      }
      fail(nd, std::string("Cannot access property with non-string/non-number: got ") + typeName(prop));
    }
    needString();
    return mkUndef();
  }

  static bool objectMethod(const std::string &m) {
    return m == "get" || m == "items" || m == "keys" || m == "values" || m == "dictsort";
  }
  static bool stringMethod(const std::string &m) {
    static const std::set<std::string> ms = {"upper", "lower", "strip", "title", "capitalize",
                                             "rstrip", "lstrip", "startswith", "endswith",
                                             "split", "replace"};
    return ms.count(m) > 0;
  }

  Value evalSlice(const Value &obj, const Node &sl, Env &env) {
    if (!(obj.isArray() || obj.t == VT::String))
      fail(sl, "Slice object must be an array or string");
    Value parts[3];
    const Node *ns[3] = {sl.x.get(), sl.y.get(), sl.z.get()};
    const char *names[3] = {"start", "stop", "step"};
    for (int i = 0; i < 3; ++i) {
      if (ns[i])
        parts[i] = eval(*ns[i], env);
      if (!(parts[i].t == VT::Int || parts[i].t == VT::Undefined))
        fail(sl, std::string("Slice ") + names[i] + " must be numeric or undefined");
    }
    auto indices = [&](double len) {
      std::vector<size_t> idx;
      double step = parts[2].t == VT::Int ? parts[2].n : 1;
      bool hasStart = parts[0].t == VT::Int, hasStop = parts[1].t == VT::Int;
      double start, stop;
      if (step >= 0) {
        start = hasStart ? parts[0].n : 0;
        start = start < 0 ? std::max(len + start, 0.0) : std::min(start, len);
        stop = hasStop ? parts[1].n : len;
        stop = stop < 0 ? std::max(len + stop, 0.0) : std::min(stop, len);
        if (step == 0)
          return idx;
        for (double i = start; i < stop; i += step)
          idx.push_back(size_t(i));
      } else {
        start = hasStart ? parts[0].n : len - 1;
        start = start < 0 ? std::max(len + start, -1.0) : std::min(start, len - 1);
        stop = hasStop ? parts[1].n : -1;
        stop = stop < -1 ? std::max(len + stop, -1.0) : std::min(stop, len - 1);
        for (double i = start; i > stop; i += step)
          idx.push_back(size_t(i));
      }
      return idx;
    };
    if (obj.isArray()) {
      Array out;
      for (size_t i : indices(double(obj.a->size())))
        out.push_back((*obj.a)[i]);
      return mkArr(std::move(out));
    }
    std::u32string cps = toU32(obj.str());
    std::u32string out;
    for (size_t i : indices(double(cps.size())))
      out += cps[i];
    return mkStr(toUtf8(out));
  }

  Value evalBinary(const Node &nd, Env &env) {
    Value l = eval(*nd.x, env);
    const std::string &op = nd.s;
    if (op == "and")
      return truthy(l) ? eval(*nd.y, env) : l;
    if (op == "or")
      return truthy(l) ? l : eval(*nd.y, env);
    Value r = eval(*nd.y, env);
    return located(nd, [&] { return binaryOp(op, l, r); });
  }

  static Value binaryOp(const std::string &op, const Value &l, const Value &r) {
    if (op == "==")
      return mkBool(looseEq(l, r));
    if (op == "!=")
      return mkBool(!looseEq(l, r));
    if (l.t == VT::Undefined || r.t == VT::Undefined) {
      if (r.t == VT::Undefined && (op == "in" || op == "not in"))
        return mkBool(op == "not in");
      throw JsError("Cannot perform operation " + op + " on undefined values");
    }
    if (l.t == VT::Null || r.t == VT::Null)
      throw JsError("Cannot perform operation on null values");
    if (op == "~")
      return mkStr(rawStr(l) + rawStr(r));
    auto numLike = [](const Value &v) { return v.isNumber() || v.t == VT::Bool; };
    if (op == "**" && numLike(l) && numLike(r)) {
      double a = l.t == VT::Bool ? l.b : l.n, b = r.t == VT::Bool ? r.b : r.n;
      if (a == 0 && b < 0)
        throw JsError("0.0 cannot be raised to a negative power");
      double res = std::pow(a, b);
      if (!std::isfinite(res))
        throw JsError("Exponentiation result is not a finite real number");
      bool isFloat = l.t == VT::Float || r.t == VT::Float || b < 0;
      return isFloat ? mkFloat(res) : mkInt(res);
    }
    if (l.isNumber() && r.isNumber()) {
      double a = l.n, b = r.n;
      bool isFloat = l.t == VT::Float || r.t == VT::Float;
      if (op == "+" || op == "-" || op == "*") {
        double res = op == "+" ? a + b : op == "-" ? a - b : a * b;
        return isFloat ? mkFloat(res) : mkInt(res);
      }
      if (op == "/")
        return mkFloat(a / b);
      if (op == "//") {
        double res = std::floor(a / b);
        return isFloat ? mkFloat(res) : mkInt(res);
      }
      if (op == "%") {
        double res = std::fmod(a, b);
        return isFloat ? mkFloat(res) : mkInt(res);
      }
      if (op == "<") return mkBool(a < b);
      if (op == ">") return mkBool(a > b);
      if (op == ">=") return mkBool(a >= b);
      if (op == "<=") return mkBool(a <= b);
    } else if (l.isArray() && r.isArray()) {
      if (op == "+") {
        Array out = *l.a;
        out.insert(out.end(), r.a->begin(), r.a->end());
        return mkArr(std::move(out));
      }
    } else if (r.isArray()) {
      bool member = false;
      for (auto &x : *r.a)
        if (strictEq(x, l)) {
          member = true;
          break;
        }
      if (op == "in")
        return mkBool(member);
      if (op == "not in")
        return mkBool(!member);
    }
    if ((l.t == VT::String || r.t == VT::String) && op == "+")
      return mkStr(rawStr(l) + rawStr(r));
    if (l.t == VT::String && r.t == VT::String) {
      if (op == "in")
        return mkBool(r.str().find(l.str()) != std::string::npos);
      if (op == "not in")
        return mkBool(r.str().find(l.str()) == std::string::npos);
    }
    if (l.t == VT::String && r.isObject()) {
      if (op == "in")
        return mkBool(r.o->find(l.str()) != nullptr);
      if (op == "not in")
        return mkBool(r.o->find(l.str()) == nullptr);
    }
    throw JsError("Unknown operator \"" + op + "\" between " + typeName(l) + " and " + typeName(r));
  }

  Value evalCall(const Node &nd, Env &env) {
    Array args = evalArgs(nd.a, env);
    Value fn = eval(*nd.x, env);
    if (fn.t != VT::Function)
      fail(nd, std::string("Cannot call something that is not a function: got ") + typeName(fn));
    const FuncData &f = *fn.f;
    if (f.kind == FuncData::Macro)
      return callMacro(nd, *f.macro, args, env);
    if (f.kind == FuncData::Method)
      return located(nd, [&] { return callMethod(f.receiver, f.name, args); });
    // Globals.
    if (f.name == "raise_exception") {
      std::string msg;
      if (!args.empty()) {
        const Value &a = args[0];
        msg = (a.t == VT::Undefined || a.t == VT::Null) ? "" : rawStr(a);
      }
      throw Raised{nd.pos, msg};
    }
    return located(nd, [&] { return callGlobal(f.name, args); });
  }

  Value callGlobal(const std::string &name, Array &args) {
    if (name == "namespace") {
      std::shared_ptr<ObjData> kw;
      if (!args.empty() && args.back().t == VT::KwArgs) {
        kw = args.back().o;
        args.pop_back();
      }
      if (args.size() > 1)
        throw JsError("namespace expected at most 1 argument, got " + std::to_string(args.size()));
      auto o = std::make_shared<ObjData>();
      if (args.size() == 1) {
        const Value &src = args[0];
        if (src.isObject()) {
          for (auto &kv : src.o->items)
            o->set(kv.first, kv.second);
        } else if (src.isArray()) {
          for (auto &pair : *src.a) {
            Array vals;
            if (pair.isArray()) {
              vals = *pair.a;
            } else if (pair.t == VT::String) {
              for (char32_t c : toU32(pair.str())) {
                std::string cs;
                appendUtf8(cs, c);
                vals.push_back(mkStr(cs));
              }
            }
            if (vals.size() != 2)
              throw JsError("namespace expected an object or an iterable of [key, value] pairs");
            if (vals[0].t != VT::String)
              throw JsError("namespace keys must be strings");
            o->set(vals[0].str(), vals[1]);
          }
        } else {
          throw JsError(std::string("'") + typeName(src) + "' object is not iterable");
        }
      }
      if (kw)
        for (auto &kv : kw->items)
          o->set(kv.first, kv.second);
      return mkObj(o, VT::Namespace);
    }
    if (name == "range") {
      auto num = [&](size_t i, double dflt, bool &present) {
        present = i < args.size() && args[i].t != VT::KwArgs;
        if (!present)
          return dflt;
        if (!args[i].isNumber())
          throw JsError("range() arguments must be numbers");
        return args[i].n;
      };
      bool p0, p1, p2;
      double start = num(0, 0, p0), stop = num(1, 0, p1), step = num(2, 1, p2);
      if (!p0)
        throw JsError("range() expects at least one argument");
      if (!p1) {
        stop = start;
        start = 0;
      }
      if (step == 0)
        throw JsError("range() step must not be zero");
      Array out;
      if (step > 0) {
        for (double i = start; i < stop; i += step) {
          out.push_back(mkNumber(i));
          if (out.size() >= 1000000)
            throw JsError("range() of more than 1,000,000 numbers (the limit)");
        }
      } else {
        for (double i = start; i > stop; i += step) {
          out.push_back(mkNumber(i));
          if (out.size() >= 1000000)
            throw JsError("range() of more than 1,000,000 numbers (the limit)");
        }
      }
      return mkArr(std::move(out));
    }
    if (name == "strftime_now") {
      if (args.empty() || args[0].t != VT::String)
        throw JsError("strftime_now() expects a format string");
      return mkStr(strftimeNow(args[0].str()));
    }
    throw JsError("unknown function '" + name + "'");
  }

  std::string strftimeNow(const std::string &fmt) const {
    std::time_t t = now_ ? now_ : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    static const char *longM[] = {"January", "February", "March", "April", "May", "June", "July",
                                  "August", "September", "October", "November", "December"};
    static const char *shortM[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    auto pad2 = [](int v) {
      char b[16];
      std::snprintf(b, sizeof b, "%02d", v);
      return std::string(b);
    };
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] == '%' && i + 1 < fmt.size()) {
        char c = fmt[i + 1];
        std::string rep;
        bool known = true;
        switch (c) {
        case 'Y': rep = std::to_string(tm.tm_year + 1900); break;
        case 'm': rep = pad2(tm.tm_mon + 1); break;
        case 'd': rep = pad2(tm.tm_mday); break;
        case 'b': rep = shortM[tm.tm_mon]; break;
        case 'B': rep = longM[tm.tm_mon]; break;
        case 'H': rep = pad2(tm.tm_hour); break;
        case 'M': rep = pad2(tm.tm_min); break;
        case '%': rep = "%"; break;
        default: known = false;
        }
        if (known) {
          out += rep;
          ++i;
          continue;
        }
      }
      out += fmt[i];
    }
    return out;
  }

  Value callMacro(const Node &call, const Node &macro, Array &args, Env &env) {
    if (++depth_ > 200) {
      --depth_;
      fail(call, "macro recursion too deep");
    }
    Env scope(&env);
    std::shared_ptr<ObjData> kw = std::make_shared<ObjData>();
    if (!args.empty() && args.back().t == VT::KwArgs) {
      kw = std::make_shared<ObjData>(*args.back().o);
      args.pop_back();
    }
    std::vector<const Node *> pending;
    for (size_t i = 0; i < macro.a.size(); ++i) {
      const Node &p = *macro.a[i];
      Value v;
      bool have = i < args.size();
      if (have)
        v = args[i];
      if (!have) {
        for (auto it = kw->items.begin(); it != kw->items.end(); ++it)
          if (it->first == p.s) {
            v = it->second;
            have = true;
            kw->items.erase(it);
            break;
          }
      }
      if (!have && p.k == NK::Kwarg)
        pending.push_back(&p);
      scope.set(p.s, v);
    }
    if (!kw->items.empty())
      fail(call, "macro '" + macro.s + "' takes no keyword argument '" + kw->items[0].first + "'");
    if (args.size() > macro.a.size())
      fail(call, "macro '" + macro.s + "' takes not more than " + std::to_string(macro.a.size()) +
                     " argument(s)");
    for (const Node *p : pending)
      scope.set(p->s, eval(*p->x, scope));
    std::string out;
    execBlock(macro.b, scope, out);
    --depth_;
    return mkStr(out);
  }

  static Value callMethod(const Value &self, const std::string &name, Array &args) {
    if (self.t == VT::String) {
      const std::string &s = self.str();
      if (name == "upper") return mkStr(jsCase(s, true));
      if (name == "lower") return mkStr(jsCase(s, false));
      if (name == "strip") return mkStr(trimBoth(s));
      if (name == "rstrip") return mkStr(trimEnd(s));
      if (name == "lstrip") return mkStr(trimStart(s));
      if (name == "title") return mkStr(titleCase(s));
      if (name == "capitalize") return mkStr(capitalize(s));
      if (name == "startswith" || name == "endswith") {
        bool starts = name == "startswith";
        if (args.empty())
          throw JsError(name + "() requires at least one argument");
        auto test = [&](const std::string &p) {
          if (p.size() > s.size())
            return false;
          return starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
        };
        const Value &pat = args[0];
        if (pat.t == VT::String)
          return mkBool(test(pat.str()));
        if (pat.isArray()) {
          for (auto &it : *pat.a) {
            if (it.t != VT::String)
              throw JsError(name + "() tuple elements must be strings");
            if (test(it.str()))
              return mkBool(true);
          }
          return mkBool(false);
        }
        throw JsError(name + "() argument must be a string or tuple of strings");
      }
      if (name == "split") return split(s, args);
      if (name == "replace") return replaceMethod(s, args);
    } else if (self.isObject()) {
      if (name == "get") {
        if (args.empty() || args[0].t != VT::String)
          throw JsError(std::string("Object key must be a string: got ") +
                        (args.empty() ? "UndefinedValue" : typeName(args[0])));
        if (const Value *v = self.o->find(args[0].str()))
          return *v;
        if (args.size() > 1)
          return args[1];
        return mkNull();
      }
      if (name == "items") {
        Array out;
        for (auto &kv : self.o->items)
          out.push_back(mkArr({mkStr(kv.first), kv.second}));
        return mkArr(std::move(out));
      }
      if (name == "keys") {
        Array out;
        for (auto &kv : self.o->items)
          out.push_back(mkStr(kv.first));
        return mkArr(std::move(out));
      }
      if (name == "values") {
        Array out;
        for (auto &kv : self.o->items)
          out.push_back(kv.second);
        return mkArr(std::move(out));
      }
      if (name == "dictsort") return dictsort(self, args);
    }
    throw JsError("unknown method '" + name + "'");
  }

  static std::string titleCase(const std::string &s) {
    std::string out = s;
    for (size_t i = 0; i < out.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(out[i]);
      bool prevWord = i > 0 && isAsciiWord(static_cast<unsigned char>(out[i - 1]));
      if (isAsciiWord(c) && !prevWord && c >= 'a' && c <= 'z')
        out[i] = static_cast<char>(c - 32);
    }
    return out;
  }

  static std::string capitalize(const std::string &s) {
    if (s.empty())
      return s;
    size_t i = 0;
    uint32_t cp = decodeUtf8(s, i);
    if (cp >= 0x10000)
      return s; // charAt(0) is half a surrogate pair: unchanged
    std::string out;
    if (hasSpecialUpper(cp)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "upper() of U+%04X is not supported", static_cast<unsigned>(cp));
      throw JsError(buf);
    }
    appendUtf8(out, mapCase(cp, true));
    return out + s.substr(i);
  }

  static Value split(const std::string &s, const Array &args) {
    Value sep = args.size() > 0 ? args[0] : mkNull();
    if (!(sep.t == VT::String || sep.t == VT::Null))
      throw JsError("sep argument must be a string or null");
    Value maxv = args.size() > 1 ? args[1] : mkInt(-1);
    if (maxv.t != VT::Int)
      throw JsError("maxsplit argument must be a number");
    double maxsplit = maxv.n;
    std::vector<std::string> parts;
    if (sep.t == VT::Null) {
      std::string text = trimStart(s);
      size_t i = 0;
      while (i < text.size()) {
        // skip spaces
        size_t j = i;
        while (j < text.size()) {
          size_t k = j;
          if (!isJsSpace(decodeUtf8(text, k)))
            break;
          j = k;
        }
        if (j >= text.size())
          break;
        size_t e = j;
        while (e < text.size()) {
          size_t k = e;
          if (isJsSpace(decodeUtf8(text, k)))
            break;
          e = k;
        }
        if (maxsplit != -1 && double(parts.size()) >= maxsplit) {
          parts.push_back(text.substr(j));
          break;
        }
        parts.push_back(text.substr(j, e - j));
        i = e;
      }
    } else {
      const std::string &d = sep.str();
      if (d.empty())
        throw JsError("empty separator");
      size_t start = 0;
      while (true) {
        size_t p = s.find(d, start);
        if (p == std::string::npos) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, p - start));
        start = p + d.size();
      }
      if (maxsplit != -1 && double(parts.size()) > maxsplit) {
        size_t keep = maxsplit < 0 ? 0 : size_t(maxsplit);
        // JS splice with a negative start counts from the end.
        if (maxsplit < 0)
          keep = size_t(std::max(0.0, double(parts.size()) + maxsplit));
        std::string rest;
        for (size_t i = keep; i < parts.size(); ++i) {
          if (i > keep)
            rest += d;
          rest += parts[i];
        }
        parts.resize(keep);
        parts.push_back(rest);
      }
    }
    Array out;
    for (auto &p : parts)
      out.push_back(mkStr(p));
    return mkArr(std::move(out));
  }

  static Value replaceMethod(const std::string &s, const Array &args) {
    if (args.size() < 2)
      throw JsError("replace() requires at least two arguments");
    if (args[0].t != VT::String || args[1].t != VT::String)
      throw JsError("replace() arguments must be strings");
    Value count = mkNull();
    if (args.size() > 2) {
      if (args[2].t == VT::KwArgs) {
        const Value *c = args[2].o->find("count");
        count = c ? *c : mkNull();
      } else {
        count = args[2];
      }
    }
    if (!(count.t == VT::Int || count.t == VT::Null))
      throw JsError("replace() count argument must be a number or null");
    const std::string &from = args[0].str(), &to = args[1].str();
    if (count.t == VT::Int && count.n == 0)
      return mkStr(s);
    double remaining = (count.t == VT::Null || count.n < 0) ? INFINITY : count.n;
    std::string out;
    if (from.empty()) {
      // Matches at every code point boundary, the ends included.
      size_t i = 0;
      while (true) {
        if (remaining > 0) {
          out += to;
          --remaining;
        }
        if (i >= s.size())
          break;
        size_t j = i;
        decodeUtf8(s, j);
        out.append(s, i, j - i);
        i = j;
      }
      return mkStr(out);
    }
    size_t start = 0;
    while (true) {
      size_t p = s.find(from, start);
      if (p == std::string::npos || remaining <= 0) {
        out.append(s, start, std::string::npos);
        break;
      }
      out.append(s, start, p - start);
      out += to;
      --remaining;
      start = p + from.size();
    }
    return mkStr(out);
  }

  static Value dictsort(const Value &self, const Array &args) {
    std::shared_ptr<ObjData> kw;
    Array pos;
    for (auto &a : args) {
      if (a.t == VT::KwArgs)
        kw = a.o;
      else
        pos.push_back(a);
    }
    auto opt = [&](size_t i, const char *k, Value dflt) {
      if (i < pos.size())
        return pos[i];
      if (kw)
        if (const Value *v = kw->find(k))
          return *v;
      return dflt;
    };
    Value cs = opt(0, "case_sensitive", mkBool(false));
    if (cs.t != VT::Bool)
      throw JsError("case_sensitive must be a boolean");
    Value by = opt(1, "by", mkStr("key"));
    if (by.t != VT::String)
      throw JsError("by must be a string");
    if (by.str() != "key" && by.str() != "value")
      throw JsError("by must be either 'key' or 'value'");
    Value rev = opt(2, "reverse", mkBool(false));
    if (rev.t != VT::Bool)
      throw JsError("reverse must be a boolean");
    Array items;
    for (auto &kv : self.o->items)
      items.push_back(mkArr({mkStr(kv.first), kv.second}));
    size_t idx = by.str() == "key" ? 0 : 1;
    std::stable_sort(items.begin(), items.end(), [&](const Value &a, const Value &b) {
      int r = compareValues((*a.a)[idx], (*b.a)[idx], cs.b);
      return (rev.b ? -r : r) < 0;
    });
    return mkArr(std::move(items));
  }

  static Value attrPath(const Value &item, const std::string &path) {
    Value v = item;
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (v.isAttrContainer()) {
        const Value *f = v.o->find(part);
        v = f ? *f : mkUndef();
      } else if (v.isArray()) {
        double idx = jsParseInt(part);
        if (!std::isnan(idx) && idx >= 0 && idx < double(v.a->size()))
          v = (*v.a)[size_t(idx)];
        else
          return mkUndef();
      } else {
        return mkUndef();
      }
      if (dot == std::string::npos)
        break;
      start = dot + 1;
    }
    return v;
  }

  Value applyFilter(const Value &v, const Node &f, Env &env) {
    const std::string &name = f.s;
    if (!f.flag)
      return located(f, [&] { return plainFilter(v, name); });
    // With an argument list.
    if (name == "tojson") {
      Array pos;
      std::shared_ptr<ObjData> kw;
      splitArgs(f.a, env, pos, kw);
      return located(f, [&] {
        JsonOpts o;
        if (const Value *ind = kw->find("indent")) {
          if (!(ind->t == VT::Int || ind->t == VT::Null))
            throw JsError("If set, indent must be a number");
          if (ind->t == VT::Int) {
            if (ind->n < 0 || ind->n > 1000)
              throw JsError("indent out of range");
            o.indent = int(ind->n);
          }
        }
        if (const Value *ea = kw->find("ensure_ascii")) {
          if (ea->t != VT::Bool)
            throw JsError("If set, ensure_ascii must be a boolean");
          o.ensureAscii = ea->b;
        }
        if (const Value *sp = kw->find("separators")) {
          if (sp->isArray()) {
            if (sp->a->size() != 2 || (*sp->a)[0].t != VT::String || (*sp->a)[1].t != VT::String)
              throw JsError("separators must be a tuple of two strings");
            o.hasSeparators = true;
            o.itemSep = (*sp->a)[0].str();
            o.keySep = (*sp->a)[1].str();
          } else if (sp->t != VT::Null) {
            throw JsError("If set, separators must be a tuple of two strings");
          }
        }
        return mkStr(toJson(v, o, 0, true));
      });
    }
    if (name == "join") {
      if (!(v.t == VT::String || v.isArray()))
        fail(f, "Cannot apply filter \"join\" to type: " + std::string(typeName(v)));
      Array pos;
      std::shared_ptr<ObjData> kw;
      splitArgs(f.a, env, pos, kw);
      Value sep = !pos.empty() ? pos[0] : kw->find("separator") ? *kw->find("separator") : mkStr("");
      if (sep.t != VT::String)
        fail(f, "separator must be a string");
      return located(f, [&] {
        std::string out;
        if (v.t == VT::String) {
          bool first = true;
          for (char32_t c : toU32(v.str())) {
            if (!first)
              out += sep.str();
            first = false;
            appendUtf8(out, c);
          }
        } else {
          for (size_t i = 0; i < v.a->size(); ++i) {
            if (i)
              out += sep.str();
            const Value &e = (*v.a)[i];
            if (e.t != VT::Null && e.t != VT::Undefined)
              out += rawStr(e);
          }
        }
        return mkStr(out);
      });
    }
    if (name == "int" || name == "float") {
      Array pos;
      std::shared_ptr<ObjData> kw;
      splitArgs(f.a, env, pos, kw);
      bool isInt = name == "int";
      Value dflt = !pos.empty() ? pos[0] : kw->find("default") ? *kw->find("default") : (isInt ? mkInt(0) : mkFloat(0));
      if (v.t == VT::String) {
        double x = isInt ? jsParseInt(v.str()) : jsParseFloat(v.str());
        if (std::isnan(x))
          return dflt;
        return isInt ? mkInt(x) : mkFloat(x);
      }
      if (v.isNumber())
        return v;
      if (v.t == VT::Bool)
        return isInt ? mkInt(v.b ? 1 : 0) : mkFloat(v.b ? 1 : 0);
      fail(f, "Cannot apply filter \"" + name + "\" to type: " + typeName(v));
    }
    if (name == "default") {
      Array pos;
      std::shared_ptr<ObjData> kw;
      splitArgs(f.a, env, pos, kw);
      Value dflt = !pos.empty() ? pos[0] : mkStr("");
      Value boolean = pos.size() > 1 ? pos[1] : kw->find("boolean") ? *kw->find("boolean") : mkBool(false);
      if (boolean.t != VT::Bool)
        fail(f, "`default` filter flag must be a boolean");
      if (v.t == VT::Undefined || (boolean.b && !truthy(v)))
        return dflt;
      return v;
    }
    if (v.isArray()) {
      if (name == "sort") {
        Array pos;
        std::shared_ptr<ObjData> kw;
        splitArgs(f.a, env, pos, kw);
        auto opt = [&](size_t i, const char *k, Value d) {
          if (i < pos.size())
            return pos[i];
          if (const Value *x = kw->find(k))
            return *x;
          return d;
        };
        Value rev = opt(0, "reverse", mkBool(false));
        if (rev.t != VT::Bool)
          fail(f, "reverse must be a boolean");
        Value cs = opt(1, "case_sensitive", mkBool(false));
        if (cs.t != VT::Bool)
          fail(f, "case_sensitive must be a boolean");
        Value attr = opt(2, "attribute", mkNull());
        if (!(attr.t == VT::String || attr.t == VT::Int || attr.t == VT::Null))
          fail(f, "attribute must be a string, integer, or null");
        return located(f, [&] {
          auto key = [&](const Value &item) {
            if (attr.t == VT::Null)
              return item;
            return attrPath(item, attr.t == VT::Int ? jsNumber(attr.n) : attr.str());
          };
          Array out = *v.a;
          std::stable_sort(out.begin(), out.end(), [&](const Value &a, const Value &b) {
            int r = compareValues(key(a), key(b), cs.b);
            return (rev.b ? -r : r) < 0;
          });
          return mkArr(std::move(out));
        });
      }
      if (name == "selectattr" || name == "rejectattr") {
        bool select = name == "selectattr";
        for (auto &it : *v.a)
          if (!it.isAttrContainer())
            fail(f, "`" + name + "` can only be applied to array of objects");
        std::string attr = f.a[0]->s;
        std::string test = f.a.size() > 1 ? f.a[1]->s : "";
        Value arg = f.a.size() > 2 ? mkStr(f.a[2]->s) : mkUndef();
        return located(f, [&] {
          Array out;
          for (auto &it : *v.a) {
            const Value *a = it.o->find(attr);
            bool r = false;
            if (a)
              r = test.empty() ? truthy(*a) : runTest(test, *a, &arg);
            if (select ? r : !r)
              out.push_back(it);
          }
          return mkArr(std::move(out));
        });
      }
      if (name == "map") {
        Array pos;
        std::shared_ptr<ObjData> kw;
        splitArgs(f.a, env, pos, kw);
        const Value *attr = kw->find("attribute");
        if (!attr || attr->t != VT::String)
          fail(f, "attribute must be a string");
        const Value *dflt = kw->find("default");
        Array out;
        for (auto &it : *v.a) {
          if (!it.isAttrContainer())
            fail(f, "items in map must be an object");
          Value x = attrPath(it, attr->str());
          out.push_back(x.t == VT::Undefined ? (dflt ? *dflt : mkUndef()) : x);
        }
        return mkArr(std::move(out));
      }
      fail(f, "Unknown ArrayValue filter: " + name);
    }
    if (v.t == VT::String) {
      if (name == "indent") {
        Array pos;
        std::shared_ptr<ObjData> kw;
        splitArgs(f.a, env, pos, kw);
        auto opt = [&](size_t i, const char *k, Value d) {
          if (i < pos.size())
            return pos[i];
          if (const Value *x = kw->find(k))
            return *x;
          return d;
        };
        Value width = opt(0, "width", mkInt(4));
        if (width.t != VT::Int)
          fail(f, "width must be a number");
        if (width.n < 0 || width.n > 100000)
          fail(f, "width out of range");
        bool first = truthy(opt(1, "first", mkBool(false)));
        bool blank = truthy(opt(2, "blank", mkBool(false)));
        return mkStr(indentLines(v.str(), std::string(size_t(width.n), ' '), first, blank));
      }
      if (name == "replace") {
        Array args = evalArgs(f.a, env, /*alwaysKw=*/true);
        return located(f, [&] { return replaceMethod(v.str(), args); });
      }
      fail(f, "Unknown StringValue filter: " + name);
    }
    if (v.isObject()) {
      if (objectMethod(name)) {
        Array args = evalArgs(f.a, env);
        return located(f, [&] { return callMethod(v, name, args); });
      }
      fail(f, "Unknown ObjectValue filter: " + name);
    }
    fail(f, "Cannot apply filter \"" + name + "\" to type: " + typeName(v));
  }

  static std::string indentLines(const std::string &s, const std::string &ind, bool first, bool blank) {
    std::string out;
    size_t start = 0, line = 0;
    while (true) {
      size_t nl = s.find('\n', start);
      std::string x = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      if (line)
        out += '\n';
      if ((!first && line == 0) || (!blank && x.empty()))
        out += x;
      else
        out += ind + x;
      if (nl == std::string::npos)
        break;
      start = nl + 1;
      ++line;
    }
    return out;
  }

  Value plainFilter(const Value &v, const std::string &name) {
    if (name == "safe")
      return v;
    if (name == "tojson")
      return mkStr(toJson(v, JsonOpts(), 0, true));
    if (v.isArray()) {
      const Array &a = *v.a;
      if (name == "list") return v;
      if (a.empty() && (name == "first" || name == "last"))
        throw JsError("'" + name + "' of an empty list");
      if (name == "first") return a.front();
      if (name == "last") return a.back();
      if (name == "length") return mkInt(double(a.size()));
      if (name == "reverse") return mkArr(Array(a.rbegin(), a.rend()));
      if (name == "sort") {
        Array out = a;
        std::stable_sort(out.begin(), out.end(),
                         [](const Value &x, const Value &y) { return compareValues(x, y, false) < 0; });
        return mkArr(std::move(out));
      }
      if (name == "join") {
        std::string out;
        for (auto &e : a)
          if (e.t != VT::Null && e.t != VT::Undefined)
            out += rawStr(e);
        return mkStr(out);
      }
      if (name == "string") return mkStr(toJson(v, JsonOpts(), 0, false));
      if (name == "unique") {
        Array out;
        for (auto &e : a) {
          bool seen = false;
          for (auto &o : out)
            if (sameValueZero(o, e)) {
              seen = true;
              break;
            }
          if (!seen)
            out.push_back(e);
        }
        return mkArr(std::move(out));
      }
      throw JsError("Unknown ArrayValue filter: " + name);
    }
    if (v.t == VT::String) {
      const std::string &s = v.str();
      if (name == "length") return mkInt(double(utf16Length(s)));
      if (name == "upper") return mkStr(jsCase(s, true));
      if (name == "lower") return mkStr(jsCase(s, false));
      if (name == "title") return mkStr(titleCase(s));
      if (name == "capitalize") return mkStr(capitalize(s));
      if (name == "trim") return mkStr(trimBoth(s));
      if (name == "indent") return mkStr(indentLines(s, "    ", false, false));
      if (name == "join" || name == "string") return v;
      if (name == "int") {
        double x = jsParseInt(s);
        return mkInt(std::isnan(x) ? 0 : x);
      }
      if (name == "float") {
        double x = jsParseFloat(s);
        return mkFloat(std::isnan(x) ? 0 : x);
      }
      throw JsError("Unknown StringValue filter: " + name);
    }
    if (v.isNumber()) {
      if (name == "abs") return v.t == VT::Int ? mkInt(std::fabs(v.n)) : mkFloat(std::fabs(v.n));
      if (name == "int") return mkInt(std::floor(v.n));
      if (name == "float") return mkFloat(v.n);
      if (name == "string") return mkStr(toStr(v));
      throw JsError("Unknown NumericValue filter: " + name);
    }
    if (v.isObject()) {
      if (name == "items" || objectMethod(name)) {
        Array none;
        return callMethod(v, name, none);
      }
      if (name == "length") return mkInt(double(v.o->items.size()));
      throw JsError("Unknown ObjectValue filter: " + name);
    }
    if (v.t == VT::Bool) {
      if (name == "bool") return v;
      if (name == "int") return mkInt(v.b ? 1 : 0);
      if (name == "float") return mkFloat(v.b ? 1 : 0);
      if (name == "string") return mkStr(v.b ? "true" : "false");
      throw JsError("Unknown BooleanValue filter: " + name);
    }
    throw JsError("Cannot apply filter \"" + name + "\" to type: " + typeName(v));
  }

  // Set membership of the JavaScript values (SameValueZero).
  static bool sameValueZero(const Value &a, const Value &b) {
    if (a.isNumber() && b.isNumber())
      return a.n == b.n || (std::isnan(a.n) && std::isnan(b.n));
    return strictEq(a, b);
  }
};

std::vector<uint32_t> lineStarts(const std::u32string &s) {
  std::vector<uint32_t> ls{0};
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n')
      ls.push_back(static_cast<uint32_t>(i + 1));
  return ls;
}

} // namespace

struct ChatTemplate::Impl {
  std::string origin;
  std::vector<uint32_t> lines;
  std::vector<NodeP> body;

  std::string where(uint32_t pos) const {
    auto it = std::upper_bound(lines.begin(), lines.end(), pos);
    size_t line = static_cast<size_t>(it - lines.begin());
    uint32_t col = pos - lines[line - 1] + 1;
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col) + ": ";
  }
};

ChatTemplate ChatTemplate::parse(const std::string &source, const std::string &origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  std::u32string src = toU32(source);
  impl->lines = lineStarts(src);
  try {
    MappedText pre = preprocess(src);
    uint32_t endPos = static_cast<uint32_t>(src.size());
    Parser parser(tokenize(pre, endPos), endPos);
    impl->body = parser.parseProgram();
    for (const Node *call : parser.calledNames) {
      const std::string &nm = call->x->s;
      if (!kGlobalFunctions.count(nm) && !parser.macroNames.count(nm))
        throw Located(call->x->pos, "unsupported function '" + nm + "'");
    }
  } catch (const Located &e) {
    throw ChatTemplateError(impl->where(e.pos) + e.what());
  }
  return ChatTemplate(std::move(impl));
}

std::string ChatTemplate::render(const nlohmann::ordered_json &vars) const {
  return render(vars, ChatTemplateRenderOptions());
}

std::string ChatTemplate::render(const nlohmann::ordered_json &vars,
                                 const ChatTemplateRenderOptions &options) const {
  const Impl &im = *impl_;
  if (!vars.is_object() && !vars.is_null())
    throw ChatTemplateError(im.origin + ": render variables must be a JSON object");
  Env global(nullptr);
  global.set("namespace", mkFunc(FuncData::Global, "namespace"));
  global.set("false", mkBool(false));
  global.set("true", mkBool(true));
  global.set("none", mkNull());
  global.set("raise_exception", mkFunc(FuncData::Global, "raise_exception"));
  global.set("range", mkFunc(FuncData::Global, "range"));
  global.set("strftime_now", mkFunc(FuncData::Global, "strftime_now"));
  global.set("True", mkBool(true));
  global.set("False", mkBool(false));
  global.set("None", mkNull());
  try {
    if (vars.is_object()) {
      for (auto it = vars.begin(); it != vars.end(); ++it) {
        if (global.findLocal(it.key()))
          throw ChatTemplateError(im.origin + ": render variable '" + it.key() +
                                  "' is already declared (a built-in name)");
        global.set(it.key(), fromJson(it.value()));
      }
    }
  } catch (const JsError &e) {
    throw ChatTemplateError(im.origin + ": " + e.what());
  }
  Interp interp(options.now);
  std::string out;
  try {
    interp.execBlock(im.body, global, out);
  } catch (const std::bad_alloc &) {
    throw ChatTemplateError(im.origin + ": rendering ran out of memory (output " +
                            std::to_string(out.size()) +
                            " bytes so far): a string or list grew past what this process "
                            "may allocate");
  } catch (const Located &e) {
    throw ChatTemplateError(im.where(e.pos) + e.what());
  } catch (const Raised &r) {
    throw ChatTemplateError(im.where(r.pos) + "template raised: " + r.msg);
  } catch (const JsError &e) {
    throw ChatTemplateError(im.origin + ": " + e.what());
  }
  return out;
}

const std::string &ChatTemplate::origin() const { return impl_->origin; }

std::string chatTemplateFromConfig(const nlohmann::ordered_json &config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    throw ChatTemplateError("tokenizer config has no chat_template");
  if (it->is_string())
    return it->get<std::string>();
  if (it->is_array()) {
    for (auto &e : *it)
      if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    throw ChatTemplateError("tokenizer config's chat_template list has no \"default\" entry");
  }
  throw ChatTemplateError("tokenizer config's chat_template is neither a string nor a list");
}

nlohmann::ordered_json specialTokenFromConfig(const nlohmann::ordered_json &config, const std::string &key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null())
    return nullptr;
  if (it->is_string())
    return *it;
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string())
      return *c;
  }
  return nullptr;
}

} // namespace data
} // namespace hflow
