//===- HfTokenizerEncode.cpp - the Hugging Face tokenizer: added tokens, normalizers, pre-tokenizers, BPE ---===//
#include "runtime/data/HfTokenizerDetail.h"

#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace hflow::data::hf {

std::vector<int64_t> HfTokenizer::encode(const std::string &raw) const {
  // Rust strings are valid UTF-8: invalid bytes become U+FFFD, as a
  // lossy conversion would give.
  std::string text = isValidUtf8(raw) ? raw : lossyUtf8(raw);
  std::vector<int64_t> ids;
  std::vector<Segment> segs = splitAdded(text, false);
  for (auto &seg : segs) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string norm = normalize(seg.text);
    for (auto &s2 : splitAdded(norm, true)) {
      if (s2.id >= 0) {
        ids.push_back(s2.id);
        continue;
      }
      for (const std::string &word : preTokenize(s2.text))
        bpe(word, ids);
    }
  }
  return ids;
}

int64_t HfTokenizer::idOfToken(const std::string &s) const {
  for (const auto &t : added_)
    if (t.content == s)
      return t.id;
  auto it = vocab_.find(s);
  return it == vocab_.end() ? -1 : it->second;
}

std::vector<Segment> HfTokenizer::splitAdded(const std::string &text, bool normalizedTokens) const {
  const auto &table = normalizedTokens ? addedNorm_ : addedRaw_;
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

std::string HfTokenizer::normalize(std::string s) const {
  for (const auto &x : normalizers_) {
    switch (x.kind) {
    case Normalizer::Prepend:
      if (!s.empty())
        s = x.a + s;
      break;
    case Normalizer::Replace:
      replaceAll(s, x.a, x.b);
      break;
    default: {
      int opts = UTF8PROC_STABLE;
      if (x.kind == Normalizer::NFC || x.kind == Normalizer::NFKC)
        opts |= UTF8PROC_COMPOSE;
      else
        opts |= UTF8PROC_DECOMPOSE;
      if (x.kind == Normalizer::NFKC || x.kind == Normalizer::NFKD)
        opts |= UTF8PROC_COMPAT;
      if (s.empty())
        break;
      utf8proc_uint8_t *dst = nullptr;
      utf8proc_ssize_t len =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                       (utf8proc_ssize_t)s.size(), &dst, (utf8proc_option_t)opts);
      if (len < 0)
        throw std::runtime_error(std::string("tokenizer '") + path_ +
                                 "': Unicode normalization failed: " +
                                 utf8proc_errmsg(len));
      s.assign(reinterpret_cast<const char *>(dst), (size_t)len);
      std::free(dst);
    }
    }
  }
  return s;
}

void HfTokenizer::splitWith(const PreTokenizer &p, const std::string &s, Pieces &out) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (p.regex)
    p.regex->findAll(s, [&](size_t b, size_t e) { matches.emplace_back(b, e); });
  else
    for (size_t i = s.find(p.literal); i != std::string::npos;
         i = s.find(p.literal, i + p.literal.size()))
      matches.emplace_back(i, i + p.literal.size());
  auto emit = [&](size_t b, size_t e) {
    if (e > b)
      out.push_back(s.substr(b, e - b));
  };
  size_t last = 0;
  switch (p.behavior) {
  case PreTokenizer::Isolated:
  case PreTokenizer::Removed:
    for (auto [b, e] : matches) {
      emit(last, b);
      if (p.behavior == PreTokenizer::Isolated)
        emit(b, e);
      last = e;
    }
    emit(last, s.size());
    break;
  case PreTokenizer::MergedWithPrevious:
    for (auto [b, e] : matches) {
      emit(last, e);
      last = e;
    }
    emit(last, s.size());
    break;
  case PreTokenizer::MergedWithNext:
    for (auto [b, e] : matches) {
      emit(last, b);
      last = b;
    }
    emit(last, s.size());
    break;
  }
}

Pieces HfTokenizer::preTokenize(const std::string &text) const {
  Pieces pieces{text};
  if (text.empty())
    return {};
  for (const auto &p : preTokenizers_) {
    Pieces next;
    for (std::string &piece : pieces) {
      if (p.kind == PreTokenizer::Split) {
        splitWith(p, piece, next);
        continue;
      }
      // ByteLevel: the prefix space, the GPT-2 split, then bytes -> chars
      // (done in bpe(): the pieces stay raw bytes).
      if (p.addPrefixSpace && piece[0] != ' ')
        piece = " " + piece;
      if (p.useRegex)
        splitWith(p, piece, next);
      else
        next.push_back(std::move(piece));
    }
    pieces.swap(next);
  }
  return pieces;
}

void HfTokenizer::bpe(const std::string &word, std::vector<int64_t> &ids) const {
  if (word.empty())
    return;
  struct Sym {
    int64_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  if (byteLevel_) {
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
      int64_t id = byteIds()[c];
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
