//===- hflow-mkdata: generates prompt datasets for the demos --------------===//
//
//   hflow-mkdata arith --seed S --count N --max-a A --max-b B [--op +]
//                [--pairs] [--chat [--system TEXT]] [--exclude other.jsonl]
//                -o out.jsonl
//
// Writes N JSONL rows {"prompt": "12+7=", "answer": "19"} with distinct
// prompts, a in [0, A] and b in [0, B], drawn deterministically from the
// seed (the same arguments always give the same file). --exclude leaves out
// every prompt of another JSONL file, so a held-out set can be kept
// disjoint from a training set. --pairs adds a preference pair to every row
// (the right answer chosen, a wrong one rejected) for training a reward
// model. --chat writes each prompt as a chat, {"prompt": [{"role": "user",
// "content": "12+7="}], ...} (after a system message with --system), for a
// tokenizer's chat template. See docs/data.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/Dataset.h"
#include "runtime/schema/OutputFiles.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unordered_set>
#include <vector>

namespace {

const char *kUsage =
    "usage: hflow-mkdata arith --seed S --count N --max-a A --max-b B\n"
    "                    [--op +|-|*] [--pairs] [--chat [--system TEXT]]\n"
    "                    [--exclude other.jsonl] -o out.jsonl\n"
    "\n"
    "Writes N JSONL rows {\"prompt\": \"12+7=\", \"answer\": \"19\"}: the sum\n"
    "(difference, product) of a in [0, A] and b in [0, B], every prompt\n"
    "distinct, drawn deterministically from the seed: the same arguments\n"
    "always write the same file.\n"
    "\n"
    "  --seed S         the seed (an unsigned 64-bit integer)\n"
    "  --count N        how many rows (at least 1)\n"
    "  --max-a A        the largest first operand (0 <= A < 10^18)\n"
    "  --max-b B        the largest second operand (0 <= B < 10^18)\n"
    "  --op OP          +, - or * (default +)\n"
    "  --pairs          add a preference pair to every row: \"chosen\" is the\n"
    "                   answer, \"rejected\" a wrong one (half of them off by\n"
    "                   1 to 10, half any other number in the answers' range);\n"
    "                   the prompts are those written without --pairs\n"
    "  --chat           write each prompt as a chat (rendered by the\n"
    "                   tokenizer's chat template): [{\"role\": \"user\",\n"
    "                   \"content\": \"12+7=\"}]; the same rows as without it\n"
    "  --system TEXT    with --chat: a system message before the user's\n"
    "  --exclude FILE   a JSONL file whose prompts (a chat's user messages)\n"
    "                   must not appear (e.g. the\n"
    "                   training set, when writing a held-out set); may be\n"
    "                   given more than once\n"
    "  -o FILE          the output file ('-' for standard output)\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0 on success, 1 when the data cannot be made or written,\n"
    "2 on bad arguments.\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

uint64_t parseUnsigned(const std::string &opt, const std::string &v,
                       uint64_t max) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError(opt + " wants a non-negative integer, not '" + v + "'");
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
  if (errno == ERANGE || x > max)
    throw UsageError(opt + " " + v + " is too large (at most " +
                     std::to_string(max) + ")");
  return x;
}

// The same unbiased draw as hflow::data::Sampler: r = rng() until
// r >= (2^64 - m) mod m, then r mod m.
uint64_t uniform(std::mt19937_64 &rng, uint64_t m) {
  uint64_t threshold = (0 - m) % m;
  uint64_t r;
  do
    r = rng();
  while (r < threshold);
  return r % m;
}

std::string text(__int128 v) {
  bool neg = v < 0;
  unsigned __int128 u = neg ? -(unsigned __int128)v : (unsigned __int128)v;
  std::string s;
  do {
    s.insert(s.begin(), char('0' + int(u % 10)));
    u /= 10;
  } while (u != 0);
  return neg ? "-" + s : s;
}

/// The arith task's options (kUsage).
struct ArithOptions {
  uint64_t seed = 0, count = 0, maxA = 0, maxB = 0;
  char op = '+';
  bool pairs = false, chat = false, haveSystem = false;
  std::string system, out;
  std::vector<std::string> excludes;
};

/// "a+b=" for the task's operation.
std::string arithPrompt(const ArithOptions &o, uint64_t a, uint64_t b) {
  return std::to_string(a) + o.op + std::to_string(b) + "=";
}

