//===- Conversation.cpp - a multi-turn episode's tokens, turn by turn -----===//
#include "runtime/data/Conversation.h"

#include <algorithm>
#include <stdexcept>

namespace hflow {
namespace data {

Conversation::Conversation(const Tokenizer &tok, std::shared_ptr<const ChatTemplate> tmpl,
                           nlohmann::ordered_json messages)
    : Conversation(tok, std::move(tmpl), std::move(messages), {}) {
  // (the prompt as the template renders it)
  ids_ = tok_.encode(render(messages_, true));
  trained_.assign(ids_.size(), 0);
  seen_ = tok_.decodeKeepSpecial(ids_);
}

Conversation::Conversation(const Tokenizer &tok, std::shared_ptr<const ChatTemplate> tmpl,
                           nlohmann::ordered_json messages, std::vector<int64_t> promptIds)
    : tok_(tok), tmpl_(std::move(tmpl)), messages_(std::move(messages)) {
  if (!tmpl_)
    throw std::runtime_error("a multi-turn episode needs a chat template, and the tokenizer '" +
                             tok.name() + "' has none (tokenizer_config.json's chat_template)");
  if (!messages_.is_array())
    throw std::runtime_error("a conversation starts from a list of messages");
  ids_ = std::move(promptIds);
  trained_.assign(ids_.size(), 0);
  seen_ = tok_.decodeKeepSpecial(ids_);
}

std::string Conversation::render(const nlohmann::ordered_json &messages,
                                 bool generationPrompt) const {
  nlohmann::ordered_json vars;
  vars["messages"] = messages;
  vars["add_generation_prompt"] = generationPrompt;
  for (const char *k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    const std::string t = tok_.specialTokenText(k);
    if (!t.empty())
      vars[k] = t;
  }
  return tmpl_->render(vars);
}

void Conversation::assistant(const std::vector<int64_t> &generated) {
  if (!messages_.empty() && messages_.back().value("role", "") == "assistant")
    throw std::logic_error("two model turns without an environment turn between them");
  // The message: the text without the stop token it ended on (a stop id,
  // or a special token such as an end of turn that is not one).
  const std::vector<int64_t> stops = tok_.stopIds();
  std::vector<int64_t> body = generated;
  stopText_.clear();
  if (!body.empty() && (std::find(stops.begin(), stops.end(), body.back()) != stops.end() ||
                        tok_.decode({body.back()}).empty())) {
    stopText_ = tok_.decodeKeepSpecial({body.back()});
    body.pop_back();
  }
  messages_.push_back({{"role", "assistant"}, {"content", tok_.decode(body)}});
  ids_.insert(ids_.end(), generated.begin(), generated.end());
  trained_.insert(trained_.end(), generated.size(), 1);
  seen_ += tok_.decodeKeepSpecial(generated);
}

size_t Conversation::environment(const nlohmann::ordered_json &turn) {
  if (messages_.empty() || messages_.back().value("role", "") != "assistant")
    throw std::logic_error("an environment turn follows a model turn");
  if (!turn.is_array() || turn.empty())
    throw std::invalid_argument("an environment turn is a non-empty list of messages");
  nlohmann::ordered_json next = messages_;
  for (const auto &m : turn)
    next.push_back(m);
  // The template's text after the model's message: the history rendered
  // with a sentinel for that message's content, whatever the template does
  // to the text it had (trims it, drops its reasoning).
  static const std::string kSentinel = "\x1e" "hflow-model-turn" "\x1f";
  nlohmann::ordered_json marked = next;
  marked[messages_.size() - 1]["content"] = kSentinel;
  const std::string withSentinel = render(marked, true);
  const size_t at = withSentinel.rfind(kSentinel);
  if (at == std::string::npos || withSentinel.find(kSentinel) != at)
    throw std::runtime_error("the chat template does not render a model turn's text as it is "
                             "given, so hflow cannot tell where the environment's turn begins");
  std::string tail = withSentinel.substr(at + kSentinel.size());
  // Its closing begins with the stop token the model sampled: already there.
  if (!stopText_.empty() && tail.compare(0, stopText_.size(), stopText_) == 0)
    tail.erase(0, stopText_.size());
  const std::string full = render(next, true); // (throws before anything changes)
  messages_ = std::move(next);
  const std::vector<int64_t> add = tok_.encode(tail);
  ids_.insert(ids_.end(), add.begin(), add.end());
  trained_.insert(trained_.end(), add.size(), 0);
  seen_ += tok_.decodeKeepSpecial(add);
  // The template would show the model another conversation than its ids.
  if (full != seen_)
    ++drifts_;
  return add.size();
}

size_t Conversation::environment(const std::string &role, const std::string &content) {
  return environment(nlohmann::ordered_json::array({{{"role", role}, {"content", content}}}));
}

} // namespace data
} // namespace hflow
