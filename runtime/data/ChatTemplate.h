//===- ChatTemplate.h - Hugging Face chat-template renderer -----*- C++ -*-===//
//
// hflow::data: renders the `chat_template` of a Hugging Face
// tokenizer_config.json. It implements the subset of Jinja2 that real chat
// templates use, with the semantics of @huggingface/jinja 0.5.x (the renderer
// transformers.js uses), which is the reference the output is compared with
// byte for byte. That includes its preprocessing (trim_blocks and
// lstrip_blocks on, one trailing newline dropped, {% generation %} tags
// removed) and its quirks (JavaScript number formatting, `tojson` spacing,
// `strip(chars)` ignoring its argument, objects compared by identity, ...).
//
// Anything outside the subset is refused by parse() with its location rather
// than rendered differently. Plain C++17, no LibTorch.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_CHATTEMPLATE_H
#define HFLOW_RUNTIME_DATA_CHATTEMPLATE_H

#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace hflow {
namespace data {

/// Every error of ChatTemplate: "ORIGIN:LINE:COL: message", LINE and COL
/// 1-based in the template source (COL counts characters, not bytes).
struct ChatTemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ChatTemplateRenderOptions {
  /// The time strftime_now() formats (local time). 0: the current time.
  std::time_t now = 0;
};

/// A parsed chat template. Immutable after parse(): copies share the parsed
/// form, and render() may be called from several threads at once.
class ChatTemplate {
public:
  /// Parses once. Throws ChatTemplateError "ORIGIN:LINE:COL: message" for
  /// syntax errors and for any construct outside the supported subset (the
  /// message names it, e.g. "unsupported filter 'wordcount'").
  static ChatTemplate parse(const std::string &source, const std::string &origin);

  /// Renders with the given variables (messages, add_generation_prompt,
  /// bos_token, eos_token, tools, ...; whatever the caller passes; `vars`
  /// must be an object). Throws ChatTemplateError "ORIGIN:LINE:COL: message"
  /// on runtime errors, and "ORIGIN:LINE:COL: template raised: MSG" for
  /// raise_exception('MSG').
  std::string render(const nlohmann::ordered_json &vars) const;
  std::string render(const nlohmann::ordered_json &vars,
                     const ChatTemplateRenderOptions &options) const;

  const std::string &origin() const;

  struct Impl;

private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// The `chat_template` of a parsed tokenizer_config.json: a string, or the
/// "default" entry of a list of {name, template}. Throws ChatTemplateError
/// when there is none.
std::string chatTemplateFromConfig(const nlohmann::ordered_json &config);

/// A special token of tokenizer_config.json (`bos_token`, `eos_token`) as
/// transformers.js passes it to the template: the string, or an object's
/// "content"; null when absent or null.
nlohmann::ordered_json specialTokenFromConfig(const nlohmann::ordered_json &config,
                                              const std::string &key);

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_CHATTEMPLATE_H
