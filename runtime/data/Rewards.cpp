//===- Rewards.cpp - rule-based rewards -----------------------------------===//
//
// Hand-written scanners rather than std::regex: libstdc++'s regex recurses
// per character and can overflow the stack on a long response.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/Rewards.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>

namespace hflow {
namespace data {
namespace {

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f';
}
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isAlnum(char c) {
  return isDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string ltrim(const std::string &s) {
  size_t b = 0;
  while (b < s.size() && isSpace(s[b]))
    ++b;
  return s.substr(b);
}
std::string trim(const std::string &s) {
  size_t b = 0, e = s.size();
  while (b < e && isSpace(s[b]))
    ++b;
  while (e > b && isSpace(s[e - 1]))
    --e;
  return s.substr(b, e - b);
}
std::string firstLine(const std::string &s) {
  size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

/// A decimal number in canonical form: no leading zeros in the integer
/// part, no trailing zeros in the fraction, no sign on zero. Two numbers
/// are numerically equal iff their canonical forms are.
struct Decimal {
  bool negative = false;
  std::string whole; // digits, "0" for zero
  std::string frac;  // digits, "" for none
  bool operator==(const Decimal &o) const {
    return negative == o.negative && whole == o.whole && frac == o.frac;
  }
};

Decimal canonical(bool negative, std::string whole, std::string frac) {
  size_t nz = whole.find_first_not_of('0');
  whole = nz == std::string::npos ? "0" : whole.substr(nz);
  size_t last = frac.find_last_not_of('0');
  frac = last == std::string::npos ? "" : frac.substr(0, last + 1);
  if (whole == "0" && frac.empty())
    negative = false;
  return Decimal{negative, whole, frac};
}

/// Reads a number starting at s[i] (a digit, or a '-' right before one):
///   -?  (\d{1,3}(,\d{3})+ | \d+)  (\.\d+)?
/// where thousands groups are taken only after a first run of 1-3 digits
/// and each group is exactly three digits (not followed by a fourth).
/// Sets `end` past the number.
Decimal readNumber(const std::string &s, size_t i, size_t &end) {
  bool neg = false;
  if (s[i] == '-') {
    neg = true;
    ++i;
  }
  size_t b = i;
  while (i < s.size() && isDigit(s[i]))
    ++i;
  std::string whole = s.substr(b, i - b);
  if (whole.size() <= 3) {
    while (i + 3 < s.size() && s[i] == ',' && isDigit(s[i + 1]) &&
           isDigit(s[i + 2]) && isDigit(s[i + 3]) &&
           (i + 4 >= s.size() || !isDigit(s[i + 4]))) {
      whole += s.substr(i + 1, 3);
      i += 4;
    }
  }
  std::string frac;
  if (i + 1 < s.size() && s[i] == '.' && isDigit(s[i + 1])) {
    size_t fb = ++i;
    while (i < s.size() && isDigit(s[i]))
      ++i;
    frac = s.substr(fb, i - fb);
  }
  end = i;
  return canonical(neg, whole, frac);
}

/// Whether a number starts at s[i]. A '-' is a sign only when a digit
/// follows and no letter, digit or '.' precedes it ("5-3" is 5 and 3).
bool numberStarts(const std::string &s, size_t i) {
  if (isDigit(s[i]))
    return true;
  return s[i] == '-' && i + 1 < s.size() && isDigit(s[i + 1]) &&
         (i == 0 || !(isAlnum(s[i - 1]) || s[i - 1] == '.'));
}

std::optional<Decimal> lastNumber(const std::string &s, size_t from = 0) {
  std::optional<Decimal> last;
  size_t i = from;
  while (i < s.size()) {
    if (numberStarts(s, i)) {
      size_t end;
      last = readNumber(s, i, end);
      i = end;
    } else {
      ++i;
    }
  }
  return last;
}

/// GSM8K style: the number after the last "####" (spaces, tabs and '$'
/// skipped), else the last number of the text.
std::optional<Decimal> finalNumber(const std::string &s) {
  size_t mark = s.rfind("####");
  if (mark != std::string::npos) {
    size_t i = mark + 4;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '$'))
      ++i;
    if (i < s.size() && (isDigit(s[i]) || (s[i] == '-' && i + 1 < s.size() &&
                                           isDigit(s[i + 1])))) {
      size_t end;
      return readNumber(s, i, end);
    }
  }
  return lastNumber(s);
}

/// A whole string that is "-?\d+" in canonical form ("-0" -> "0").
std::optional<std::string> integerText(const std::string &s) {
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && s[i] == '-') {
    neg = true;
    ++i;
  }
  if (i == s.size())
    return std::nullopt;
  for (size_t j = i; j < s.size(); ++j)
    if (!isDigit(s[j]))
      return std::nullopt;
  Decimal d = canonical(neg, s.substr(i), "");
  return (d.negative ? "-" : "") + d.whole;
}

std::string int128Text(__int128 v) {
  bool neg = v < 0;
  unsigned __int128 u = neg ? -(unsigned __int128)v : (unsigned __int128)v;
  std::string digits;
  do {
    digits.push_back(char('0' + int(u % 10)));
    u /= 10;
  } while (u != 0);
  if (neg)
    digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

/// "A op B =" on the prompt's last non-blank line -> the result's text.
std::optional<std::string> arithmeticResult(const std::string &prompt) {
  std::string line;
  size_t end = prompt.size();
  while (true) {
    size_t nl = end == 0 ? std::string::npos : prompt.rfind('\n', end - 1);
    size_t begin = nl == std::string::npos ? 0 : nl + 1;
    line = trim(prompt.substr(begin, end - begin));
    if (!line.empty() || nl == std::string::npos)
      break;
    end = nl;
  }
  size_t i = 0;
  auto skip = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t'))
      ++i;
  };
  auto operand = [&](__int128 &v) {
    bool neg = false;
    if (i < line.size() && line[i] == '-') {
      neg = true;
      ++i;
    }
    size_t b = i;
    while (i < line.size() && isDigit(line[i]))
      ++i;
    if (i == b || i - b > 18)
      return false;
    v = 0;
    for (size_t j = b; j < i; ++j)
      v = v * 10 + (line[j] - '0');
    if (neg)
      v = -v;
    return true;
  };
  __int128 a, b;
  skip();
  if (!operand(a))
    return std::nullopt;
  skip();
  if (i >= line.size() || (line[i] != '+' && line[i] != '-' && line[i] != '*'))
    return std::nullopt;
  char op = line[i++];
  skip();
  if (!operand(b))
    return std::nullopt;
  skip();
  if (i < line.size() && line[i] == '=')
    ++i;
  skip();
  if (i != line.size())
    return std::nullopt;
  __int128 r = op == '+' ? a + b : op == '-' ? a - b : a * b;
  return int128Text(r);
}

double exactMatch(const std::string &response, const Example &ex) {
  return trim(firstLine(ltrim(response))) == trim(ex.answer) ? 1.0 : 0.0;
}

double finalNumberRule(const std::string &response, const Example &ex) {
  std::optional<Decimal> want = finalNumber(ex.answer);
  if (!want)
    return 0.0;
  std::optional<Decimal> got = finalNumber(response);
  return got && *got == *want ? 1.0 : 0.0;
}

double arith(const std::string &response, const Example &ex) {
  std::optional<std::string> want = arithmeticResult(ex.prompt);
  if (!want)
    want = integerText(trim(ex.answer));
  if (!want)
    return 0.0;
  size_t i = 0;
  while (i < response.size() && (response[i] == ' ' || response[i] == '\t'))
    ++i;
  size_t b = i;
  if (i < response.size() && response[i] == '-')
    ++i;
  while (i < response.size() && isDigit(response[i]))
    ++i;
  std::optional<std::string> got = integerText(response.substr(b, i - b));
  return got && *got == *want ? 1.0 : 0.0;
}

double formatNumber(const std::string &response, const Example &) {
  return integerText(firstLine(response)) ? 1.0 : 0.0;
}

double evenTokens(const std::string &response, const Example &) {
  if (response.empty())
    return 0.0;
  size_t even = 0;
  for (unsigned char c : response)
    if (c % 2 == 0)
      ++even;
  return double(even) / double(response.size());
}

// --- math_boxed ---------------------------------------------------------

/// The contents of the last \boxed{...} (or \fbox{...}) in `s`, braces
/// balanced; or of "\boxed X" up to the next '$' or end of line. Nothing
/// when there is none or its braces do not close.
std::optional<std::string> lastBoxed(const std::string &s) {
  size_t at = std::string::npos, len = 0;
  for (const char *kw : {"\\boxed", "\\fbox"}) {
    size_t p = s.rfind(kw);
    if (p != std::string::npos && (at == std::string::npos || p > at)) {
      at = p;
      len = std::char_traits<char>::length(kw);
    }
  }
  if (at == std::string::npos)
    return std::nullopt;
  size_t i = at + len;
  if (i < s.size() && s[i] == ' ') {
    size_t e = i + 1;
    while (e < s.size() && s[e] != '$' && s[e] != '\n')
      ++e;
    return s.substr(i + 1, e - i - 1);
  }
  while (i < s.size() && isSpace(s[i]))
    ++i;
  if (i >= s.size() || s[i] != '{')
    return std::nullopt;
  int depth = 0;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] == '{')
      ++depth;
    else if (s[k] == '}' && --depth == 0)
      return s.substr(i + 1, k - i - 1);
  }
  return std::nullopt;
}

