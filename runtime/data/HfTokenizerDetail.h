//===- HfTokenizerDetail.h - the Hugging Face tokenizer's parts -------------===//
//
// The inside of makeHfTokenizer (runtime/data/Tokenizer.h), split by stage
// as the tokenizers library is: each stage is a class that reads its part
// of tokenizer.json and applies it, in a file of its own:
//
//   AddedTokens     HfAddedTokens.cpp   split out of the text, leftmost-longest
//   NormalizerChain HfNormalizer.cpp    NFC/NFD/NFKC/NFKD, Prepend, Replace
//   PreTokenizerChain HfPreTokenizer.cpp Split (PCRE2), ByteLevel
//   BpeModel        HfBpeModel.cpp      the vocabulary and merges by rank
//   DecoderChain    HfDecoder.cpp       ByteLevel, Replace, ByteFallback, Fuse, Strip
//
// HfTokenizer (HfTokenizer.cpp) composes them with the post-processor and
// the companion configs (BOS/EOS/PAD, stop ids, the chat template);
// HfShared.cpp holds what they share. Only those files include it.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_HFTOKENIZERDETAIL_H
#define HFLOW_RUNTIME_DATA_HFTOKENIZERDETAIL_H

#include "runtime/data/Tokenizer.h"
#include "runtime/data/Utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace hflow::data::hf {

using json = nlohmann::json;

// --- UTF-8: runtime/data/Utf8.h ------------------------------------------

extern const char kReplacement[];

std::string encodeCp(int32_t cp);

/// Rust's char::is_whitespace (the White_Space property).
bool isWhiteSpace(int32_t c);

void replaceAll(std::string &s, const std::string &from, const std::string &to);

// --- files ------------------------------------------------------------------

std::string readFile(const std::string &path, const std::string &what);

/// How deep a tokenizer file's JSON may nest: real files nest under 10
/// levels; hflow builds normalizers and pre-tokenizers from it recursively.
inline constexpr int kMaxJsonDepth = 64;

/// The largest tokenizer file hflow reads (real ones are under 20 MB).
inline constexpr uintmax_t kMaxTokenizerFileBytes = uintmax_t(512) << 20;

json parseJsonFile(const std::string &path, const std::string &what);

bool fileExists(const std::string &p);

std::string dirOf(const std::string &path);

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

const ByteAlphabet &byteAlphabet();

// --- what the stages share --------------------------------------------------

/// A piece of text on its way to the model.
using Pieces = std::vector<std::string>;

/// The tokenizer file a stage reads, for its errors: "tokenizer 'PATH':
/// WHERE: MSG" (WHERE a JSON path in the file).
struct TokenizerFile {
  std::string path;
  [[noreturn]] void fail(const std::string &where, const std::string &msg) const;
};

/// A component's "type" (empty when it has none).
std::string typeOf(const json &j);

extern const char *kGpt2Pattern;

// --- added tokens (HfAddedTokens.cpp) ----------------------------------------

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

class AddedTokens {
public:
  /// tokenizer.json's "added_tokens".
  void load(const json &a, const TokenizerFile &f);
  /// `text` split around the tokens whose `normalized` flag is
  /// `normalizedTokens`, leftmost-longest (lstrip/rstrip take the
  /// whitespace beside a token).
  std::vector<Segment> split(const std::string &text, bool normalizedTokens) const;
  /// The id of the token whose content is `s`, or -1.
  int64_t idOf(const std::string &s) const;
  const std::vector<AddedToken> &all() const { return added_; }

private:
  std::vector<AddedToken> added_;
  /// By first byte, longest first: indices into added_.
  std::vector<size_t> raw_[256], norm_[256];
};

// --- normalizers (HfNormalizer.cpp) ------------------------------------------

class NormalizerChain {
public:
  /// tokenizer.json's "normalizer" (a Sequence is flattened).
  void load(const json &n, const std::string &where, const TokenizerFile &f);
  std::string apply(std::string s) const;

private:
  struct Step {
    enum Kind { NFC, NFD, NFKC, NFKD, Prepend, Replace } kind;
    std::string a, b; ///< Prepend: a; Replace: a -> b
  };
  std::vector<Step> steps_;
  std::string path_;
};

// --- pre-tokenizers (HfPreTokenizer.cpp) -------------------------------------