/// The options after the task's name; refuses what kUsage does not allow.
ArithOptions parseArith(const std::vector<std::string> &args) {
  ArithOptions o;
  bool haveSeed = false, haveCount = false, haveA = false, haveB = false;
  const uint64_t kMaxOperand = 999999999999999999ULL; // 18 digits
  for (size_t i = 1; i < args.size(); ++i) {
    std::string opt = args[i], val;
    bool inlineVal = false;
    if (opt.rfind("--", 0) == 0 && opt.find('=') != std::string::npos) {
      val = opt.substr(opt.find('=') + 1);
      opt = opt.substr(0, opt.find('='));
      inlineVal = true;
    }
    auto value = [&]() -> std::string {
      if (inlineVal)
        return val;
      if (i + 1 >= args.size())
        throw UsageError(opt + " needs a value");
      return args[++i];
    };
    if (opt == "--seed") {
      o.seed = parseUnsigned(opt, value(), UINT64_MAX);
      haveSeed = true;
    } else if (opt == "--count") {
      o.count = parseUnsigned(opt, value(), 100000000);
      if (o.count == 0)
        throw UsageError("--count must be at least 1");
      haveCount = true;
    } else if (opt == "--max-a") {
      o.maxA = parseUnsigned(opt, value(), kMaxOperand);
      haveA = true;
    } else if (opt == "--max-b") {
      o.maxB = parseUnsigned(opt, value(), kMaxOperand);
      haveB = true;
    } else if (opt == "--op") {
      std::string v = value();
      if (v != "+" && v != "-" && v != "*")
        throw UsageError("--op must be +, - or *, not '" + v + "'");
      o.op = v[0];
    } else if (opt == "--pairs") {
      if (inlineVal)
        throw UsageError("--pairs takes no value");
      o.pairs = true;
    } else if (opt == "--chat") {
      if (inlineVal)
        throw UsageError("--chat takes no value");
      o.chat = true;
    } else if (opt == "--system") {
      o.system = value();
      o.haveSystem = true;
    } else if (opt == "--exclude") {
      o.excludes.push_back(value());
    } else if (opt == "-o" || opt == "--output") {
      if (!o.out.empty())
        throw UsageError("-o given twice");
      o.out = value();
      if (o.out.empty())
        throw UsageError("-o needs a file name");
    } else {
      throw UsageError("unknown argument '" + args[i] + "'");
    }
  }
  std::string missing;
  if (!haveSeed) missing += " --seed";
  if (!haveCount) missing += " --count";
  if (!haveA) missing += " --max-a";
  if (!haveB) missing += " --max-b";
  if (o.out.empty()) missing += " -o";
  if (!missing.empty())
    throw UsageError("missing:" + missing);
  if (o.haveSystem && !o.chat)
    throw UsageError("--system needs --chat (a system message is part of a chat)");
  if (o.out != "-") {
    hflow::outputs::IoSet io;
    for (const std::string &ex : o.excludes)
      io.input("the --exclude file", ex);
    io.outputFile("-o", o.out);
    if (std::string clash = io.check(); !clash.empty())
      throw UsageError(clash);
  }

  return o;
}

/// The prompts of the --exclude files (a chat row's user messages).
std::unordered_set<std::string> excludedPrompts(const std::vector<std::string> &excludes) {
  std::unordered_set<std::string> excluded;
  for (const std::string &ex : excludes) {
    hflow::data::Dataset d = hflow::data::Dataset::load(ex);
    for (size_t i = 0; i < d.size(); ++i)
      if (!d[i].prompt.empty()) {
        excluded.insert(d[i].prompt);
      } else if (!d[i].messages.empty()) {
        // A chat row: its user messages are the prompts it holds.
        for (const nlohmann::json &m : nlohmann::json::parse(d[i].messages))
          if (m.at("role") == "user")
            excluded.insert(m.at("content").get<std::string>());
      }
  }

  return excluded;
}

