//===- Prompt.cpp - a dataset row's prompt as the model sees it -----------===//
#include "runtime/data/Prompt.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace hflow {
namespace data {

std::string PromptEncoder::templateOrigin(const Tokenizer &tok) {
  std::string origin = tok.name();
  if (origin.rfind("hf:", 0) == 0)
    origin = origin.substr(3);
  auto slash = origin.rfind('/');
  return (slash == std::string::npos ? std::string() : origin.substr(0, slash + 1)) +
         "tokenizer_config.json: chat_template";
}

PromptEncoder::PromptEncoder(const Tokenizer &tok) : tok_(tok) {
  std::string src = tok.chatTemplate();
  if (!src.empty())
    tmpl_ = std::make_shared<ChatTemplate>(ChatTemplate::parse(src, templateOrigin(tok)));
}

std::string PromptEncoder::text(const Example &ex, const std::string &where) const {
  if (ex.messages.empty())
    return ex.prompt;
  const std::string at = where + ":" + std::to_string(ex.line) + ": ";
  if (!tmpl_)
    throw std::runtime_error(at + "the prompt is a chat (a list of messages) but the "
                                  "tokenizer '" + tok_.name() +
                             "' has no chat template (tokenizer_config.json's "
                             "chat_template)");
  nlohmann::ordered_json vars;
  vars["messages"] = nlohmann::ordered_json::parse(ex.messages);
  vars["add_generation_prompt"] = true;
  for (const char *k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    std::string t = tok_.specialTokenText(k);
    if (!t.empty())
      vars[k] = t;
  }
  try {
    return tmpl_->render(vars);
  } catch (const ChatTemplateError &e) {
    throw std::runtime_error(at + "rendering the chat template: " + e.what());
  }
}

std::vector<int64_t> PromptEncoder::encode(const Example &ex, const std::string &where) const {
  if (!ex.promptIds.empty())
    return ex.promptIds;
  if (!ex.messages.empty())
    return tok_.encode(text(ex, where));
  std::vector<int64_t> ids;
  if (tok_.bosId() >= 0)
    ids.push_back(tok_.bosId());
  std::vector<int64_t> t = tok_.encode(ex.prompt);
  ids.insert(ids.end(), t.begin(), t.end());
  return ids;
}

} // namespace data
} // namespace hflow
