//===- ChatTemplate.cpp - Hugging Face chat-template renderer ---------------===//
//
// A small Jinja2 subset with the semantics of @huggingface/jinja 0.5.x. The
// pipeline: preprocess (the text rewrites that renderer applies before
// lexing, with a map back to source positions) -> tokens -> AST (checked for
// the supported subset) -> tree-walking interpreter over JS-like values,
// each stage in a file of its own (runtime/data/TemplateDetail.h). See
// ChatTemplate.h.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/ChatTemplate.h"
#include "runtime/data/TemplateDetail.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace hflow {
namespace data {

using namespace tmpl;

struct ChatTemplate::Impl {
  std::string origin;
  std::vector<uint32_t> lines;
  std::vector<NodeP> body;

  std::string where(uint32_t pos) const {
    auto it = std::upper_bound(lines.begin(), lines.end(), pos);
    size_t line = static_cast<size_t>(it - lines.begin());
    uint32_t col = pos - lines[line - 1] + 1;
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col) + ": ";
  }
};

ChatTemplate ChatTemplate::parse(const std::string &source, const std::string &origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  std::u32string src = toU32(source);
  impl->lines = lineStarts(src);
  try {
    MappedText pre = preprocess(src);
    uint32_t endPos = static_cast<uint32_t>(src.size());
    impl->body = parseProgram(tokenize(pre, endPos), endPos);
  } catch (const Located &e) {
    throw ChatTemplateError(impl->where(e.pos) + e.what());
  }
  return ChatTemplate(std::move(impl));
}

std::string ChatTemplate::render(const nlohmann::ordered_json &vars) const {
  return render(vars, ChatTemplateRenderOptions());
}

std::string ChatTemplate::render(const nlohmann::ordered_json &vars,
                                 const ChatTemplateRenderOptions &options) const {
  const Impl &im = *impl_;
  if (!vars.is_object() && !vars.is_null())
    throw ChatTemplateError(im.origin + ": render variables must be a JSON object");
  Env global(nullptr);
  global.set("namespace", mkFunc(FuncData::Global, "namespace"));
  global.set("false", mkBool(false));
  global.set("true", mkBool(true));
  global.set("none", mkNull());
  global.set("raise_exception", mkFunc(FuncData::Global, "raise_exception"));
  global.set("range", mkFunc(FuncData::Global, "range"));
  global.set("strftime_now", mkFunc(FuncData::Global, "strftime_now"));
  global.set("True", mkBool(true));
  global.set("False", mkBool(false));
  global.set("None", mkNull());
  try {
    if (vars.is_object()) {
      for (auto it = vars.begin(); it != vars.end(); ++it) {
        if (global.findLocal(it.key()))
          throw ChatTemplateError(im.origin + ": render variable '" + it.key() +
                                  "' is already declared (a built-in name)");
        global.set(it.key(), fromJson(it.value()));
      }
    }
  } catch (const JsError &e) {
    throw ChatTemplateError(im.origin + ": " + e.what());
  }
  std::string out;
  try {
    renderProgram(im.body, global, options.now, out);
  } catch (const std::bad_alloc &) {
    throw ChatTemplateError(im.origin + ": rendering ran out of memory (output " +
                            std::to_string(out.size()) +
                            " bytes so far): a string or list grew past what this process "
                            "may allocate");
  } catch (const Located &e) {
    throw ChatTemplateError(im.where(e.pos) + e.what());
  } catch (const Raised &r) {
    throw ChatTemplateError(im.where(r.pos) + "template raised: " + r.msg);
  } catch (const JsError &e) {
    throw ChatTemplateError(im.origin + ": " + e.what());
  }
  return out;
}

const std::string &ChatTemplate::origin() const { return impl_->origin; }

std::string chatTemplateFromConfig(const nlohmann::ordered_json &config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    throw ChatTemplateError("tokenizer config has no chat_template");
  if (it->is_string())
    return it->get<std::string>();
  if (it->is_array()) {
    for (auto &e : *it)
      if (e.is_object() && e.value("name", std::string()) == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    throw ChatTemplateError("tokenizer config's chat_template list has no \"default\" entry");
  }
  throw ChatTemplateError("tokenizer config's chat_template is neither a string nor a list");
}

nlohmann::ordered_json specialTokenFromConfig(const nlohmann::ordered_json &config, const std::string &key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null())
    return nullptr;
  if (it->is_string())
    return *it;
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string())
      return *c;
  }
  return nullptr;
}

} // namespace data
} // namespace hflow
