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
// every stop id and the chat template. See docs/data.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/Tokenizer.h"
#include "runtime/data/Utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>
#include <unordered_map>

namespace hflow {
namespace data {
namespace {

using json = nlohmann::json;

// --- UTF-8: runtime/data/Utf8.h ------------------------------------------

const char kReplacement[] = "\xEF\xBF\xBD"; // U+FFFD

std::string encodeCp(int32_t cp) {
  std::string s;
  appendUtf8(s, (uint32_t)cp);
  return s;
}

/// Rust's char::is_whitespace (the White_Space property).
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

// --- files ------------------------------------------------------------------

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

/// How deep a tokenizer file's JSON may nest: real files nest under 10
/// levels; hflow builds normalizers and pre-tokenizers from it recursively.
constexpr int kMaxJsonDepth = 64;
/// The largest tokenizer file hflow reads (real ones are under 20 MB).
constexpr uintmax_t kMaxTokenizerFileBytes = uintmax_t(512) << 20;

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

// --- PCRE2 ------------------------------------------------------------------

class Regex {
public:
  Regex(const std::string &pattern, const std::string &where) : where_(where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      throw std::runtime_error(where + ": the regex does not compile at offset " +
                               std::to_string(off) + ": " +
                               reinterpret_cast<const char *>(buf));
    }
    // JIT when the library has it; the interpreter gives the same matches.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  Regex(const Regex &) = delete;
  Regex &operator=(const Regex &) = delete;
  ~Regex() { pcre2_code_free(code_); }

  /// Every non-overlapping match [begin, end) of `s` (valid UTF-8), left to
  /// right; after an empty match the search resumes one character on.
  void findAll(const std::string &s,
               const std::function<void(size_t, size_t)> &onMatch) const {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (!md)
      throw std::bad_alloc();
    const auto *subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0, n = s.size();
    while (pos <= n) {
      int rc = pcre2_match(code_, subj, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH)
        break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof buf);
        // PCRE2's match limit (10,000,000 backtracking steps by default)
        // bounds a pattern that would backtrack without end.
        throw std::runtime_error(where_ + ": the regex failed on a text of " +
                                 std::to_string(n) + " bytes: " +
                                 reinterpret_cast<const char *>(buf));
      }
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      onMatch(b, e);
      if (e > b)
        pos = e;
      else {
        if (e >= n)
          break;
        size_t len = 1;
        decodeValidUtf8(s, e, len);
        pos = e + len;
      }
    }
    pcre2_match_data_free(md);
  }

private:
  std::string where_;
  pcre2_code *code_ = nullptr;
};

// --- the byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------

struct ByteAlphabet {
  std::string charOf[256];                  ///< byte -> its UTF-8 char
  std::unordered_map<int32_t, int> byteOf;  ///< code point -> byte
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                       (b >= 0xAE && b <= 0xFF);
      int cp = printable ? b : 256 + n++;
      charOf[b] = encodeCp(cp);
      byteOf[cp] = b;
    }
  }
};

const ByteAlphabet &byteAlphabet() {
  static const ByteAlphabet a;
  return a;
}

// --- components -------------------------------------------------------------

/// A piece of text on its way to the model.
using Pieces = std::vector<std::string>;

struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Prepend, Replace } kind;
  std::string a, b; ///< Prepend: a; Replace: a -> b
};

struct PreTokenizer {
  enum Kind { Split, ByteLevel } kind;
  // Split
  std::shared_ptr<Regex> regex;
  std::string literal; ///< a String pattern (when regex is null)
  enum Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext } behavior = Isolated;
  // ByteLevel
  bool addPrefixSpace = false;
  bool useRegex = false;
};

struct DecoderStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip } kind;
  std::string a, b;       ///< Replace a -> b; Strip content a
  int start = 0, stop = 0; ///< Strip
};

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false, normalized = false, lstrip = false, rstrip = false;
};

/// A span of input: text for the model, or an added token's id.
struct Segment {
  std::string text;
  int64_t id = -1;
};