void eraseAll(std::string &s, const std::string &what) {
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p))
    s.erase(p, what.size());
}

void replaceAllText(std::string &s, const std::string &from, const std::string &to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
    s.replace(p, from.size(), to);
}

/// "\frac12" -> "\frac{1}{2}", "\frac1{72}" -> "\frac{1}{72}".
std::string fixFracs(const std::string &s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 5, "\\frac") != 0) {
      out += s[i++];
      continue;
    }
    out += "\\frac";
    i += 5;
    for (int arg = 0; arg < 2 && i < s.size(); ++arg) {
      if (s[i] == '{') {
        size_t depth = 0, k = i;
        for (; k < s.size(); ++k) {
          if (s[k] == '{')
            ++depth;
          else if (s[k] == '}' && --depth == 0)
            break;
        }
        out += s.substr(i, k + 1 - i);
        i = k + 1;
      } else if (s[i] != '\\') {
        out += std::string("{") + s[i] + "}";
        ++i;
      } else
        break;
    }
  }
  return out;
}

/// "\sqrt2" -> "\sqrt{2}".
std::string fixSqrt(const std::string &s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 5, "\\sqrt") == 0 && i + 5 < s.size() && s[i + 5] != '{' &&
        s[i + 5] != '\\') {
      out += "\\sqrt{" + std::string(1, s[i + 5]) + "}";
      i += 6;
    } else
      out += s[i++];
  }
  return out;
}

