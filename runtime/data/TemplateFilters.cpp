//===- TemplateFilters.cpp - the interpreter's tests, operators, string and list methods ---===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <utility>

namespace hflow::data::tmpl {

void checkSize(const Node &nd, const std::string &out) {
  if (out.size() > kMaxTemplateBytes)
    fail(nd, "the template's output grew to " + std::to_string(out.size()) +
                 " bytes, more than the " + std::to_string(kMaxTemplateBytes >> 20) +
                 " MiB a template may make (the limit)");
}

bool runTest(const std::string &name, const Value &v, const Value *arg) {
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

bool objectMethod(const std::string &m) {
  return m == "get" || m == "items" || m == "keys" || m == "values" || m == "dictsort";
}

bool stringMethod(const std::string &m) {
  static const std::set<std::string> ms = {"upper", "lower", "strip", "title", "capitalize",
                                           "rstrip", "lstrip", "startswith", "endswith",
                                           "split", "replace"};
  return ms.count(m) > 0;
}

Value binaryOp(const std::string &op, const Value &l, const Value &r) {
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

Value callMethod(const Value &self, const std::string &name, Array &args) {
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

std::string titleCase(const std::string &s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(out[i]);
    bool prevWord = i > 0 && isAsciiWord(static_cast<unsigned char>(out[i - 1]));
    if (isAsciiWord(c) && !prevWord && c >= 'a' && c <= 'z')
      out[i] = static_cast<char>(c - 32);
  }
  return out;
}

std::string capitalize(const std::string &s) {
  if (s.empty())
    return s;
  size_t i = 0;
  uint32_t cp = decodeUtf8Lenient(s, i);
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

Value split(const std::string &s, const Array &args) {
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
        if (!isJsSpace(decodeUtf8Lenient(text, k)))
          break;
        j = k;
      }
      if (j >= text.size())
        break;
      size_t e = j;
      while (e < text.size()) {
        size_t k = e;
        if (isJsSpace(decodeUtf8Lenient(text, k)))
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

Value replaceMethod(const std::string &s, const Array &args) {
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
      decodeUtf8Lenient(s, j);
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

Value dictsort(const Value &self, const Array &args) {
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

Value attrPath(const Value &item, const std::string &path) {
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

std::string indentLines(const std::string &s, const std::string &ind, bool first, bool blank) {
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

// Set membership of the JavaScript values (SameValueZero).
bool sameValueZero(const Value &a, const Value &b) {
  if (a.isNumber() && b.isNumber())
    return a.n == b.n || (std::isnan(a.n) && std::isnan(b.n));
  return strictEq(a, b);
}

} // namespace hflow::data::tmpl