const char *kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class HfTokenizer final : public Tokenizer {
public:
  explicit HfTokenizer(const std::string &path) : path_(path) {
    json j = parseJsonFile(path, "tokenizer file");
    if (!j.is_object())
      fail("", "the file is not a JSON object");
    if (!j.contains("model") || !j["model"].is_object())
      fail("", std::string("not a Hugging Face tokenizer.json: it has no 'model' object") +
                   (j.contains("model_type") ? " (this looks like a model's config.json)" : ""));
    loadModel(j["model"]);
    loadAddedTokens(j.value("added_tokens", json::array()));
    if (j.contains("normalizer"))
      loadNormalizer(j["normalizer"], "normalizer");
    if (j.contains("pre_tokenizer"))
      loadPreTokenizer(j["pre_tokenizer"], "pre_tokenizer");
    if (j.contains("decoder"))
      loadDecoder(j["decoder"], "decoder");
    int64_t templateBos = -1;
    if (j.contains("post_processor"))
      loadPostProcessor(j["post_processor"], "post_processor", templateBos);
    if (j.contains("truncation") && !j["truncation"].is_null())
      fail("truncation", "truncation is not supported (the runtime sets lengths)");
    if (j.contains("padding") && !j["padding"].is_null())
      fail("padding", "padding is not supported (the runtime pads)");
    for (const auto &t : added_)
      vocabSize_ = std::max(vocabSize_, t.id + 1);
    loadConfigs(templateBos);
  }

  std::vector<int64_t> encode(const std::string &raw) const override {
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

  std::string decode(const std::vector<int64_t> &ids) const override {
    return decodeImpl(ids, true);
  }
  std::string decodeKeepSpecial(const std::vector<int64_t> &ids) const override {
    return decodeImpl(ids, false);
  }

  int64_t vocabSize() const override { return vocabSize_; }
  int64_t eosId() const override { return eos_; }
  int64_t padId() const override { return pad_; }
  int64_t bosId() const override { return addBos_ ? bos_ : -1; }
  std::vector<int64_t> stopIds() const override { return stops_; }
  std::string name() const override { return "hf:" + path_; }
  std::string tokenText(int64_t id) const override {
    if (id < 0 || id >= (int64_t)tokenOf_.size())
      return "";
    return tokenOf_[id];
  }
  std::string chatTemplate() const override { return chatTemplate_; }
  std::string specialTokenText(const std::string &which) const override {
    auto it = specialText_.find(which);
    return it == specialText_.end() ? "" : it->second;
  }

private:
  [[noreturn]] void fail(const std::string &where, const std::string &msg) const {
    throw std::runtime_error("tokenizer '" + path_ + "'" +
                             (where.empty() ? "" : ": " + where) + ": " + msg);
  }

  static std::string typeOf(const json &j) {
    return j.is_object() && j.contains("type") && j["type"].is_string()
               ? j["type"].get<std::string>()
               : "";
  }

  // --- loading ---------------------------------------------------------

  void loadModel(const json &m) {
    std::string type = typeOf(m);
    if (type.empty() && m.contains("merges"))
      type = "BPE"; // old files omit it
    if (type != "BPE")
      fail("model.type", "model type '" + (type.empty() ? std::string("?") : type) +
                             "' is not supported (hflow reads BPE tokenizers: "
                             "Qwen, Llama-2/3, Mistral)");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
      fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
    for (const char *k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
        fail(std::string("model.") + k, "a non-empty value is not supported");
    byteFallback_ = m.value("byte_fallback", false);
    ignoreMerges_ = m.value("ignore_merges", false);
    fuseUnk_ = m.value("fuse_unk", false);
    if (!m.contains("vocab") || !m["vocab"].is_object())
      fail("model.vocab", "missing or not an object");
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() >= (int64_t(1) << 31))
        fail("model.vocab", "token '" + it.key() + "' has no valid id");
      int64_t id = it.value().get<int64_t>();
      vocab_[it.key()] = id;
      vocabSize_ = std::max(vocabSize_, id + 1);
    }
    tokenOf_.assign(vocabSize_, std::string());
    hasToken_.assign(vocabSize_, false);
    for (const auto &[tok, id] : vocab_) {
      tokenOf_[id] = tok;
      hasToken_[id] = true;
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab_.find(m["unk_token"].get<std::string>());
      if (it == vocab_.end())
        fail("model.unk_token", "'" + m["unk_token"].get<std::string>() +
                                    "' is not in the vocabulary");
      unk_ = it->second;
    }
    const json &merges = m.value("merges", json::array());
    if (!merges.is_array())
      fail("model.merges", "not an array");
    merges_.reserve(merges.size() * 2);
    for (size_t r = 0; r < merges.size(); ++r) {
      const json &e = merges[r];
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        auto sp = s.find(' ', 1);
        if (sp == std::string::npos)
          fail("model.merges[" + std::to_string(r) + "]", "'" + s + "' is not two tokens");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else
        fail("model.merges[" + std::to_string(r) + "]", "not \"a b\" or [\"a\", \"b\"]");
      auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        fail("model.merges[" + std::to_string(r) + "]",
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

  void loadAddedTokens(const json &a) {
    if (!a.is_array())
      fail("added_tokens", "not an array");
    for (size_t k = 0; k < a.size(); ++k) {
      const json &e = a[k];
      std::string where = "added_tokens[" + std::to_string(k) + "]";
      if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
          !e.contains("content") || !e["content"].is_string())
        fail(where, "needs an integer 'id' and a string 'content'");
      AddedToken t;
      t.id = e["id"].get<int64_t>();
      t.content = e["content"].get<std::string>();
      if (t.id < 0 || t.id >= (int64_t(1) << 31) || t.content.empty())
        fail(where, "bad id or empty content");
      t.special = e.value("special", false);
      t.normalized = e.value("normalized", !t.special);
      t.lstrip = e.value("lstrip", false);
      t.rstrip = e.value("rstrip", false);
      if (e.value("single_word", false))
        fail(where, "'single_word' added tokens are not supported");
      added_.push_back(t);
    }
    // Ids and texts of added tokens, for decoding.
    int64_t maxId = vocabSize_;
    for (const auto &t : added_)
      maxId = std::max(maxId, t.id + 1);
    tokenOf_.resize(maxId);
    hasToken_.resize(maxId, false);
    isSpecial_.assign(maxId, false);
    isAdded_.assign(maxId, false);
    for (const auto &t : added_) {
      tokenOf_[t.id] = t.content;
      hasToken_[t.id] = true;
      isSpecial_[t.id] = t.special;
      isAdded_[t.id] = true;
    }
    // Longest first, so the first hit at a position is the longest.
    for (const auto &t : added_) {
      auto &bucket = (t.normalized ? addedNorm_ : addedRaw_)[(unsigned char)t.content[0]];
      bucket.push_back(&t - added_.data());
    }
    for (auto *table : {&addedRaw_, &addedNorm_})
      for (auto &bucket : *table)
        std::stable_sort(bucket.begin(), bucket.end(), [&](size_t x, size_t y) {
          return added_[x].content.size() > added_[y].content.size();
        });
  }

  void loadNormalizer(const json &n, const std::string &where) {
    if (n.is_null())
      return;
    std::string type = typeOf(n);
    if (type == "Sequence") {
      const json &list = n.value("normalizers", json::array());
      for (size_t k = 0; k < list.size(); ++k)
        loadNormalizer(list[k], where + ".normalizers[" + std::to_string(k) + "]");
      return;
    }
    Normalizer x{Normalizer::NFC, "", ""};
    if (type == "NFC")
      x.kind = Normalizer::NFC;
    else if (type == "NFD")
      x.kind = Normalizer::NFD;
    else if (type == "NFKC")
      x.kind = Normalizer::NFKC;
    else if (type == "NFKD")
      x.kind = Normalizer::NFKD;
    else if (type == "Prepend") {
      x.kind = Normalizer::Prepend;
      x.a = n.value("prepend", std::string());
    } else if (type == "Replace") {
      x.kind = Normalizer::Replace;
      const json &p = n.value("pattern", json::object());
      if (!p.contains("String") || !p["String"].is_string())
        fail(where + ".pattern", "only a String pattern is supported for Replace");
      x.a = p["String"].get<std::string>();
      x.b = n.value("content", std::string());
    } else
      fail(where, "normalizer '" + type + "' is not supported (supported: NFC, NFD, "
                  "NFKC, NFKD, Prepend, Replace, Sequence)");
    normalizers_.push_back(x);
  }

  void loadPreTokenizer(const json &p, const std::string &where) {
    if (p.is_null())
      return;
    std::string type = typeOf(p);
    if (type == "Sequence") {
      const json &list = p.value("pretokenizers", json::array());
      for (size_t k = 0; k < list.size(); ++k)
        loadPreTokenizer(list[k], where + ".pretokenizers[" + std::to_string(k) + "]");
      return;
    }
    PreTokenizer x{PreTokenizer::Split};
    if (type == "Split") {
      if (p.value("invert", false))
        fail(where, "an inverted Split is not supported");
      const json &pat = p.value("pattern", json::object());
      if (pat.contains("Regex") && pat["Regex"].is_string())
        x.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(),
                                          "tokenizer '" + path_ + "': " + where + ".pattern");
      else if (pat.contains("String") && pat["String"].is_string())
        x.literal = pat["String"].get<std::string>();
      else
        fail(where + ".pattern", "needs a Regex or a String");
      if (!x.regex && x.literal.empty())
        fail(where + ".pattern", "the String is empty");
      std::string b = p.value("behavior", std::string("Isolated"));
      if (b == "Isolated")
        x.behavior = PreTokenizer::Isolated;
      else if (b == "Removed")
        x.behavior = PreTokenizer::Removed;
      else if (b == "MergedWithPrevious")
        x.behavior = PreTokenizer::MergedWithPrevious;
      else if (b == "MergedWithNext")
        x.behavior = PreTokenizer::MergedWithNext;
      else
        fail(where + ".behavior", "behavior '" + b + "' is not supported");
    } else if (type == "ByteLevel") {
      x.kind = PreTokenizer::ByteLevel;
      x.addPrefixSpace = p.value("add_prefix_space", false);
      x.useRegex = p.value("use_regex", true);
      if (x.useRegex)
        x.regex = std::make_shared<Regex>(kGpt2Pattern, "the GPT-2 pattern");
      byteLevel_ = true;
    } else
      fail(where, "pre-tokenizer '" + type + "' is not supported (supported: Split, "
                  "ByteLevel, Sequence)");
    preTokenizers_.push_back(x);
  }

  void loadDecoder(const json &d, const std::string &where) {
    if (d.is_null())
      return;
    std::string type = typeOf(d);
    if (type == "Sequence") {
      const json &list = d.value("decoders", json::array());
      for (size_t k = 0; k < list.size(); ++k)
        loadDecoder(list[k], where + ".decoders[" + std::to_string(k) + "]");
      return;
    }
    DecoderStep x{DecoderStep::ByteLevel};
    if (type == "ByteLevel")
      x.kind = DecoderStep::ByteLevel;
    else if (type == "ByteFallback")
      x.kind = DecoderStep::ByteFallback;
    else if (type == "Fuse")
      x.kind = DecoderStep::Fuse;
    else if (type == "Replace") {
      x.kind = DecoderStep::Replace;
      const json &p = d.value("pattern", json::object());
      if (!p.contains("String") || !p["String"].is_string())
        fail(where + ".pattern", "only a String pattern is supported for Replace");
      x.a = p["String"].get<std::string>();
      x.b = d.value("content", std::string());
    } else if (type == "Strip") {
      x.kind = DecoderStep::Strip;
      x.a = d.value("content", std::string(" "));
      x.start = d.value("start", 0);
      x.stop = d.value("stop", 0);
      size_t len = 0;
      if (x.a.empty() || decodeValidUtf8(x.a, 0, len), len != x.a.size())
        fail(where + ".content", "must be one character");
    } else
      fail(where, "decoder '" + type + "' is not supported (supported: ByteLevel, "
                  "Replace, ByteFallback, Fuse, Strip, Sequence)");
    decoders_.push_back(x);
  }

  /// ByteLevel (nothing for ids) and TemplateProcessing of the form
  /// [SpecialToken]? Sequence A: the special token is the BOS the runtime
  /// prepends.
  void loadPostProcessor(const json &p, const std::string &where, int64_t &bos) {
    if (p.is_null())
      return;
    std::string type = typeOf(p);
    if (type == "Sequence") {
      const json &list = p.value("processors", json::array());
      for (size_t k = 0; k < list.size(); ++k)
        loadPostProcessor(list[k], where + ".processors[" + std::to_string(k) + "]", bos);
      return;
    }
    if (type == "ByteLevel")
      return;
    if (type != "TemplateProcessing")
      fail(where, "post-processor '" + type + "' is not supported (supported: "
                  "ByteLevel, TemplateProcessing, Sequence)");
    const json &single = p.value("single", json::array());
    bool seenSeq = false;
    for (const json &item : single) {
      if (item.contains("Sequence")) {
        seenSeq = true;
        continue;
      }
      if (!item.contains("SpecialToken") || seenSeq)
        fail(where + ".single", "only a leading special token before the text is "
                                "supported (the runtime adds BOS, never EOS)");
      std::string name = item["SpecialToken"].value("id", std::string());
      const json &st = p.value("special_tokens", json::object());
      if (!st.contains(name) || !st[name].contains("ids") || st[name]["ids"].size() != 1)
        fail(where + ".special_tokens", "'" + name + "' needs exactly one id");
      if (bos >= 0)
        fail(where + ".single", "more than one leading special token");
      bos = st[name]["ids"][0].get<int64_t>();
    }
  }

  /// tokenizer_config.json and generation_config.json beside the file.
  void loadConfigs(int64_t templateBos) {
    std::string dir = dirOf(path_);
    json tc = json::object(), gc = json::object();
    std::string tcPath = dir + "/tokenizer_config.json", gcPath = dir + "/generation_config.json";
    if (fileExists(tcPath))
      tc = parseJsonFile(tcPath, "tokenizer config");
    if (fileExists(gcPath))
      gc = parseJsonFile(gcPath, "generation config");
    if (!tc.is_object())
      throw std::runtime_error("tokenizer config '" + tcPath + "' is not a JSON object");
    if (!gc.is_object())
      throw std::runtime_error("generation config '" + gcPath + "' is not a JSON object");
    auto tokenId = [&](const std::string &key) -> int64_t {
      if (!tc.contains(key) || tc[key].is_null())
        return -1;
      const json &v = tc[key];
      std::string s;
      if (v.is_string())
        s = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        s = v["content"].get<std::string>();
      else
        throw std::runtime_error("tokenizer config '" + tcPath + "': '" + key +
                                 "' must be a string or {\"content\": ...}");
      int64_t id = idOfToken(s);
      if (id < 0)
        throw std::runtime_error("tokenizer config '" + tcPath + "': " + key + " '" + s +
                                 "' is not a token of '" + path_ + "'");
      specialText_[key] = s;
      return id;
    };
    auto genId = [&](const std::string &key, std::vector<int64_t> &out) {
      if (!gc.contains(key) || gc[key].is_null())
        return;
      const json &v = gc[key];
      auto one = [&](const json &x) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocabSize_)
          throw std::runtime_error("generation config '" + gcPath + "': '" + key +
                                   "' must be token ids below " +
                                   std::to_string(vocabSize_) + " (got " + x.dump() + ")");
        out.push_back(x.get<int64_t>());
      };
      if (v.is_array())
        for (const json &x : v)
          one(x);
      else
        one(v);
    };
    int64_t bos = tokenId("bos_token"), eos = tokenId("eos_token"), pad = tokenId("pad_token");
    tokenId("unk_token");
    std::vector<int64_t> genEos, genBos, genPad;
    genId("eos_token_id", genEos);
    genId("bos_token_id", genBos);
    genId("pad_token_id", genPad);
    if (eos < 0 && !genEos.empty())
      eos = genEos.front();
    if (bos < 0 && !genBos.empty())
      bos = genBos.front();
    if (pad < 0 && !genPad.empty())
      pad = genPad.front();
    if (eos < 0)
      throw std::runtime_error(
          "tokenizer '" + path_ + "': no EOS token (neither tokenizer_config.json's "
          "eos_token nor generation_config.json's eos_token_id), so generation "
          "could never stop");
    eos_ = eos;
    stops_ = {eos};
    for (int64_t id : genEos)
      if (std::find(stops_.begin(), stops_.end(), id) == stops_.end())
        stops_.push_back(id);
    pad_ = pad >= 0 ? pad : eos; // as verl and OpenRLHF do when there is none
    // BOS: tokenizer_config's add_bos_token when it says, else the
    // post-processor's leading special token.
    if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) {
      addBos_ = tc["add_bos_token"].get<bool>();
      bos_ = bos >= 0 ? bos : templateBos;
      if (addBos_ && bos_ < 0)
        throw std::runtime_error("tokenizer config '" + tcPath +
                                 "': add_bos_token is true but there is no bos_token");
    } else {
      addBos_ = templateBos >= 0;
      bos_ = templateBos >= 0 ? templateBos : bos;
    }
    if (tc.contains("add_eos_token") && tc["add_eos_token"].is_boolean() &&
        tc["add_eos_token"].get<bool>())
      throw std::runtime_error("tokenizer config '" + tcPath +
                               "': add_eos_token true is not supported (a prompt "
                               "ending in EOS would end its response at once)");
    if (tc.contains("chat_template")) {
      const json &t = tc["chat_template"];
      if (t.is_string())
        chatTemplate_ = t.get<std::string>();
      else if (t.is_array()) {
        for (const json &e : t)
          if (e.is_object() && e.value("name", std::string()) == "default" &&
              e.contains("template") && e["template"].is_string())
            chatTemplate_ = e["template"].get<std::string>();
        if (chatTemplate_.empty())
          throw std::runtime_error("tokenizer config '" + tcPath +
                                   "': chat_template has no entry named 'default'");
      } else if (!t.is_null())
        throw std::runtime_error("tokenizer config '" + tcPath +
                                 "': chat_template must be a string or a list of "
                                 "{name, template}");
    }
  }

  int64_t idOfToken(const std::string &s) const {
    for (const auto &t : added_)
      if (t.content == s)
        return t.id;
    auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  }

  // --- encoding --------------------------------------------------------

  static uint64_t pairKey(int64_t a, int64_t b) { return (uint64_t(a) << 32) | uint64_t(b); }

  /// `text` split around the added tokens whose `normalized` flag is
  /// `normalizedTokens`, leftmost-longest.
  std::vector<Segment> splitAdded(const std::string &text, bool normalizedTokens) const {
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

  std::string normalize(std::string s) const {
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

  static void splitWith(const PreTokenizer &p, const std::string &s, Pieces &out) {
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

  Pieces preTokenize(const std::string &text) const {
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

  struct Merge {
    int32_t rank, id;
  };

  /// Appends the ids of one pre-token.
  void bpe(const std::string &word, std::vector<int64_t> &ids) const {
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

  const std::vector<int64_t> &byteIds() const { return byteIds_; }

  // --- decoding --------------------------------------------------------

  std::string decodeImpl(const std::vector<int64_t> &ids, bool skipSpecial) const {
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

  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::string> tokenOf_;
  std::vector<bool> hasToken_, isSpecial_, isAdded_;
  std::vector<AddedToken> added_;
  std::vector<size_t> addedRaw_[256], addedNorm_[256];
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> preTokenizers_;
  std::vector<DecoderStep> decoders_;
  bool byteLevel_ = false, byteFallback_ = false, ignoreMerges_ = false, fuseUnk_ = false;
  int64_t byteToken_[256] = {};
  int64_t unk_ = -1;
  int64_t vocabSize_ = 0;
  int64_t eos_ = -1, bos_ = -1, pad_ = -1;
  bool addBos_ = false;
  std::vector<int64_t> stops_;
  std::string chatTemplate_;
  std::unordered_map<std::string, std::string> specialText_;
  std::vector<int64_t> byteIds_; ///< byte -> id of its byte-level char
};

} // namespace

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

} // namespace data
} // namespace hflow
