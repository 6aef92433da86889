//===- RolloutRejection.cpp - verl's rejection-sampling options ------------===//
#include "runtime/schema/RolloutRejection.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace hflow::rollout {

namespace {

const char *const kOptions[] = {"token_k1",   "token_k2",    "token_k3",    "seq_sum_k1",
                                "seq_sum_k2", "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                "seq_mean_k3", "seq_max_k2", "seq_max_k3"};

std::vector<std::string> split(const std::string &s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos)
      comma = s.size();
    std::string part = s.substr(at, comma - at);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty())
      out.push_back(part);
    at = comma + 1;
  }
  return out;
}

double number(const std::string &s, const std::string &option) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != s.size() || s.empty())
    throw std::invalid_argument("threshold '" + s +
                                "' of option " + option + " is not a number");
  if (!(v > 0))
    throw std::invalid_argument("the thresholds of option " +
                                option + " must be positive, got " + s);
  return v;
}

} // namespace

std::vector<RejectionOption> parseRejectionOptions(const std::string &options,
                                                   const std::string &thresholds) {
  const char *fn = "";
  std::vector<std::string> names;
  for (const std::string &o : split(options)) {
    if (std::find(std::begin(kOptions), std::end(kOptions), o) == std::end(kOptions))
      throw std::invalid_argument(std::string(fn) + "unknown option '" + o +
                                  "' (token_k1, token_k2, token_k3, seq_sum_k1, seq_sum_k2, "
                                  "seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3, "
                                  "seq_max_k2 or seq_max_k3)");
    if (std::find(names.begin(), names.end(), o) == names.end())
      names.push_back(o);
  }
  if (names.empty())
    throw std::invalid_argument(std::string(fn) + "no option in '" + options + "'");
  std::vector<std::string> specs = split(thresholds);
  if (specs.empty())
    throw std::invalid_argument(std::string(fn) + "no threshold given");
  if (specs.size() != 1 && specs.size() != names.size())
    throw std::invalid_argument(std::string(fn) + std::to_string(specs.size()) +
                                " thresholds for " + std::to_string(names.size()) +
                                " options: give one for all or one per option");
  std::vector<RejectionOption> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string &spec = specs[specs.size() == 1 ? 0 : i];
    RejectionOption o{names[i]};
    const size_t us = spec.find('_');
    if (names[i].size() > 2 && names[i].compare(names[i].size() - 2, 2, "k1") == 0) {
      o.upper = number(us == std::string::npos ? spec : spec.substr(us + 1), names[i]);
      o.lower = us == std::string::npos ? 1.0 / o.upper : number(spec.substr(0, us), names[i]);
      if (o.lower > o.upper)
        throw std::invalid_argument(std::string(fn) + "option " + names[i] +
                                    "'s lower bound is above its upper bound in '" + spec +
                                    "' (lower_upper)");
    } else {
      if (us != std::string::npos)
        throw std::invalid_argument(std::string(fn) + "option " + names[i] +
                                    " takes one upper bound, not '" + spec + "'");
      o.upper = number(spec, names[i]);
    }
    out.push_back(o);
  }
  return out;
}

} // namespace hflow::rollout
