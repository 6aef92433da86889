//===- HfAddedTokens.cpp - the Hugging Face tokenizer: added tokens --------===//
//
// tokenizer.json's "added_tokens": split out of the raw text before the
// normalizer (and those marked `normalized` out of its output), leftmost-
// longest, with lstrip/rstrip taking the whitespace beside them.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace hflow::data::hf {

void AddedTokens::load(const json &a, const TokenizerFile &f) {
  if (!a.is_array())
    f.fail("added_tokens", "not an array");
  for (size_t k = 0; k < a.size(); ++k) {
    const json &e = a[k];
    std::string where = "added_tokens[" + std::to_string(k) + "]";
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
        !e.contains("content") || !e["content"].is_string())
      f.fail(where, "needs an integer 'id' and a string 'content'");
    AddedToken t;
    t.id = e["id"].get<int64_t>();
    t.content = e["content"].get<std::string>();
    if (t.id < 0 || t.id >= (int64_t(1) << 31) || t.content.empty())
      f.fail(where, "bad id or empty content");
    t.special = e.value("special", false);
    t.normalized = e.value("normalized", !t.special);
    t.lstrip = e.value("lstrip", false);
    t.rstrip = e.value("rstrip", false);
    if (e.value("single_word", false))
      f.fail(where, "'single_word' added tokens are not supported");
    added_.push_back(t);
  }
  // Longest first, so the first hit at a position is the longest.
  for (const auto &t : added_) {
    auto &bucket = (t.normalized ? norm_ : raw_)[(unsigned char)t.content[0]];
    bucket.push_back(&t - added_.data());
  }
  for (auto *table : {&raw_, &norm_})
    for (auto &bucket : *table)
      std::stable_sort(bucket.begin(), bucket.end(), [&](size_t x, size_t y) {
        return added_[x].content.size() > added_[y].content.size();
      });
}

int64_t AddedTokens::idOf(const std::string &s) const {
  for (const auto &t : added_)
    if (t.content == s)
      return t.id;
  return -1;
}

std::vector<Segment> AddedTokens::split(const std::string &text, bool normalizedTokens) const {
  const auto &table = normalizedTokens ? norm_ : raw_;
  std::vector<Segment> out;
  size_t start = 0, i = 0, n = text.size();
  while (i < n) {
    const auto &bucket = table[(unsigned char)text[i]];
    const AddedToken *hit = nullptr;
    for (size_t k : bucket) {
      const AddedToken &t = added_[k];
      if (t.content.size() <= n - i && text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > start) {
        size_t p = b - 1;
        while (p > start && (text[p] & 0xC0) == 0x80)
          --p;
        size_t len = 0;
        if (!isWhiteSpace(decodeValidUtf8(text, p, len)))
          break;
        b = p;
      }
    if (hit->rstrip)
      while (e < n) {
        size_t len = 0;
        if (!isWhiteSpace(decodeValidUtf8(text, e, len)))
          break;
        e += len;
      }
    if (b > start)
      out.push_back({text.substr(start, b - start), -1});
    out.push_back({"", hit->id});
    start = i = e;
  }
  if (start < n)
    out.push_back({text.substr(start), -1});
  return out;
}

} // namespace hflow::data::hf