class PreTokenizerChain {
public:
  /// tokenizer.json's "pre_tokenizer" (a Sequence is flattened).
  void load(const json &p, const std::string &where, const TokenizerFile &f);
  /// The pre-tokens of `text` (ByteLevel's stay raw bytes: the model maps
  /// them to its alphabet).
  Pieces apply(const std::string &text) const;
  /// Whether a ByteLevel step is in the chain (the model then reads bytes
  /// through GPT-2's alphabet).
  bool byteLevel() const { return byteLevel_; }

private:
  struct Step {
    enum Kind { Split, ByteLevel } kind;
    // Split
    std::shared_ptr<Regex> regex;
    std::string literal; ///< a String pattern (when regex is null)
    enum Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext } behavior = Isolated;
    // ByteLevel
    bool addPrefixSpace = false;
    bool useRegex = false;
  };
  static void splitWith(const Step &p, const std::string &s, Pieces &out);
  std::vector<Step> steps_;
  bool byteLevel_ = false;
};

// --- the model: BPE (HfBpeModel.cpp) -----------------------------------------

class BpeModel {
public:
  /// tokenizer.json's "model" (type BPE).
  void load(const json &m, const TokenizerFile &f);
  /// Appends the ids of one pre-token (`byteLevel`: its bytes through
  /// GPT-2's alphabet; else its characters, with byte fallback and unk).
  void encode(const std::string &word, bool byteLevel, std::vector<int64_t> &ids) const;
  /// One more than the largest id of the vocabulary.
  int64_t size() const { return size_; }
  /// The id of token `s`, or -1.
  int64_t idOf(const std::string &s) const;
  const std::unordered_map<std::string, int64_t> &vocab() const { return vocab_; }

private:
  static uint64_t pairKey(int64_t a, int64_t b) { return (uint64_t(a) << 32) | uint64_t(b); }
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool byteFallback_ = false, ignoreMerges_ = false, fuseUnk_ = false;
  int64_t byteToken_[256] = {}; ///< byte -> its <0xXX> token (byte fallback)
  std::vector<int64_t> byteIds_; ///< byte -> id of its byte-level char
  int64_t unk_ = -1;
  int64_t size_ = 0;
};

// --- decoders (HfDecoder.cpp) ------------------------------------------------

class DecoderChain {
public:
  /// tokenizer.json's "decoder" (a Sequence is flattened).
  void load(const json &d, const std::string &where, const TokenizerFile &f);
  /// The text of a sequence of tokens' strings.
  std::string apply(std::vector<std::string> toks) const;

private:
  struct Step {
    enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip } kind;
    std::string a, b;        ///< Replace a -> b; Strip content a
    int start = 0, stop = 0; ///< Strip
  };
  std::vector<Step> steps_;
};

// --- the tokenizer (HfTokenizer.cpp) ----------------------------------------

class HfTokenizer final : public Tokenizer {
public:
  explicit HfTokenizer(const std::string &path);

  std::vector<int64_t> encode(const std::string &raw) const override;

  std::string decode(const std::vector<int64_t> &ids) const override;
  std::string decodeKeepSpecial(const std::vector<int64_t> &ids) const override;

  int64_t vocabSize() const override { return vocabSize_; }
  int64_t eosId() const override { return eos_; }
  int64_t padId() const override { return pad_; }
  int64_t bosId() const override { return addBos_ ? bos_ : -1; }
  std::vector<int64_t> stopIds() const override { return stops_; }
  std::string name() const override { return "hf:" + file_.path; }
  std::string tokenText(int64_t id) const override;
  std::string chatTemplate() const override { return chatTemplate_; }
  std::string specialTokenText(const std::string &which) const override;

private:
  /// Every id's text (the model's tokens and the added ones) and which are
  /// special, for decoding.
  void buildTokenTable();
  /// ByteLevel (nothing for ids) and TemplateProcessing of the form
  /// [SpecialToken]? Sequence A: the special token is the BOS the runtime
  /// prepends.
  void loadPostProcessor(const json &p, const std::string &where, int64_t &bos);
  /// tokenizer_config.json and generation_config.json beside the file.
  void loadConfigs(int64_t templateBos);
  /// An added token's id, else the vocabulary's; -1 for neither.
  int64_t idOfToken(const std::string &s) const;
  std::string decodeImpl(const std::vector<int64_t> &ids, bool skipSpecial) const;

  TokenizerFile file_;
  AddedTokens added_;
  NormalizerChain normalizer_;
  PreTokenizerChain preTokenizer_;
  BpeModel model_;
  DecoderChain decoder_;
  std::vector<std::string> tokenOf_;
  std::vector<bool> hasToken_, isSpecial_;
  int64_t vocabSize_ = 0;
  int64_t eos_ = -1, bos_ = -1, pad_ = -1;
  bool addBos_ = false;
  std::vector<int64_t> stops_;
  std::string chatTemplate_;
  std::unordered_map<std::string, std::string> specialText_;
};

} // namespace hflow::data::hf

#endif // HFLOW_RUNTIME_DATA_HFTOKENIZERDETAIL_H
