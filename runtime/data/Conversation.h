//===- Conversation.h - a multi-turn episode's tokens, turn by turn -*- C++ -*-===//
//
// hflow::data: the token sequence of a multi-turn episode (issue 42), built
// the way the model sees it, never re-tokenized:
//   - the prompt: the chat template rendered with add_generation_prompt and
//     encoded, as PromptEncoder encodes a chat row;
//   - the model's turn: the ids it sampled, appended exactly as sampled
//     (the only tokens trained), its text (without the stop token) becoming
//     the assistant message the template and the environment see;
//   - the environment's turn (a tool result, a user reply): the text the
//     template adds for it, and for the next generation prompt, encoded and
//     appended (not trained).
// The environment's turn is the template's text after the model's message
// (found by rendering the messages with a sentinel for that message's
// text, so whatever the template does to it does not matter): its closing,
// less the stop token the model sampled (already there), the environment's
// messages, the next generation prompt. When the template's rendering of
// the whole conversation differs from the text of the ids (it trims the
// model's text, drops an earlier turn's reasoning), the ids stay as they
// are and the turn counts as a drift.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_CONVERSATION_H
#define HFLOW_RUNTIME_DATA_CONVERSATION_H

#include "runtime/data/ChatTemplate.h"
#include "runtime/data/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hflow {
namespace data {

class Conversation {
public:
  /// Starts from `messages` (the prompt's chat) with the tokenizer's chat
  /// template. Throws ChatTemplateError when the template raises.
  Conversation(const Tokenizer &tok, std::shared_ptr<const ChatTemplate> tmpl,
               nlohmann::ordered_json messages);
  /// Starts from the prompt's ids as the model sees them (a rollout's
  /// prompt, however it was encoded), `messages` its chat.
  Conversation(const Tokenizer &tok, std::shared_ptr<const ChatTemplate> tmpl,
               nlohmann::ordered_json messages, std::vector<int64_t> promptIds);

  /// The model's turn: the ids it sampled, a stop id last when it stopped
  /// on one. Appended as they are, trained.
  void assistant(const std::vector<int64_t> &generated);
  /// The environment's turn after a model turn: its messages (a list of
  /// {"role", "content"}; several tool results go in one turn) and the next
  /// generation prompt. Returns the ids appended (not trained). Throws
  /// ChatTemplateError when the template raises (nothing changes then).
  size_t environment(const nlohmann::ordered_json &messages);
  size_t environment(const std::string &role, const std::string &content);

  const std::vector<int64_t> &ids() const { return ids_; }
  /// 1 where ids() holds a token the model sampled, else 0.
  const std::vector<uint8_t> &trained() const { return trained_; }
  const nlohmann::ordered_json &messages() const { return messages_; }
  /// The environment's turns after which the template renders the whole
  /// conversation otherwise than the text of the ids.
  int drifts() const { return drifts_; }

private:
  std::string render(const nlohmann::ordered_json &messages, bool generationPrompt) const;

  const Tokenizer &tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  nlohmann::ordered_json messages_;
  std::vector<int64_t> ids_;
  std::vector<uint8_t> trained_;
  std::string seen_; ///< the text of ids_ (special tokens as their text)
  std::string stopText_; ///< the stop token the last model turn ended on
  int drifts_ = 0;
};

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_CONVERSATION_H
