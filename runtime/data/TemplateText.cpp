//===- TemplateText.cpp - UTF-8 and UTF-16, and JavaScript's string and number rules ---===//
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwctype>

namespace hflow::data::tmpl {



std::u32string toU32(const std::string &s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();)
    out += decodeUtf8Lenient(s, i);
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
    n += decodeUtf8Lenient(s, i) >= 0x10000 ? 2 : 1;
  return n;
}

std::vector<uint16_t> toUtf16(const std::string &s) {
  std::vector<uint16_t> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = decodeUtf8Lenient(s, i);
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
    if (!isJsSpace(decodeUtf8Lenient(s, j)))
      break;
    i = j;
  }
  return s.substr(i);
}

std::string trimEnd(const std::string &s) {
  // Walk forwards remembering where the last non-space code point ended.
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = decodeUtf8Lenient(s, i);
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
    appendUtf8(out, mapCase(decodeUtf8Lenient(s, i), upper));
  return out;
}

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

namespace {

/// The end of the decimal digits of `s` from `i`.
size_t digitsEnd(const std::string &s, size_t i) {
  while (i < s.size() && isdigit(static_cast<unsigned char>(s[i])))
    ++i;
  return i;
}

/// The end of a StrDecimalLiteral's digits from `i`: digits, then a '.'
/// and digits. `any`: there is a digit; without one the '.' is not taken
/// (and there is no number).
size_t mantissaEnd(const std::string &s, size_t i, bool &any) {
  size_t j = digitsEnd(s, i);
  any = j > i;
  if (j < s.size() && s[j] == '.') {
    size_t k = digitsEnd(s, j + 1);
    if (any || k > j + 1) {
      j = k;
      any = true;
    }
  }
  return j;
}

/// The end of an exponent at `j` (e or E, a sign, digits), or `j` when
/// there is none there or it has no digit.
size_t exponentEnd(const std::string &s, size_t j) {
  if (j >= s.size() || (s[j] != 'e' && s[j] != 'E'))
    return j;
  size_t k = j + 1;
  if (k < s.size() && (s[k] == '+' || s[k] == '-'))
    ++k;
  size_t d = digitsEnd(s, k);
  return d > k ? d : j;
}

} // namespace

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
  // Only a StrDecimalLiteral, the whole string: digits, optional fraction,
  // optional exponent (with digits).
  bool any;
  size_t j = mantissaEnd(s, i, any);
  if (!any || exponentEnd(s, j) != s.size())
    return NAN;
  return std::strtod(s.c_str(), nullptr);
}

double jsParseInt(const std::string &s0) {
  std::string s = trimStart(s0);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    neg = s[i++] == '-';
  size_t d = i;
  i = digitsEnd(s, d);
  if (i == d)
    return NAN;
  double v = std::strtod(s.substr(d, i - d).c_str(), nullptr);
  return neg ? -v : v;
}

double jsParseFloat(const std::string &s0) {
  std::string s = trimStart(s0);
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    ++i;
  if (s.compare(i, 8, "Infinity") == 0)
    return s[0] == '-' ? -INFINITY : INFINITY;
  // The longest StrDecimalLiteral at the start.
  bool any;
  size_t j = mantissaEnd(s, i, any);
  if (!any)
    return NAN;
  return std::strtod(s.substr(0, exponentEnd(s, j)).c_str(), nullptr);
}

bool isIntegral(double x) { return std::isfinite(x) && std::floor(x) == x; }

/// Where each line of `s` starts (for file:line:col in errors).
std::vector<uint32_t> lineStarts(const std::u32string &s) {
  std::vector<uint32_t> ls{0};
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n')
      ls.push_back(static_cast<uint32_t>(i + 1));
  return ls;
}

} // namespace hflow::data::tmpl
