//===- Degrees.cpp - a parallel layout's printed form ----------------------===//

#include "runtime/schema/Degrees.h"

namespace hflow::layout {

std::string Degrees::str() const {
  std::string out;
  auto add = [&](const char *name, int64_t v) {
    if (v <= 1)
      return;
    if (!out.empty())
      out += " * ";
    out += std::string(name) + "(" + std::to_string(v) + ")";
  };
  add("fsdp", fsdp);
  add("tp", tp);
  add("pp", pp);
  add("sp", sp);
  add("cp", cp);
  add("ep", fold ? tp : ep);
  if (fold)
    out += " * etp(1)";
  add("dp", ep > 1 ? dp / ep : dp);
  return out.empty() ? "dp(1)" : out;
}

} // namespace hflow::layout
