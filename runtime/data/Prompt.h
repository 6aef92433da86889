//===- Prompt.h - a dataset row's prompt as the model sees it ---*- C++ -*-===//
//
// hflow::data: the one place a row's prompt becomes token ids, for rollouts,
// sft, reward-model pairs and evaluation alike (docs/data.md, "Prompts"):
//   - token ids in the row: used as they are;
//   - text: BOS (when the tokenizer adds one) + encode(text);
//   - a chat, [{"role": ..., "content": ...}, ...]: the tokenizer's chat
//     template rendered with add_generation_prompt = true (and bos_token,
//     eos_token, ... from tokenizer_config.json), then encoded without
//     adding BOS (the template writes it), as Hugging Face's
//     apply_chat_template(tokenize=True) does.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_PROMPT_H
#define HFLOW_RUNTIME_DATA_PROMPT_H

#include "runtime/data/ChatTemplate.h"
#include "runtime/data/Dataset.h"
#include "runtime/data/Tokenizer.h"

#include <memory>
#include <string>
#include <vector>

namespace hflow {
namespace data {

class PromptEncoder {
public:
  /// Parses the tokenizer's chat template, when it has one (a template
  /// outside the supported subset is an error here, before any row).
  explicit PromptEncoder(const Tokenizer &tok);

  /// The ids of `ex`'s prompt. `where` names the data file for errors
  /// ("data.jsonl"): a chat row without a chat template, or a template
  /// that raises, is "data.jsonl:LINE: ...".
  std::vector<int64_t> encode(const Example &ex, const std::string &where) const;
  /// The text a chat row renders to (its prompt text otherwise).
  std::string text(const Example &ex, const std::string &where) const;

  bool hasTemplate() const { return tmpl_ != nullptr; }
  /// The parsed chat template (null: none).
  std::shared_ptr<const ChatTemplate> chatTemplate() const { return tmpl_; }
  /// How errors name a tokenizer's chat template: "<dir>/tokenizer_config.json:
  /// chat_template" (ChatTemplateError's ORIGIN).
  static std::string templateOrigin(const Tokenizer &tok);

private:
  const Tokenizer &tok_;
  std::shared_ptr<ChatTemplate> tmpl_;
};

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_PROMPT_H
