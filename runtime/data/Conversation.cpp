//===- Conversation.cpp - a multi-turn episode's tokens, turn by turn -----===//
#include "runtime/data/Conversation.h"

#include <algorithm>
#include <stdexcept>

namespace hflow {
namespace data {

Conversation::Conversation(const Tokenizer &tok, std::shared_ptr<const ChatTemplate> tmpl,
                           nlohmann::ordered_json messages)
    : tok_(tok), tmpl_(std::move(tmpl)), messages_(std::move(messages)) {
  if (!tmpl_)
    throw std::runtime_error("a multi-turn episode needs a chat template, and the tokenizer '" +
                             tok.name() + "' has none (tokenizer_config.json's chat_template)");
  if (!messages_.is_array())
    throw std::runtime_error("a conversation starts from a list of messages");
  ids_ = tok_.encode(render(messages_, true));
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
  ids_.insert(ids_.end(), generated.begin(), generated.end());
  trained_.insert(trained_.end(), generated.size(), 1);
  seen_ += tok_.decodeKeepSpecial(generated);
  // The message: the text without the stop token it ended on.
  const std::vector<int64_t> stops = tok_.stopIds();
  std::vector<int64_t> body = generated;
  while (!body.empty() && std::find(stops.begin(), stops.end(), body.back()) != stops.end())
    body.pop_back();
  messages_.push_back({{"role", "assistant"}, {"content", tok_.decode(body)}});
}

size_t Conversation::environment(const std::string &role, const std::string &content) {
  const nlohmann::ordered_json before = messages_;
  messages_.push_back({{"role", role}, {"content", content}});
  const std::string full = render(messages_, true);
  std::string tail;
  if (full.size() >= seen_.size() && full.compare(0, seen_.size(), seen_) == 0) {
    tail = full.substr(seen_.size());
  } else {
    // The template renders the conversation otherwise than the model saw
    // it: keep what it saw; the new turn is the template's text after the
    // model's last message (its closing, the environment's message, the
    // next generation prompt), found where the rendering of the
    // conversation before this turn and this one's agree.
    ++drifts_;
    const std::string prev = render(before, false);
    const size_t n = std::min(prev.size(), full.size());
    const size_t k =
        (size_t)(std::mismatch(prev.begin(), prev.begin() + (std::ptrdiff_t)n, full.begin()).first -
                 prev.begin());
    size_t cut = k;
    const std::string said = before.back().value("content", "");
    auto trimmed = [](std::string t) {
      const size_t a = t.find_first_not_of(" \t\r\n");
      if (a == std::string::npos)
        return std::string();
      return t.substr(a, t.find_last_not_of(" \t\r\n") - a + 1);
    };
    for (const std::string &c : {said, trimmed(said)}) {
      if (c.empty() || c.size() > k)
        continue;
      const size_t at = full.rfind(c, k - c.size());
      if (at != std::string::npos) {
        cut = at + c.size();
        break;
      }
    }
    tail = full.substr(cut);
  }
  const std::vector<int64_t> add = tok_.encode(tail);
  ids_.insert(ids_.end(), add.begin(), add.end());
  trained_.insert(trained_.end(), add.size(), 0);
  seen_ += tok_.decodeKeepSpecial(add);
  return add.size();
}

} // namespace data
} // namespace hflow
