//===- Dataset.cpp - JSONL datasets, the epoch sampler, DP sharding -------===//
#include "runtime/data/Dataset.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <sys/stat.h>

namespace hflow {
namespace data {

using json = nlohmann::json;

namespace {

std::string readFile(const std::string &path) {
  auto fail = [&](int err) {
    return std::runtime_error("cannot open data file '" + path +
                              "': " + std::strerror(err));
  };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw fail(errno);
  if (S_ISDIR(st.st_mode))
    throw fail(EISDIR);
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw fail(errno);
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
    data.append(buf, n);
  int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err)
    throw std::runtime_error("cannot read data file '" + path +
                             "': " + std::strerror(err));
  return data;
}

bool blank(const std::string &s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\v' && c != '\f')
      return false;
  return true;
}

// nlohmann's messages start "[json.exception.parse_error.101] parse error at
// line 1, column 7: ..."; the line is always 1 here (one row at a time).
std::string parseMessage(const std::string &what) {
  std::string m = what;
  if (!m.empty() && m[0] == '[') {
    size_t close = m.find("] ");
    if (close != std::string::npos)
      m = m.substr(close + 2);
  }
  const std::string lead = "parse error at line 1, column ";
  if (m.compare(0, lead.size(), lead) == 0)
    m = "at column " + m.substr(lead.size());
  for (char &c : m)
    if (c == '\n' || c == '\r')
      c = ' ';
  return m;
}

/// The value at a dotted path ("a.b.c") of `row`, or null when absent. A
/// key that itself contains dots is found whole first.
const json *lookup(const json &row, const std::string &path) {
  auto it = row.find(path);
  if (it != row.end())
    return &*it;
  const json *cur = &row;
  size_t b = 0;
  while (true) {
    size_t dot = path.find('.', b);
    std::string key = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    if (!cur->is_object())
      return nullptr;
    auto f = cur->find(key);
    if (f == cur->end())
      return nullptr;
    cur = &*f;
    if (dot == std::string::npos)
      return cur;
    b = dot + 1;
  }
}

} // namespace

Dataset Dataset::load(const std::string &path, const DatasetOptions &opts) {
  std::string text = readFile(path);
  Dataset ds;
  ds.path_ = path;
  size_t lineNo = 0, pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineNo;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (blank(line))
      continue;
    std::string where = path + ":" + std::to_string(lineNo) + ": ";
    auto fail = [&](const std::string &msg) {
      return std::runtime_error(where + msg);
    };
    json row;
    try {
      row = json::parse(line);
    } catch (const json::exception &e) { // parse errors and number overflow (out_of_range)
      throw fail("not valid JSON: " + parseMessage(e.what()));
    }
    if (!row.is_object())
      throw fail(std::string("not a JSON object (got ") + row.type_name() + ")");

    Example ex;
    ex.index = static_cast<int64_t>(ds.examples_.size());
    const json *p = lookup(row, opts.promptField);
    if (!p)
      throw fail("no field '" + opts.promptField + "'");
    if (p->is_array() && !p->empty() && (*p)[0].is_object()) {
      // A chat: every message an object with a string role and content.
      for (size_t i = 0; i < p->size(); ++i) {
        const json &m = (*p)[i];
        std::string at = "field '" + opts.promptField + "': message " + std::to_string(i);
        if (!m.is_object())
          throw fail(at + " is not an object (got " + m.type_name() + ")");
        if (!m.contains("role") || !m["role"].is_string() || m["role"].get<std::string>().empty())
          throw fail(at + " needs a non-empty string 'role'");
        if (!m.contains("content") || !m["content"].is_string())
          throw fail(at + " needs a string 'content'" +
                     (m.contains("content") ? std::string(" (got ") + m["content"].type_name() + ")"
                                            : std::string()));
      }
      ex.messages = p->dump();
    } else if (p->is_string()) {
      ex.prompt = p->get<std::string>();
      if (ex.prompt.empty())
        throw fail("field '" + opts.promptField + "' is empty");
    } else if (p->is_array()) {
      if (p->empty())
        throw fail("field '" + opts.promptField + "' is empty");
      ex.promptIds.reserve(p->size());
      for (size_t i = 0; i < p->size(); ++i) {
        const json &v = (*p)[i];
        bool ok = v.is_number_unsigned() ||
                  (v.is_number_integer() && v.get<int64_t>() >= 0);
        if (ok && v.is_number_unsigned() &&
            v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
          ok = false;
        if (!ok)
          throw fail("field '" + opts.promptField + "': element " +
                     std::to_string(i) +
                     " is not a non-negative integer token id (got " +
                     v.dump() + ")");
        ex.promptIds.push_back(v.get<int64_t>());
      }
    } else {
      throw fail("field '" + opts.promptField +
                 "' must be a string, an array of integers or an array of messages (got " +
                 p->type_name() + ")");
    }

    const json *a = lookup(row, opts.answerField);
    if (a && !a->is_null()) {
      if (a->is_string())
        ex.answer = a->get<std::string>();
      else if (a->is_number())
        ex.answer = a->dump();
      else
        throw fail("field '" + opts.answerField +
                   "' must be a string or a number (got " + a->type_name() + ")");
    }
    auto c = row.find(opts.chosenField), r = row.find(opts.rejectedField);
    if ((c != row.end()) != (r != row.end()))
      throw fail("field '" + (c == row.end() ? opts.chosenField : opts.rejectedField) +
                 "' is missing: a preference pair needs both '" + opts.chosenField +
                 "' and '" + opts.rejectedField + "'");
    if (c != row.end()) {
      for (auto *f : {&*c, &*r})
        if (!f->is_string() || f->get<std::string>().empty())
          throw fail("field '" + (f == &*c ? opts.chosenField : opts.rejectedField) +
                     "' must be a non-empty string (got " + f->dump() + ")");
      ex.chosen = c->get<std::string>();
      ex.rejected = r->get<std::string>();
      ex.hasPair = true;
    }
    ex.line = (int64_t)lineNo;
    ds.examples_.push_back(std::move(ex));
  }
  if (ds.examples_.empty())
    throw std::runtime_error(path + ": no examples");
  return ds;
}

const Example &Dataset::operator[](size_t i) const {
  if (i >= examples_.size())
    throw std::out_of_range("dataset '" + path_ + "': row " + std::to_string(i) +
                            " is past the end (" +
                            std::to_string(examples_.size()) + " rows)");
  return examples_[i];
}

// --- the sampler -------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

Sampler::Sampler(size_t datasetSize, uint64_t seed, bool shuffle)
    : size_(datasetSize), seed_(seed), shuffle_(shuffle) {
  if (datasetSize == 0)
    throw std::runtime_error("sampler: the dataset is empty");
}

std::vector<int64_t> Sampler::epochOrder(uint64_t e) const {
  std::vector<int64_t> order(size_);
  for (size_t i = 0; i < size_; ++i)
    order[i] = static_cast<int64_t>(i);
  if (!shuffle_)
    return order;
  std::mt19937_64 rng(splitmix64(splitmix64(seed_) + e));
  for (size_t i = size_ - 1; i >= 1; --i) {
    uint64_t m = static_cast<uint64_t>(i) + 1;
    uint64_t threshold = (0 - m) % m; // (2^64 - m) mod m
    uint64_t r;
    do
      r = rng();
    while (r < threshold);
    std::swap(order[i], order[r % m]);
  }
  return order;
}

std::vector<int64_t> Sampler::next(size_t batch) {
  std::vector<int64_t> out;
  out.reserve(batch);
  while (out.size() < batch) {
    uint64_t e = position_ / size_;
    size_t offset = static_cast<size_t>(position_ % size_);
    if (!cachedValid_ || cachedEpoch_ != e) {
      cached_ = epochOrder(e);
      cachedEpoch_ = e;
      cachedValid_ = true;
    }
    size_t take = std::min(batch - out.size(), size_ - offset);
    out.insert(out.end(), cached_.begin() + offset,
               cached_.begin() + offset + take);
    position_ += take;
  }
  return out;
}

std::pair<size_t, size_t> shardRows(size_t batch, int dp, int index) {
  if (dp < 1)
    throw std::runtime_error("shardRows: the data-parallel size must be at "
                             "least 1 (got " + std::to_string(dp) + ")");
  if (index < 0 || index >= dp)
    throw std::runtime_error("shardRows: DP index " + std::to_string(index) +
                             " is outside [0, " + std::to_string(dp) + ")");
  if (batch % static_cast<size_t>(dp) != 0)
    throw std::runtime_error("shardRows: a global batch of " +
                             std::to_string(batch) + " rows does not divide "
                             "across " + std::to_string(dp) + " DP ranks");
  size_t per = batch / static_cast<size_t>(dp);
  return {per * static_cast<size_t>(index), per * (static_cast<size_t>(index) + 1)};
}

} // namespace data
} // namespace hflow
