//===- HfDecoder.cpp - the Hugging Face tokenizer: the decoder chain -------===//
//
// tokenizer.json's "decoder": ByteLevel (GPT-2's alphabet back to bytes, one
// lossy UTF-8 string), Replace, ByteFallback (<0xXX> runs back to bytes),
// Fuse and Strip, in a Sequence or alone.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <cctype>

namespace hflow::data::hf {

void DecoderChain::load(const json &d, const std::string &where, const TokenizerFile &f) {
  if (d.is_null())
    return;
  std::string type = typeOf(d);
  if (type == "Sequence") {
    const json &list = d.value("decoders", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      load(list[k], where + ".decoders[" + std::to_string(k) + "]", f);
    return;
  }
  Step x{Step::ByteLevel};
  if (type == "ByteLevel")
    x.kind = Step::ByteLevel;
  else if (type == "ByteFallback")
    x.kind = Step::ByteFallback;
  else if (type == "Fuse")
    x.kind = Step::Fuse;
  else if (type == "Replace") {
    x.kind = Step::Replace;
    const json &p = d.value("pattern", json::object());
    if (!p.contains("String") || !p["String"].is_string())
      f.fail(where + ".pattern", "only a String pattern is supported for Replace");
    x.a = p["String"].get<std::string>();
    x.b = d.value("content", std::string());
  } else if (type == "Strip") {
    x.kind = Step::Strip;
    x.a = d.value("content", std::string(" "));
    x.start = d.value("start", 0);
    x.stop = d.value("stop", 0);
    size_t len = 0;
    if (x.a.empty() || decodeValidUtf8(x.a, 0, len), len != x.a.size())
      f.fail(where + ".content", "must be one character");
  } else
    f.fail(where, "decoder '" + type + "' is not supported (supported: ByteLevel, "
                "Replace, ByteFallback, Fuse, Strip, Sequence)");
  steps_.push_back(x);
}

std::string DecoderChain::apply(std::vector<std::string> toks) const {
  for (const auto &d : steps_) {
    switch (d.kind) {
    case Step::ByteLevel: {
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
    case Step::Replace:
      for (auto &t : toks)
        replaceAll(t, d.a, d.b);
      break;
    case Step::ByteFallback: {
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
    case Step::Fuse: {
      std::string all;
      for (auto &t : toks)
        all += t;
      toks = {all};
      break;
    }
    case Step::Strip:
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
