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
  /// ids (BOS, EOS, PAD of a SentencePiece model) render as nothing. Never
  /// throws.
  virtual std::string decode(const std::vector<int64_t> &ids) const = 0;
  virtual int64_t vocabSize() const = 0;
  /// The stop token generation ends on.
  virtual int64_t eosId() const = 0;
  virtual int64_t padId() const = 0;
  /// -1 when the tokenizer adds none.
  virtual int64_t bosId() const = 0;
  /// "byte", or "sentencepiece:<model path>".
  virtual std::string name() const = 0;
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

/// "byte" -> makeByteTokenizer(); a path to a SentencePiece model file ->
/// makeSentencePieceTokenizer(path); a directory holding tokenizer.model (a
/// Hugging Face checkpoint directory) -> that file. Anything else throws
/// std::runtime_error saying what is accepted.
std::unique_ptr<Tokenizer> makeTokenizer(const std::string &spec);

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_TOKENIZER_H
