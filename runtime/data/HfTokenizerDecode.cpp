//===- HfTokenizerDecode.cpp - the Hugging Face tokenizer: the decoder chain ---===//
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

std::string HfTokenizer::decode(const std::vector<int64_t> &ids) const {
  return decodeImpl(ids, true);
}

std::string HfTokenizer::decodeKeepSpecial(const std::vector<int64_t> &ids) const {
  return decodeImpl(ids, false);
}

std::string HfTokenizer::tokenText(int64_t id) const {
  if (id < 0 || id >= (int64_t)tokenOf_.size())
    return "";
  return tokenOf_[id];
}

std::string HfTokenizer::specialTokenText(const std::string &which) const {
  auto it = specialText_.find(which);
  return it == specialText_.end() ? "" : it->second;
}

std::string HfTokenizer::decodeImpl(const std::vector<int64_t> &ids, bool skipSpecial) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= (int64_t)tokenOf_.size() || !hasToken_[id])
      continue;
    if (skipSpecial && isSpecial_[id])
      continue;
    toks.push_back(tokenOf_[id]);
  }
  for (const auto &d : decoders_) {
    switch (d.kind) {
    case DecoderStep::ByteLevel: {
      // Every token's chars back to bytes; one lossy UTF-8 string.
      const ByteAlphabet &ab = byteAlphabet();
      std::string bytes;
      // A token with a char outside the alphabet keeps its own bytes.
      for (const std::string &t : toks) {
        std::string mapped;
        bool all = true;
        for (size_t i = 0; i < t.size() && all;) {
          size_t len = 0;
          auto it = ab.byteOf.find(decodeValidUtf8(t, i, len));
          if (it == ab.byteOf.end())
            all = false;
          else
            mapped += char(it->second);
          i += len;
        }
        bytes += all ? mapped : t;
      }
      toks = {lossyUtf8(bytes)};
      break;
    }
    case DecoderStep::Replace:
      for (auto &t : toks)
        replaceAll(t, d.a, d.b);
      break;
    case DecoderStep::ByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      size_t pendingCount = 0;
      auto flush = [&] {
        if (!pendingCount)
          return;
        if (isValidUtf8(pending))
          out.push_back(pending);
        else
          for (size_t k = 0; k < pendingCount; ++k)
            out.push_back(kReplacement);
        pending.clear();
        pendingCount = 0;
      };
      for (auto &t : toks) {
        unsigned v = 0;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
            std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4])) {
          v = std::stoul(t.substr(3, 2), nullptr, 16);
          pending += char(v);
          ++pendingCount;
        } else {
          flush();
          out.push_back(t);
        }
      }
      flush();
      toks.swap(out);
      break;
    }
    case DecoderStep::Fuse: {
      std::string all;
      for (auto &t : toks)
        all += t;
      toks = {all};
      break;
    }
    case DecoderStep::Strip:
      for (auto &t : toks) {
        for (int k = 0; k < d.start && t.compare(0, d.a.size(), d.a) == 0; ++k)
          t.erase(0, d.a.size());
        for (int k = 0; k < d.stop && t.size() >= d.a.size() &&
                        t.compare(t.size() - d.a.size(), d.a.size(), d.a) == 0;
             ++k)
          t.erase(t.size() - d.a.size());
      }
      break;
    }
  }
  std::string out;
  for (auto &t : toks)
    out += t;
  return out;
}

} // namespace hflow::data::hf
