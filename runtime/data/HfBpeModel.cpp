//===- HfBpeModel.cpp - the Hugging Face tokenizer: the BPE model ----------===//
//
// tokenizer.json's "model": the vocabulary and the merges, applied to one
// pre-token at a time by rank (lowest first, leftmost on ties) as the
// tokenizers library does; byte-level pre-tokens go through GPT-2's
// alphabet, others by character with byte fallback (<0xXX>) and unk.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>

namespace hflow::data::hf {

void BpeModel::load(const json &m, const TokenizerFile &f) {
  std::string type = typeOf(m);
  if (type.empty() && m.contains("merges"))
    type = "BPE"; // old files omit it
  if (type != "BPE")
    f.fail("model.type", "model type '" + (type.empty() ? std::string("?") : type) +
                             "' is not supported (hflow reads BPE tokenizers: "
                             "Qwen, Llama-2/3, Mistral)");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    f.fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  for (const char *k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      f.fail(std::string("model.") + k, "a non-empty value is not supported");
  byteFallback_ = m.value("byte_fallback", false);
  ignoreMerges_ = m.value("ignore_merges", false);
  fuseUnk_ = m.value("fuse_unk", false);
  if (!m.contains("vocab") || !m["vocab"].is_object())
    f.fail("model.vocab", "missing or not an object");
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t(1) << 31))
      f.fail("model.vocab", "token '" + it.key() + "' has no valid id");
    int64_t id = it.value().get<int64_t>();
    vocab_[it.key()] = id;
    size_ = std::max(size_, id + 1);
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab_.find(m["unk_token"].get<std::string>());
    if (it == vocab_.end())
      f.fail("model.unk_token", "'" + m["unk_token"].get<std::string>() +
                                    "' is not in the vocabulary");
    unk_ = it->second;
  }
  const json &merges = m.value("merges", json::array());
  if (!merges.is_array())
    f.fail("model.merges", "not an array");
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const json &e = merges[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      auto sp = s.find(' ', 1);
      if (sp == std::string::npos)
        f.fail("model.merges[" + std::to_string(r) + "]", "'" + s + "' is not two tokens");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else
      f.fail("model.merges[" + std::to_string(r) + "]", "not \"a b\" or [\"a\", \"b\"]");
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      f.fail("model.merges[" + std::to_string(r) + "]",
             "merge '" + a + " " + b + "' names a token not in the vocabulary");
    uint64_t key = pairKey(ia->second, ib->second);
    // The first (lowest-rank) entry for a pair wins, as in `tokenizers`.
    merges_.emplace(key, Merge{(int32_t)r, (int32_t)iab->second});
  }
  const ByteAlphabet &ab = byteAlphabet();
  byteIds_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(ab.charOf[b]);
    if (it != vocab_.end())
      byteIds_[b] = it->second;
  }
  // Byte-fallback tokens <0x00>..<0xFF>.
  if (byteFallback_)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = vocab_.find(name);
      byteToken_[b] = it == vocab_.end() ? -1 : it->second;
    }
}

int64_t BpeModel::idOf(const std::string &s) const {
  auto it = vocab_.find(s);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode(const std::string &word, bool byteLevel, std::vector<int64_t> &ids) const {
  if (word.empty())
    return;
  struct Sym {
    int64_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  if (byteLevel) {
    const ByteAlphabet &ab = byteAlphabet();
    if (ignoreMerges_) {
      std::string mapped;
      for (unsigned char c : word)
        mapped += ab.charOf[c];
      auto it = vocab_.find(mapped);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    for (unsigned char c : word) {
      int64_t id = byteIds_[c];
      if (id < 0)
        continue; // a byte the vocabulary lacks (never in real files)
      syms.push_back({id, 0, 0, true});
    }
  } else {
    if (ignoreMerges_) {
      auto it = vocab_.find(word);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    bool lastUnk = false;
    for (size_t i = 0; i < word.size();) {
      size_t len = 0;
      decodeValidUtf8(word, i, len);
      auto it = vocab_.find(word.substr(i, len));
      if (it != vocab_.end()) {
        syms.push_back({it->second, 0, 0, true});
        lastUnk = false;
      } else if (byteFallback_ && std::all_of(word.begin() + i, word.begin() + i + len,
                                              [&](char c) { return byteToken_[(unsigned char)c] >= 0; })) {
        for (size_t k = 0; k < len; ++k)
          syms.push_back({byteToken_[(unsigned char)word[i + k]], 0, 0, true});
        lastUnk = false;
      } else if (unk_ >= 0) {
        if (!(fuseUnk_ && lastUnk))
          syms.push_back({unk_, 0, 0, true});
        lastUnk = true;
      }
      i += len;
    }
  }
  int n = (int)syms.size();
  for (int i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    bool operator>(const Cand &o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto consider = [&](int pos) {
    if (pos < 0 || syms[pos].next < 0)
      return;
    auto it = merges_.find(pairKey(syms[pos].id, syms[syms[pos].next].id));
    if (it != merges_.end())
      queue.push({it->second.rank, pos});
  };
  for (int i = 0; i + 1 < n; ++i)
    consider(i);
  while (!queue.empty()) {
    Cand c = queue.top();
    queue.pop();
    Sym &l = syms[c.pos];
    if (!l.alive || l.next < 0)
      continue;
    auto it = merges_.find(pairKey(l.id, syms[l.next].id));
    if (it == merges_.end() || it->second.rank != c.rank)
      continue; // stale
    Sym &r = syms[l.next];
    l.id = it->second.id;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0)
      syms[r.next].prev = c.pos;
    consider(l.prev);
    consider(c.pos);
  }
  for (const Sym &s : syms)
    if (s.alive)
      ids.push_back(s.id);
}

} // namespace hflow::data::hf
