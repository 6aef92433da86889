//===- HfTokenizer.cpp - Hugging Face tokenizer.json (BPE) ----------------===//
//
// A tokenizer read from a Hugging Face `tokenizer.json` with the BPE model:
// byte-level BPE (GPT-2 style: Qwen2/2.5/3, Llama-3, Mistral-Nemo) and
// SentencePiece-style BPE with byte fallback (Llama-2, Mistral v0.1). The
// pipeline is the one the `tokenizers` library runs:
//
//   added tokens split out of the raw text (leftmost-longest)
//   -> normalizer (NFC/NFD/NFKC/NFKD via utf8proc, Prepend, Replace)
//   -> pre-tokenizers (Split with a PCRE2 regex, ByteLevel)
//   -> BPE merges by rank (lowest first, leftmost on ties)
//
// and decoding runs the decoder chain (ByteLevel, or Replace/ByteFallback/
// Fuse/Strip) with invalid UTF-8 replaced the way Rust's
// String::from_utf8_lossy does. Any component or option outside this set is
// refused at load with the JSON path named. tokenizer_config.json and
// generation_config.json next to the file give BOS/EOS/PAD, add_bos_token,
// every stop id and the chat template. See docs/data.md. The stages are in
// files of their own (HfTokenizerDetail.h); this one holds what they share.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

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

namespace hflow::data {

namespace hf {

const char kReplacement[] = "\xEF\xBF\xBD"; // U+FFFD

std::string encodeCp(int32_t cp) {
  std::string s;
  appendUtf8(s, (uint32_t)cp);
  return s;
}

bool isWhiteSpace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

void replaceAll(std::string &s, const std::string &from, const std::string &to) {
  if (from.empty())
    return;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string::npos) {
      out.append(s, i, std::string::npos);
      break;
    }
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
  }
  s.swap(out);
}

std::string readFile(const std::string &path, const std::string &what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(EISDIR));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + what + " '" + path + "': " +
                             std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json parseJsonFile(const std::string &path, const std::string &what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      (uintmax_t)st.st_size > kMaxTokenizerFileBytes)
    throw std::runtime_error(what + " '" + path + "' has " + std::to_string(st.st_size) +
                             " bytes, more than the " +
                             std::to_string(kMaxTokenizerFileBytes >> 20) +
                             " MiB hflow reads (the limit)");
  std::string text = readFile(path, what);
  struct TooDeep {};
  try {
    return json::parse(text, [](int depth, json::parse_event_t, json &) {
      if (depth > kMaxJsonDepth)
        throw TooDeep{};
      return true;
    });
  } catch (const TooDeep &) {
    throw std::runtime_error(what + " '" + path + "' nests deeper than " +
                             std::to_string(kMaxJsonDepth) + " levels (the limit)");
  } catch (const json::exception &e) { // parse errors and number overflow (out_of_range)
    std::string m = e.what();
    auto p = m.find("] ");
    throw std::runtime_error(what + " '" + path + "' is not valid JSON: " +
                             (p == std::string::npos ? m : m.substr(p + 2)));
  }
}

bool fileExists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirOf(const std::string &path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

const ByteAlphabet &byteAlphabet() {
  static const ByteAlphabet a;
  return a;
}

const char *kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

} // namespace hf

using hf::HfTokenizer;
using hf::kReplacement;

std::unique_ptr<Tokenizer> makeHfTokenizer(const std::string &tokenizerJson) {
  return std::make_unique<HfTokenizer>(tokenizerJson);
}

// --- streaming decode ---------------------------------------------------------

std::string StreamDecoder::push(int64_t id) {
  pending_.push_back(id);
  std::vector<int64_t> all = context_;
  all.insert(all.end(), pending_.begin(), pending_.end());
  std::string before = tok_.decode(context_);
  std::string after = tok_.decode(all);
  // Wait while the text ends in an incomplete character (decoded as
  // U+FFFD) or has not grown.
  if (after.size() <= before.size() || after.compare(0, before.size(), before) != 0 ||
      (after.size() >= 3 && after.compare(after.size() - 3, 3, kReplacement) == 0))
    return "";
  context_ = pending_;
  pending_.clear();
  return after.substr(before.size());
}

std::string StreamDecoder::finish() {
  if (pending_.empty())
    return "";
  std::vector<int64_t> all = context_;
  all.insert(all.end(), pending_.begin(), pending_.end());
  std::string before = tok_.decode(context_);
  std::string after = tok_.decode(all);
  pending_.clear();
  context_.clear();
  return after.compare(0, before.size(), before) == 0 ? after.substr(before.size()) : after;
}

} // namespace hflow::data
