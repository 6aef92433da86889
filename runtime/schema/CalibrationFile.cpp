//===- CalibrationFile.cpp - read and check a calibration file ------------===//
//
// A small JSON reader of its own: the file is a flat object of numbers, and
// the compiler side that links this is built without exceptions (which
// nlohmann-json needs).
//
//===----------------------------------------------------------------------===//
#include "runtime/schema/CalibrationFile.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

namespace hflow::placement {

//===----------------------------------------------------------------------===//
// Calibration file
//===----------------------------------------------------------------------===//

namespace {
const CalibrationKey kCalFields[] = {
    {"trainFlopsPerParamToken", &Calibration::trainFlopsPerParamToken, 1e-9, 1e3},
    {"forwardFlopsPerParamToken", &Calibration::forwardFlopsPerParamToken, 1e-9, 1e3},
    {"trainEfficiency", &Calibration::trainEfficiency, 1e-9, 1},
    {"forwardEfficiency", &Calibration::forwardEfficiency, 1e-9, 1},
    {"prefillEfficiency", &Calibration::prefillEfficiency, 1e-9, 1},
    {"decodeComputeEfficiency", &Calibration::decodeComputeEfficiency, 1e-9, 1},
    {"decodeBandwidthEfficiency", &Calibration::decodeBandwidthEfficiency, 1e-9, 1},
    {"decodeStepOverhead", &Calibration::decodeStepOverhead, 0, 1e3},
    {"linkEfficiency", &Calibration::linkEfficiency, 1e-9, 1},
    {"alphaIntra", &Calibration::alphaIntra, 0, 1e3},
    {"alphaInter", &Calibration::alphaInter, 0, 1e3},
    {"memoryFraction", &Calibration::memoryFraction, 1e-9, 1},
    {"epochs", &Calibration::epochs, 1, 1e6},
};
/// The key of the raw measurements' sub-object.
const char kMeasuredKey[] = "measured";

std::string shortNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
/// "(0, 1]" for the keys that must be positive, "[0, 1000]" otherwise.
std::string rangeText(const CalibrationKey &k) {
  return (k.min == 1e-9 ? std::string("(0") : "[" + shortNumber(k.min)) + ", " +
         shortNumber(k.max) + "]";
}

struct JsonReader {
  const std::string &s;
  size_t i = 0;
  std::string err;
  explicit JsonReader(const std::string &text) : s(text) {}
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
      ++i;
  }
  bool fail(const std::string &m) {
    if (err.empty())
      err = m + " at offset " + std::to_string(i);
    return false;
  }
  bool expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c)
      return fail(std::string("expected '") + c + "'");
    ++i;
    return true;
  }
  bool str(std::string &out) {
    ws();
    if (i >= s.size() || s[i] != '"')
      return fail("expected a string key");
    ++i;
    out.clear();
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\') {
        if (i >= s.size())
          return fail("unterminated escape");
        char e = s[i++];
        switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        default: return fail("unsupported escape in a key");
        }
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return fail("control character in a string");
      } else {
        out += c;
      }
    }
    if (i >= s.size())
      return fail("unterminated string");
    ++i;
    return true;
  }
  bool number(double &out) {
    ws();
    // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    size_t b = i;
    if (i < s.size() && s[i] == '-')
      ++i;
    auto digits = [&] {
      size_t d = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9')
        ++i;
      return i - d;
    };
    size_t intDigits = digits();
    if (intDigits == 0)
      return fail("expected a number");
    if (intDigits > 1 && s[b + (s[b] == '-')] == '0')
      return fail("leading zero in a number");
    if (i < s.size() && s[i] == '.') {
      ++i;
      if (digits() == 0)
        return fail("expected digits after '.'");
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-'))
        ++i;
      if (digits() == 0)
        return fail("expected an exponent");
    }
    std::string tok = s.substr(b, i - b);
    char *end = nullptr;
    out = std::strtod(tok.c_str(), &end);
    if (!end || *end != '\0' || !std::isfinite(out))
      return fail("number out of range");
    return true;
  }
  /// The "measured" object: {"name": number, ...}, any names, each once.
  bool measured() {
    std::set<std::string> names;
    if (!expect('{'))
      return false;
    ws();
    if (i < s.size() && s[i] == '}') {
      ++i;
      return true;
    }
    for (;;) {
      std::string key;
      double v = 0;
      ws();
      size_t at = i;
      if (!str(key) || !expect(':'))
        return false;
      if (!names.insert(key).second) {
        i = at;
        return fail("duplicate key \"measured." + key + "\"");
      }
      if (!number(v))
        return false;
      ws();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      return expect('}');
    }
  }
};
} // namespace

