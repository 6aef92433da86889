//===- HfTokenizer.cpp - Hugging Face tokenizer.json (BPE) ----------------===//
//
// A tokenizer read from a Hugging Face `tokenizer.json` with the BPE model:
// byte-level BPE (GPT-2 style: Qwen2/2.5/3, Llama-3, Mistral-Nemo) and
// SentencePiece-style BPE with byte fallback (Llama-2, Mistral v0.1). The
// pipeline is the one the `tokenizers` library runs, a stage a class
// (HfTokenizerDetail.h says which file holds each):
//
//   added tokens split out of the raw text (leftmost-longest)
//   -> normalizer (NFC/NFD/NFKC/NFKD via utf8proc, Prepend, Replace)
//   -> added tokens marked `normalized` split out of its output
//   -> pre-tokenizers (Split with a PCRE2 regex, ByteLevel)
//   -> the model: BPE merges by rank (lowest first, leftmost on ties)
//
// and decoding runs the decoder chain (ByteLevel, or Replace/ByteFallback/
// Fuse/Strip) with invalid UTF-8 replaced the way Rust's
// String::from_utf8_lossy does. Any component or option outside this set is
// refused at load with the JSON path named. tokenizer_config.json and
// generation_config.json next to the file give BOS/EOS/PAD, add_bos_token,
// every stop id and the chat template (this file). See docs/data.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace hflow::data {

namespace hf {

HfTokenizer::HfTokenizer(const std::string &path) : file_{path} {
  json j = parseJsonFile(path, "tokenizer file");
  if (!j.is_object())
    file_.fail("", "the file is not a JSON object");
  if (!j.contains("model") || !j["model"].is_object())
    file_.fail("", std::string("not a Hugging Face tokenizer.json: it has no 'model' object") +
                       (j.contains("model_type") ? " (this looks like a model's config.json)" : ""));
  model_.load(j["model"], file_);
  added_.load(j.value("added_tokens", json::array()), file_);
  buildTokenTable();
  if (j.contains("normalizer"))
    normalizer_.load(j["normalizer"], "normalizer", file_);
  if (j.contains("pre_tokenizer"))
    preTokenizer_.load(j["pre_tokenizer"], "pre_tokenizer", file_);
  if (j.contains("decoder"))
    decoder_.load(j["decoder"], "decoder", file_);
  int64_t templateBos = -1;
  if (j.contains("post_processor"))
    loadPostProcessor(j["post_processor"], "post_processor", templateBos);
  if (j.contains("truncation") && !j["truncation"].is_null())
    file_.fail("truncation", "truncation is not supported (the runtime sets lengths)");
  if (j.contains("padding") && !j["padding"].is_null())
    file_.fail("padding", "padding is not supported (the runtime pads)");
  vocabSize_ = model_.size();
  for (const auto &t : added_.all())
    vocabSize_ = std::max(vocabSize_, t.id + 1);
  loadConfigs(templateBos);
}

void HfTokenizer::buildTokenTable() {
  int64_t n = model_.size();
  for (const auto &t : added_.all())
    n = std::max(n, t.id + 1);
  tokenOf_.assign((size_t)n, std::string());
  hasToken_.assign((size_t)n, false);
  isSpecial_.assign((size_t)n, false);
  for (const auto &[tok, id] : model_.vocab()) {
    tokenOf_[(size_t)id] = tok;
    hasToken_[(size_t)id] = true;
  }
  for (const auto &t : added_.all()) {
    tokenOf_[(size_t)t.id] = t.content;
    hasToken_[(size_t)t.id] = true;
    isSpecial_[(size_t)t.id] = t.special;
  }
}

std::vector<int64_t> HfTokenizer::encode(const std::string &raw) const {
  // Rust strings are valid UTF-8: invalid bytes become U+FFFD, as a
  // lossy conversion would give.
  std::string text = isValidUtf8(raw) ? raw : lossyUtf8(raw);
  std::vector<int64_t> ids;
  for (auto &seg : added_.split(text, false)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    for (auto &s2 : added_.split(normalizer_.apply(seg.text), true)) {
      if (s2.id >= 0) {
        ids.push_back(s2.id);
        continue;
      }
      for (const std::string &word : preTokenizer_.apply(s2.text))
        model_.encode(word, preTokenizer_.byteLevel(), ids);
    }
  }
  return ids;
}

int64_t HfTokenizer::idOfToken(const std::string &s) const {
  const int64_t id = added_.idOf(s);
  return id >= 0 ? id : model_.idOf(s);
}

std::string HfTokenizer::decode(const std::vector<int64_t> &ids) const {
  return decodeImpl(ids, true);
}

std::string HfTokenizer::decodeKeepSpecial(const std::vector<int64_t> &ids) const {
  return decodeImpl(ids, false);
}

std::string HfTokenizer::decodeImpl(const std::vector<int64_t> &ids, bool skipSpecial) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= (int64_t)tokenOf_.size() || !hasToken_[(size_t)id])
      continue;
    if (skipSpecial && isSpecial_[(size_t)id])
      continue;
    toks.push_back(tokenOf_[(size_t)id]);
  }
  return decoder_.apply(std::move(toks));
}

