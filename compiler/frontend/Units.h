//===- Units.h - quantities with units in hflow programs -------------------===//
//
// `80GB`, `2TB/s`, `200Gbps`, `312TFLOPS`: a number and a unit, converted to
// base units (bytes, bytes per second, FLOP per second). Decimal prefixes
// (K, M, G, T, P = 1e3..1e15) and binary ones (Ki, Mi, Gi, Ti = 2^10..2^40);
// bits (`b`, `bps`) are divided by 8.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_UNITS_H
#define HFLOW_COMPILER_FRONTEND_UNITS_H

#include <optional>
#include <string>

namespace hflow::units {

enum class Kind { Bytes, Bandwidth, Flops };

inline const char *kindName(Kind k) {
  switch (k) {
  case Kind::Bytes: return "a size (e.g. 80GB)";
  case Kind::Bandwidth: return "a bandwidth (e.g. 2TB/s or 200Gbps)";
  case Kind::Flops: return "a compute rate (e.g. 312TFLOPS)";
  }
  return "?";
}

struct Unit {
  Kind kind;
  double factor; // multiply the number by this to get base units
};

/// The meaning of a unit suffix, or nothing if it is not one.
inline std::optional<Unit> parseUnit(const std::string &unit) {
  std::string u = unit;
  double prefix = 1;
  struct P {
    const char *text;
    double value;
  } prefixes[] = {{"Ki", 1024.0},
                  {"Mi", 1024.0 * 1024},
                  {"Gi", 1024.0 * 1024 * 1024},
                  {"Ti", 1024.0 * 1024 * 1024 * 1024},
                  {"K", 1e3},
                  {"M", 1e6},
                  {"G", 1e9},
                  {"T", 1e12},
                  {"P", 1e15}};
  for (const P &p : prefixes) {
    std::string t = p.text;
    if (u.size() > t.size() && u.compare(0, t.size(), t) == 0) {
      prefix = p.value;
      u = u.substr(t.size());
      break;
    }
  }
  if (u == "B")
    return Unit{Kind::Bytes, prefix};
  if (u == "B/s")
    return Unit{Kind::Bandwidth, prefix};
  if (u == "bps" || u == "b/s")
    return Unit{Kind::Bandwidth, prefix / 8};
  if (u == "FLOPS")
    return Unit{Kind::Flops, prefix};
  return std::nullopt;
}

} // namespace hflow::units

#endif // HFLOW_COMPILER_FRONTEND_UNITS_H