/// `count` distinct (a, b) not excluded, drawn from the seed.
std::vector<std::pair<uint64_t, uint64_t>> pickOperands(const ArithOptions &o,
                                                        const std::unordered_set<std::string> &excluded) {
  auto prompt = [&](uint64_t a, uint64_t b) { return arithPrompt(o, a, b); };
  const uint64_t nb = o.maxB + 1;
  const unsigned __int128 space = (unsigned __int128)(o.maxA + 1) * nb;
  std::mt19937_64 rng(hflow::data::splitmix64(o.seed));
  std::vector<std::pair<uint64_t, uint64_t>> picked;
  picked.reserve(o.count);

  if (space <= 4000000) {
    // Small space: list the allowed pairs, then a partial Fisher-Yates.
    std::vector<uint64_t> pool;
    for (uint64_t k = 0; k < (uint64_t)space; ++k)
      if (!excluded.count(prompt(k / nb, k % nb)))
        pool.push_back(k);
    if (pool.size() < o.count)
      throw std::runtime_error(
          "only " + std::to_string(pool.size()) + " distinct prompts exist for "
          "a in [0, " + std::to_string(o.maxA) + "], b in [0, " +
          std::to_string(o.maxB) + "]" + (excluded.empty() ? "" : " outside the "
          "--exclude files") + "; --count " + std::to_string(o.count) +
          " asks for more");
    for (uint64_t i = 0; i < o.count; ++i) {
      uint64_t j = i + uniform(rng, pool.size() - i);
      std::swap(pool[i], pool[j]);
      picked.emplace_back(pool[i] / nb, pool[i] % nb);
    }
  } else {
    // Large space: draw pairs, skipping repeats and excluded prompts.
    if ((unsigned __int128)o.count + excluded.size() > space / 2)
      throw std::runtime_error("--count " + std::to_string(o.count) +
                               " is too close to the number of prompts");
    std::unordered_set<std::string> seen;
    while (picked.size() < o.count) {
      uint64_t a = uniform(rng, o.maxA + 1), b = uniform(rng, nb);
      std::string p = prompt(a, b);
      if (excluded.count(p) || !seen.insert(p).second)
        continue;
      picked.emplace_back(a, b);
    }
  }

  return picked;
}

/// The JSONL rows of `picked` (with their rejected answers for --pairs).
std::string arithRows(const ArithOptions &o,
                      const std::vector<std::pair<uint64_t, uint64_t>> &picked) {
  std::mt19937_64 wrong(hflow::data::splitmix64(o.seed ^ 0x7061697273ULL)); // "pairs"
  std::string body;
  for (auto [a, b] : picked) {
    __int128 r = o.op == '+'   ? (__int128)a + b
                 : o.op == '-' ? (__int128)a - (__int128)b
                             : (__int128)a * b;
    if (o.chat)
      body += "{\"prompt\": [" +
              (o.haveSystem ? "{\"role\": \"system\", \"content\": " +
                                nlohmann::json(o.system).dump() + "}, "
                          : std::string()) +
              "{\"role\": \"user\", \"content\": \"" + arithPrompt(o, a, b) + "\"}], \"answer\": \"" +
              text(r) + "\"";
    else
      body += "{\"prompt\": \"" + arithPrompt(o, a, b) + "\", \"answer\": \"" + text(r) + "\"";
    if (o.pairs) {
      // A wrong answer from a stream of its own (the prompts stay those
      // written without --o.pairs): off by 1 to 10, or any other number of
      // the answers' range.
      const __int128 lo = o.op == '-' ? -(__int128)o.maxB : 0;
      const __int128 hi = o.op == '+'   ? (__int128)o.maxA + o.maxB
                          : o.op == '-' ? (__int128)o.maxA
                                      : (__int128)o.maxA * o.maxB;
      __int128 w = r;
      while (w == r) {
        if (uniform(wrong, 2) == 0) {
          const __int128 d = 1 + (__int128)uniform(wrong, 10);
          w = uniform(wrong, 2) == 0 ? r - d : r + d;
        } else if (hi > lo) {
          w = lo + (__int128)uniform(wrong, (uint64_t)std::min<__int128>(hi - lo + 1, (__int128)UINT64_MAX));
        } else {
          w = r + 1;
        }
        if (o.op != '-' && w < 0)
          w = r;
      }
      body += ", \"chosen\": \"" + text(r) + "\", \"rejected\": \"" + text(w) + "\"";
    }
    body += "}\n";
  }
  return body;
}

int run(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string &a : args)
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    }
  if (args.empty())
    throw UsageError("no task given (the one task is 'arith')");
  if (args[0] != "arith")
    throw UsageError("unknown task '" + args[0] + "' (the one task is 'arith')");

  const ArithOptions o = parseArith(args);
  const std::unordered_set<std::string> excluded = excludedPrompts(o.excludes);
  const std::string body = arithRows(o, pickOperands(o, excluded));
  if (o.out == "-") {
    std::cout << body << std::flush;
    if (!std::cout)
      throw std::runtime_error("cannot write to standard output: " +
                               hflow::outputs::systemReason(errno));
    return 0;
  }
  if (std::string err = hflow::outputs::writeWholeFile(o.out, body); !err.empty())
    throw std::runtime_error(err);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  hflow::outputs::ignoreFileSizeSignal();
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc &) {
    std::cerr << "hflow-mkdata: error: ran out of memory (the allocator refused a request)\n";
    return 1;
  } catch (const UsageError &e) {
    std::cerr << "hflow-mkdata: error: " << e.what() << "\n"
              << "Run 'hflow-mkdata --help' for the usage.\n";
    return 2;
  } catch (const std::exception &e) {
    std::cerr << "hflow-mkdata: error: " << e.what() << "\n";
    return 1;
  }
}