std::string HfTokenizer::tokenText(int64_t id) const {
  if (id < 0 || id >= (int64_t)tokenOf_.size())
    return "";
  return tokenOf_[(size_t)id];
}

std::string HfTokenizer::specialTokenText(const std::string &which) const {
  auto it = specialText_.find(which);
  return it == specialText_.end() ? "" : it->second;
}

void HfTokenizer::loadPostProcessor(const json &p, const std::string &where, int64_t &bos) {
  if (p.is_null())
    return;
  std::string type = typeOf(p);
  if (type == "Sequence") {
    const json &list = p.value("processors", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      loadPostProcessor(list[k], where + ".processors[" + std::to_string(k) + "]", bos);
    return;
  }
  if (type == "ByteLevel")
    return;
  if (type != "TemplateProcessing")
    file_.fail(where, "post-processor '" + type + "' is not supported (supported: "
                "ByteLevel, TemplateProcessing, Sequence)");
  const json &single = p.value("single", json::array());
  bool seenSeq = false;
  for (const json &item : single) {
    if (item.contains("Sequence")) {
      seenSeq = true;
      continue;
    }
    if (!item.contains("SpecialToken") || seenSeq)
      file_.fail(where + ".single", "only a leading special token before the text is "
                              "supported (the runtime adds BOS, never EOS)");
    std::string name = item["SpecialToken"].value("id", std::string());
    const json &st = p.value("special_tokens", json::object());
    if (!st.contains(name) || !st[name].contains("ids") || st[name]["ids"].size() != 1)
      file_.fail(where + ".special_tokens", "'" + name + "' needs exactly one id");
    if (bos >= 0)
      file_.fail(where + ".single", "more than one leading special token");
    bos = st[name]["ids"][0].get<int64_t>();
  }
}

void HfTokenizer::loadConfigs(int64_t templateBos) {
  std::string dir = dirOf(file_.path);
  json tc = json::object(), gc = json::object();
  std::string tcPath = dir + "/tokenizer_config.json", gcPath = dir + "/generation_config.json";
  if (fileExists(tcPath))
    tc = parseJsonFile(tcPath, "tokenizer config");
  if (fileExists(gcPath))
    gc = parseJsonFile(gcPath, "generation config");
  if (!tc.is_object())
    throw std::runtime_error("tokenizer config '" + tcPath + "' is not a JSON object");
  if (!gc.is_object())
    throw std::runtime_error("generation config '" + gcPath + "' is not a JSON object");
  auto tokenId = [&](const std::string &key) -> int64_t {
    if (!tc.contains(key) || tc[key].is_null())
      return -1;
    const json &v = tc[key];
    std::string s;
    if (v.is_string())
      s = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      s = v["content"].get<std::string>();
    else
      throw std::runtime_error("tokenizer config '" + tcPath + "': '" + key +
                               "' must be a string or {\"content\": ...}");
    int64_t id = idOfToken(s);
    if (id < 0)
      throw std::runtime_error("tokenizer config '" + tcPath + "': " + key + " '" + s +
                               "' is not a token of '" + file_.path + "'");
    specialText_[key] = s;
    return id;
  };
  auto genId = [&](const std::string &key, std::vector<int64_t> &out) {
    if (!gc.contains(key) || gc[key].is_null())
      return;
    const json &v = gc[key];
    auto one = [&](const json &x) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocabSize_)
        throw std::runtime_error("generation config '" + gcPath + "': '" + key +
                                 "' must be token ids below " +
                                 std::to_string(vocabSize_) + " (got " + x.dump() + ")");
      out.push_back(x.get<int64_t>());
    };
    if (v.is_array())
      for (const json &x : v)
        one(x);
    else
      one(v);
  };
  int64_t bos = tokenId("bos_token"), eos = tokenId("eos_token"), pad = tokenId("pad_token");
  tokenId("unk_token");
  std::vector<int64_t> genEos, genBos, genPad;
  genId("eos_token_id", genEos);
  genId("bos_token_id", genBos);
  genId("pad_token_id", genPad);
  if (eos < 0 && !genEos.empty())
    eos = genEos.front();
  if (bos < 0 && !genBos.empty())
    bos = genBos.front();
  if (pad < 0 && !genPad.empty())
    pad = genPad.front();
  if (eos < 0)
    throw std::runtime_error(
        "tokenizer '" + file_.path + "': no EOS token (neither tokenizer_config.json's "
        "eos_token nor generation_config.json's eos_token_id), so generation "
        "could never stop");
  eos_ = eos;
  stops_ = {eos};
  for (int64_t id : genEos)
    if (std::find(stops_.begin(), stops_.end(), id) == stops_.end())
      stops_.push_back(id);
  pad_ = pad >= 0 ? pad : eos; // as verl and OpenRLHF do when there is none
  // BOS: tokenizer_config's add_bos_token when it says, else the
  // post-processor's leading special token.
  if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) {
    addBos_ = tc["add_bos_token"].get<bool>();
    bos_ = bos >= 0 ? bos : templateBos;
    if (addBos_ && bos_ < 0)
      throw std::runtime_error("tokenizer config '" + tcPath +
                               "': add_bos_token is true but there is no bos_token");
  } else {
    addBos_ = templateBos >= 0;
    bos_ = templateBos >= 0 ? templateBos : bos;
  }
  if (tc.contains("add_eos_token") && tc["add_eos_token"].is_boolean() &&
      tc["add_eos_token"].get<bool>())
    throw std::runtime_error("tokenizer config '" + tcPath +
                             "': add_eos_token true is not supported (a prompt "
                             "ending in EOS would end its response at once)");
  if (tc.contains("chat_template")) {
    const json &t = tc["chat_template"];
    if (t.is_string())
      chatTemplate_ = t.get<std::string>();
    else if (t.is_array()) {
      for (const json &e : t)
        if (e.is_object() && e.value("name", std::string()) == "default" &&
            e.contains("template") && e["template"].is_string())
          chatTemplate_ = e["template"].get<std::string>();
      if (chatTemplate_.empty())
        throw std::runtime_error("tokenizer config '" + tcPath +
                                 "': chat_template has no entry named 'default'");
    } else if (!t.is_null())
      throw std::runtime_error("tokenizer config '" + tcPath +
                               "': chat_template must be a string or a list of "
                               "{name, template}");
  }
}

} // namespace hf

