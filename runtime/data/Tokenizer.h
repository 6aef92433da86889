//===- Tokenizer.h - text <-> token ids for the runtime ---------*- C++ -*-===//
//
// hflow::data: the tokenizers the runtime turns prompts into ids with and
// generated ids back into text with (for rule-based rewards and logs).
// Plain C++17, no LibTorch: ids are std::vector<int64_t>. See docs/data.md.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_TOKENIZER_H
#define HFLOW_RUNTIME_DATA_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hflow {
namespace data {

/// Text <-> ids. Implementations are immutable after construction, so one
/// tokenizer may be shared by threads.
class Tokenizer {
public:
  virtual ~Tokenizer() = default;
  /// The ids of `text`. Never adds BOS or EOS: the caller prepends bosId()
  /// when it is not -1.
  virtual std::vector<int64_t> encode(const std::string &text) const = 0;
  /// The text of `ids`. Ids outside [0, vocabSize()) are skipped; control
  /// ids (BOS, EOS, PAD of a SentencePiece model; the special tokens of a
  /// tokenizer.json) render as nothing. Always valid UTF-8 for
  /// SentencePiece and tokenizer.json (invalid bytes become U+FFFD); the
  /// byte tokenizer returns the bytes as they are. Never throws.
  virtual std::string decode(const std::vector<int64_t> &ids) const = 0;
  /// decode() with special tokens rendered as their text (Hugging Face's
  /// skip_special_tokens=False). The default is decode().
  virtual std::string decodeKeepSpecial(const std::vector<int64_t> &ids) const {
    return decode(ids);
  }
  virtual int64_t vocabSize() const = 0;
  /// The stop token generation ends on.
  virtual int64_t eosId() const = 0;
  virtual int64_t padId() const = 0;
  /// -1 when the tokenizer adds none.
  virtual int64_t bosId() const = 0;
  /// Every id that ends a response, eosId() first (a tokenizer.json's
  /// generation_config.json may list several).
  virtual std::vector<int64_t> stopIds() const { return {eosId()}; }
  /// "byte", "sentencepiece:<model path>" or "hf:<tokenizer.json path>".
  virtual std::string name() const = 0;
  /// The vocabulary entry of `id` as the file spells it ("" when none).
  virtual std::string tokenText(int64_t id) const { (void)id; return ""; }
  /// tokenizer_config.json's chat_template ("" when none).
  virtual std::string chatTemplate() const { return ""; }
  /// tokenizer_config.json's text for "bos_token", "eos_token", "pad_token"
  /// or "unk_token" ("" when it names none): what a chat template sees.
  virtual std::string specialTokenText(const std::string &which) const {
    (void)which;
    return "";
  }
};

/// Incremental decoding for streaming output: push() returns the text the
/// ids so far add, holding back a character whose UTF-8 bytes are split
/// across tokens until it is complete. The concatenation of every push()
/// and finish() equals decode() of all the ids for the tokenizers here.
class StreamDecoder {
public:
  explicit StreamDecoder(const Tokenizer &tok) : tok_(tok) {}
  std::string push(int64_t id);
  /// Whatever is still held back (U+FFFD for an incomplete character).
  std::string finish();

private:
  const Tokenizer &tok_;
  std::vector<int64_t> context_, pending_;
};

/// Byte tokenizer: id = byte value (0..255), vocab 256; pad = 0 (NUL);
/// eos = '\n' (10): a response ends at a newline; bos = -1. encode() maps
/// every byte of the text (UTF-8 or not) to its value; decode() is its exact
/// inverse for ids in [0, 256) and skips the others.
std::unique_ptr<Tokenizer> makeByteTokenizer();

/// A SentencePiece model file (e.g. Llama-2's tokenizer.model): ids from the
/// model; eos/bos/pad from the model (pad falls back to 0 when the model has
/// none; bos is -1 when the model has none). Throws std::runtime_error naming
/// the file when it cannot be loaded.
std::unique_ptr<Tokenizer> makeSentencePieceTokenizer(const std::string &modelPath);

/// A Hugging Face tokenizer.json with a BPE model (byte-level: Qwen2/2.5/3,
/// Llama-3, Mistral-Nemo; SentencePiece-style with byte fallback: Llama-2,
/// Mistral). tokenizer_config.json and generation_config.json in the same
/// directory give BOS/EOS/PAD, add_bos_token, every EOS id (stopIds()) and
/// the chat template. A component outside the supported set (docs/data.md)
/// is refused with its JSON path.
std::unique_ptr<Tokenizer> makeHfTokenizer(const std::string &tokenizerJson);

/// "byte" -> makeByteTokenizer(); a path to a SentencePiece model file ->
/// makeSentencePieceTokenizer(path); a path to a tokenizer.json (or any
/// file whose first non-blank byte is '{') -> makeHfTokenizer(path); a
/// directory (a Hugging Face checkpoint) -> its tokenizer.json, else its
/// tokenizer.model. Anything else throws std::runtime_error saying what is
/// accepted.
std::unique_ptr<Tokenizer> makeTokenizer(const std::string &spec);

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_TOKENIZER_H