const CalibrationKey *calibrationKeys(size_t &count) {
  count = sizeof(kCalFields) / sizeof(kCalFields[0]);
  return kCalFields;
}

const CalibrationKey *findCalibrationKey(const std::string &name) {
  for (const CalibrationKey &k : kCalFields)
    if (name == k.name)
      return &k;
  return nullptr;
}

bool loadCalibrationFile(const std::string &path, Calibration &out,
                         std::string &error) {
  const std::string who = "calibration " + path + ": ";
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    error = who + "cannot read: " + std::strerror(errno);
    return false;
  }
  std::string text;
  char buf[4096];
  size_t n;
  // Calibration files are a few hundred bytes; refuse anything huge.
  constexpr size_t kMaxBytes = size_t(1) << 20;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= kMaxBytes)
    text.append(buf, n);
  const bool readError = std::ferror(f) != 0;
  const int readErrno = errno;
  std::fclose(f);
  if (readError) {
    error = who + "cannot read: " + std::strerror(readErrno);
    return false;
  }
  if (text.size() > kMaxBytes) {
    error = who + "larger than 1 MiB: not a calibration file";
    return false;
  }
  std::string err;
  if (!loadCalibration(text, out, err)) {
    const std::string prefix = "calibration: ";
    error = who + (err.compare(0, prefix.size(), prefix) == 0
                       ? err.substr(prefix.size())
                       : err);
    return false;
  }
  error.clear();
  return true;
}

bool loadCalibration(const std::string &jsonText, Calibration &out,
                     std::string &error) {
  Calibration c = out;
  JsonReader r(jsonText);
  std::set<std::string> seen;
  auto done = [&](bool ok) {
    if (!ok) {
      error = "calibration: " + r.err;
      return false;
    }
    out = c;
    error.clear();
    return true;
  };
  if (!r.expect('{'))
    return done(false);
  r.ws();
  if (r.i < jsonText.size() && jsonText[r.i] == '}') {
    ++r.i;
  } else {
    for (;;) {
      std::string key;
      double v = 0;
      if (!r.str(key) || !r.expect(':'))
        return done(false);
      r.ws();
      size_t at = r.i;
      if (key == kMeasuredKey) {
        if (!seen.insert(key).second) {
          r.i = at;
          r.fail("duplicate key \"" + key + "\"");
          return done(false);
        }
        if (!r.measured())
          return done(false);
      } else {
        const CalibrationKey *f = findCalibrationKey(key);
        if (!f) {
          r.i = at;
          r.fail("unknown key \"" + key + "\"");
          return done(false);
        }
        if (!r.number(v))
          return done(false);
        if (!seen.insert(key).second) {
          r.i = at;
          r.fail("duplicate key \"" + key + "\"");
          return done(false);
        }
        if (v < f->min || v > f->max) {
          r.i = at;
          r.fail("\"" + key + "\" = " + shortNumber(v) + " is outside " +
                 rangeText(*f));
          return done(false);
        }
        c.*(f->field) = v;
      }
      r.ws();
      if (r.i < jsonText.size() && jsonText[r.i] == ',') {
        ++r.i;
        continue;
      }
      if (!r.expect('}'))
        return done(false);
      break;
    }
  }
  r.ws();
  if (r.i != jsonText.size()) {
    r.fail("trailing characters after the object");
    return done(false);
  }
  return done(true);
}

} // namespace hflow::placement