using hf::HfTokenizer;
using hf::kReplacement;

std::unique_ptr<Tokenizer> makeHfTokenizer(const std::string &tokenizerJson) {
  return std::make_unique<HfTokenizer>(tokenizerJson);
}

// --- streaming decode ---------------------------------------------------------

std::string StreamDecoder::push(int64_t id) {
  pending_.push_back(id);
  std::vector<int64_t> all = context_;
  all.insert(all.end(), pending_.begin(), pending_.end());
  std::string before = tok_.decode(context_);
  std::string after = tok_.decode(all);
  // Wait while the text ends in an incomplete character (decoded as
  // U+FFFD) or has not grown.
  if (after.size() <= before.size() || after.compare(0, before.size(), before) != 0 ||
      (after.size() >= 3 && after.compare(after.size() - 3, 3, kReplacement) == 0))
    return "";
  context_ = pending_;
  pending_.clear();
  return after.substr(before.size());
}

std::string StreamDecoder::finish() {
  if (pending_.empty())
    return "";
  std::vector<int64_t> all = context_;
  all.insert(all.end(), pending_.begin(), pending_.end());
  std::string before = tok_.decode(context_);
  std::string after = tok_.decode(all);
  pending_.clear();
  context_.clear();
  return after.compare(0, before.size(), before) == 0 ? after.substr(before.size()) : after;
}

} // namespace hflow::data