bool allDigits(const std::string &s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), isDigit);
}

/// The normal form the MATH benchmark compares answers in (Hendrycks et
/// al.'s string normalization): no spaces, line breaks, \left/\right,
/// \! , degrees, dollars, percent signs or trailing units; tfrac/dfrac are
/// frac; \frac and \sqrt arguments braced; "a/b" of integers is \frac{a}{b};
/// "0.5" is \frac{1}{2}; a leading "x =" of at most two characters dropped.
std::string normalizeMath(std::string s) {
  eraseAll(s, "\n");
  eraseAll(s, "\\!");
  replaceAllText(s, "\\\\", "\\");
  replaceAllText(s, "tfrac", "frac");
  replaceAllText(s, "dfrac", "frac");
  eraseAll(s, "\\left");
  eraseAll(s, "\\right");
  eraseAll(s, "^{\\circ}");
  eraseAll(s, "^\\circ");
  eraseAll(s, "\\$");
  eraseAll(s, "$");
  size_t unit = s.find("\\text{ ");
  if (unit != std::string::npos)
    s = s.substr(0, unit);
  eraseAll(s, "\\%");
  eraseAll(s, "%");
  replaceAllText(s, " .", " 0.");
  replaceAllText(s, "{.", "{0.");
  if (!s.empty() && s[0] == '.')
    s = "0" + s;
  size_t eq = s.find('=');
  if (eq != std::string::npos && s.find('=', eq + 1) == std::string::npos &&
      trim(s.substr(0, eq)).size() <= 2)
    s = s.substr(eq + 1);
  s = fixSqrt(s);
  eraseAll(s, " ");
  s = fixFracs(s);
  if (s == "0.5")
    s = "\\frac{1}{2}";
  size_t slash = s.find('/');
  if (slash != std::string::npos && s.find('/', slash + 1) == std::string::npos &&
      allDigits(s.substr(0, slash)) && allDigits(s.substr(slash + 1)))
    s = "\\frac{" + s.substr(0, slash) + "}{" + s.substr(slash + 1) + "}";
  return s;
}

double mathBoxed(const std::string &response, const Example &ex) {
  std::optional<std::string> got = lastBoxed(response);
  if (!got)
    return 0.0;
  std::optional<std::string> boxedAnswer = lastBoxed(ex.answer);
  std::string want = boxedAnswer ? *boxedAnswer : trim(ex.answer);
  std::string a = normalizeMath(*got), b = normalizeMath(want);
  if (a.empty() || b.empty())
    return 0.0;
  if (a == b)
    return 1.0;
  // Plain numbers compare as numbers ("1,000" == "1000.0").
  auto plain = [](const std::string &t) {
    return std::all_of(t.begin(), t.end(),
                       [](char c) { return isDigit(c) || c == '.' || c == ',' || c == '-'; });
  };
  if (plain(a) && plain(b)) {
    std::optional<Decimal> x = lastNumber(a), y = lastNumber(b);
    if (x && y && *x == *y)
      return 1.0;
  }
  return 0.0;
}

const std::map<std::string, RewardRule> &rules() {
  static const std::map<std::string, RewardRule> table = {
      {"exact_match", exactMatch},     {"final_number", finalNumberRule},
      {"gsm8k", finalNumberRule},      {"arith", arith},
      {"format_number", formatNumber}, {"even_tokens", evenTokens},
      {"math_boxed", mathBoxed},
  };
  return table;
}

} // namespace

RewardRule rewardRule(const std::string &name) {
  auto it = rules().find(name);
  if (it != rules().end())
    return it->second;
  std::string known;
  for (const std::string &n : rewardRuleNames())
    known += (known.empty() ? "" : ", ") + n;
  throw std::runtime_error("unknown reward rule '" + name + "'; known: " + known);
}

std::vector<std::string> rewardRuleNames() {
  std::vector<std::string> names;
  for (const auto &kv : rules())
    names.push_back(kv.first);
  return names;
}

} // namespace data
} // namespace hflow
