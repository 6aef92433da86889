//===- HfTokenizerLoad.cpp - the Hugging Face tokenizer: reading tokenizer.json and its configs ---===//
#include "runtime/data/HfTokenizerDetail.h"

#include <nlohmann/json.hpp>

#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace hflow::data::hf {

HfTokenizer::HfTokenizer(const std::string &path) : path_(path) {
  json j = parseJsonFile(path, "tokenizer file");
  if (!j.is_object())
    fail("", "the file is not a JSON object");
  if (!j.contains("model") || !j["model"].is_object())
    fail("", std::string("not a Hugging Face tokenizer.json: it has no 'model' object") +
                 (j.contains("model_type") ? " (this looks like a model's config.json)" : ""));
  loadModel(j["model"]);
  loadAddedTokens(j.value("added_tokens", json::array()));
  if (j.contains("normalizer"))
    loadNormalizer(j["normalizer"], "normalizer");
  if (j.contains("pre_tokenizer"))
    loadPreTokenizer(j["pre_tokenizer"], "pre_tokenizer");
  if (j.contains("decoder"))
    loadDecoder(j["decoder"], "decoder");
  int64_t templateBos = -1;
  if (j.contains("post_processor"))
    loadPostProcessor(j["post_processor"], "post_processor", templateBos);
  if (j.contains("truncation") && !j["truncation"].is_null())
    fail("truncation", "truncation is not supported (the runtime sets lengths)");
  if (j.contains("padding") && !j["padding"].is_null())
    fail("padding", "padding is not supported (the runtime pads)");
  for (const auto &t : added_)
    vocabSize_ = std::max(vocabSize_, t.id + 1);
  loadConfigs(templateBos);
}

[[noreturn]] void HfTokenizer::fail(const std::string &where, const std::string &msg) const {
  throw std::runtime_error("tokenizer '" + path_ + "'" +
                           (where.empty() ? "" : ": " + where) + ": " + msg);
}

std::string HfTokenizer::typeOf(const json &j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : "";
}

void HfTokenizer::loadModel(const json &m) {
  std::string type = typeOf(m);
  if (type.empty() && m.contains("merges"))
    type = "BPE"; // old files omit it
  if (type != "BPE")
    fail("model.type", "model type '" + (type.empty() ? std::string("?") : type) +
                           "' is not supported (hflow reads BPE tokenizers: "
                           "Qwen, Llama-2/3, Mistral)");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
    fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  for (const char *k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      fail(std::string("model.") + k, "a non-empty value is not supported");
  byteFallback_ = m.value("byte_fallback", false);
  ignoreMerges_ = m.value("ignore_merges", false);
  fuseUnk_ = m.value("fuse_unk", false);
  if (!m.contains("vocab") || !m["vocab"].is_object())
    fail("model.vocab", "missing or not an object");
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t(1) << 31))
      fail("model.vocab", "token '" + it.key() + "' has no valid id");
    int64_t id = it.value().get<int64_t>();
    vocab_[it.key()] = id;
    vocabSize_ = std::max(vocabSize_, id + 1);
  }
  tokenOf_.assign(vocabSize_, std::string());
  hasToken_.assign(vocabSize_, false);
  for (const auto &[tok, id] : vocab_) {
    tokenOf_[id] = tok;
    hasToken_[id] = true;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab_.find(m["unk_token"].get<std::string>());
    if (it == vocab_.end())
      fail("model.unk_token", "'" + m["unk_token"].get<std::string>() +
                                  "' is not in the vocabulary");
    unk_ = it->second;
  }
  const json &merges = m.value("merges", json::array());
  if (!merges.is_array())
    fail("model.merges", "not an array");
  merges_.reserve(merges.size() * 2);
  for (size_t r = 0; r < merges.size(); ++r) {
    const json &e = merges[r];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      auto sp = s.find(' ', 1);
      if (sp == std::string::npos)
        fail("model.merges[" + std::to_string(r) + "]", "'" + s + "' is not two tokens");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else
      fail("model.merges[" + std::to_string(r) + "]", "not \"a b\" or [\"a\", \"b\"]");
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      fail("model.merges[" + std::to_string(r) + "]",
           "merge '" + a + " " + b + "' names a token not in the vocabulary");
    uint64_t key = pairKey(ia->second, ib->second);
    // The first (lowest-rank) entry for a pair wins, as in `tokenizers`.
    merges_.emplace(key, Merge{(int32_t)r, (int32_t)iab->second});
  }
  const ByteAlphabet &ab = byteAlphabet();
  byteIds_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(ab.charOf[b]);
    if (it != vocab_.end())
      byteIds_[b] = it->second;
  }
  // Byte-fallback tokens <0x00>..<0xFF>.
  if (byteFallback_)
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = vocab_.find(name);
      byteToken_[b] = it == vocab_.end() ? -1 : it->second;
    }
}

void HfTokenizer::loadAddedTokens(const json &a) {
  if (!a.is_array())
    fail("added_tokens", "not an array");
  for (size_t k = 0; k < a.size(); ++k) {
    const json &e = a[k];
    std::string where = "added_tokens[" + std::to_string(k) + "]";
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() ||
        !e.contains("content") || !e["content"].is_string())
      fail(where, "needs an integer 'id' and a string 'content'");
    AddedToken t;
    t.id = e["id"].get<int64_t>();
    t.content = e["content"].get<std::string>();
    if (t.id < 0 || t.id >= (int64_t(1) << 31) || t.content.empty())
      fail(where, "bad id or empty content");
    t.special = e.value("special", false);
    t.normalized = e.value("normalized", !t.special);
    t.lstrip = e.value("lstrip", false);
    t.rstrip = e.value("rstrip", false);
    if (e.value("single_word", false))
      fail(where, "'single_word' added tokens are not supported");
    added_.push_back(t);
  }
  // Ids and texts of added tokens, for decoding.
  int64_t maxId = vocabSize_;
  for (const auto &t : added_)
    maxId = std::max(maxId, t.id + 1);
  tokenOf_.resize(maxId);
  hasToken_.resize(maxId, false);
  isSpecial_.assign(maxId, false);
  isAdded_.assign(maxId, false);
  for (const auto &t : added_) {
    tokenOf_[t.id] = t.content;
    hasToken_[t.id] = true;
    isSpecial_[t.id] = t.special;
    isAdded_[t.id] = true;
  }
  // Longest first, so the first hit at a position is the longest.
  for (const auto &t : added_) {
    auto &bucket = (t.normalized ? addedNorm_ : addedRaw_)[(unsigned char)t.content[0]];
    bucket.push_back(&t - added_.data());
  }
  for (auto *table : {&addedRaw_, &addedNorm_})
    for (auto &bucket : *table)
      std::stable_sort(bucket.begin(), bucket.end(), [&](size_t x, size_t y) {
        return added_[x].content.size() > added_[y].content.size();
      });
}

void HfTokenizer::loadNormalizer(const json &n, const std::string &where) {
  if (n.is_null())
    return;
  std::string type = typeOf(n);
  if (type == "Sequence") {
    const json &list = n.value("normalizers", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      loadNormalizer(list[k], where + ".normalizers[" + std::to_string(k) + "]");
    return;
  }
  Normalizer x{Normalizer::NFC, "", ""};
  if (type == "NFC")
    x.kind = Normalizer::NFC;
  else if (type == "NFD")
    x.kind = Normalizer::NFD;
  else if (type == "NFKC")
    x.kind = Normalizer::NFKC;
  else if (type == "NFKD")
    x.kind = Normalizer::NFKD;
  else if (type == "Prepend") {
    x.kind = Normalizer::Prepend;
    x.a = n.value("prepend", std::string());
  } else if (type == "Replace") {
    x.kind = Normalizer::Replace;
    const json &p = n.value("pattern", json::object());
    if (!p.contains("String") || !p["String"].is_string())
      fail(where + ".pattern", "only a String pattern is supported for Replace");
    x.a = p["String"].get<std::string>();
    x.b = n.value("content", std::string());
  } else
    fail(where, "normalizer '" + type + "' is not supported (supported: NFC, NFD, "
                "NFKC, NFKD, Prepend, Replace, Sequence)");
  normalizers_.push_back(x);
}

void HfTokenizer::loadPreTokenizer(const json &p, const std::string &where) {
  if (p.is_null())
    return;
  std::string type = typeOf(p);
  if (type == "Sequence") {
    const json &list = p.value("pretokenizers", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      loadPreTokenizer(list[k], where + ".pretokenizers[" + std::to_string(k) + "]");
    return;
  }
  PreTokenizer x{PreTokenizer::Split};
  if (type == "Split") {
    if (p.value("invert", false))
      fail(where, "an inverted Split is not supported");
    const json &pat = p.value("pattern", json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string())
      x.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(),
                                        "tokenizer '" + path_ + "': " + where + ".pattern");
    else if (pat.contains("String") && pat["String"].is_string())
      x.literal = pat["String"].get<std::string>();
    else
      fail(where + ".pattern", "needs a Regex or a String");
    if (!x.regex && x.literal.empty())
      fail(where + ".pattern", "the String is empty");
    std::string b = p.value("behavior", std::string("Isolated"));
    if (b == "Isolated")
      x.behavior = PreTokenizer::Isolated;
    else if (b == "Removed")
      x.behavior = PreTokenizer::Removed;
    else if (b == "MergedWithPrevious")
      x.behavior = PreTokenizer::MergedWithPrevious;
    else if (b == "MergedWithNext")
      x.behavior = PreTokenizer::MergedWithNext;
    else
      fail(where + ".behavior", "behavior '" + b + "' is not supported");
  } else if (type == "ByteLevel") {
    x.kind = PreTokenizer::ByteLevel;
    x.addPrefixSpace = p.value("add_prefix_space", false);
    x.useRegex = p.value("use_regex", true);
    if (x.useRegex)
      x.regex = std::make_shared<Regex>(kGpt2Pattern, "the GPT-2 pattern");
    byteLevel_ = true;
  } else
    fail(where, "pre-tokenizer '" + type + "' is not supported (supported: Split, "
                "ByteLevel, Sequence)");
  preTokenizers_.push_back(x);
}

void HfTokenizer::loadDecoder(const json &d, const std::string &where) {
  if (d.is_null())
    return;
  std::string type = typeOf(d);
  if (type == "Sequence") {
    const json &list = d.value("decoders", json::array());
    for (size_t k = 0; k < list.size(); ++k)
      loadDecoder(list[k], where + ".decoders[" + std::to_string(k) + "]");
    return;
  }
  DecoderStep x{DecoderStep::ByteLevel};
  if (type == "ByteLevel")
    x.kind = DecoderStep::ByteLevel;
  else if (type == "ByteFallback")
    x.kind = DecoderStep::ByteFallback;
  else if (type == "Fuse")
    x.kind = DecoderStep::Fuse;
  else if (type == "Replace") {
    x.kind = DecoderStep::Replace;
    const json &p = d.value("pattern", json::object());
    if (!p.contains("String") || !p["String"].is_string())
      fail(where + ".pattern", "only a String pattern is supported for Replace");
    x.a = p["String"].get<std::string>();
    x.b = d.value("content", std::string());
  } else if (type == "Strip") {
    x.kind = DecoderStep::Strip;
    x.a = d.value("content", std::string(" "));
    x.start = d.value("start", 0);
    x.stop = d.value("stop", 0);
    size_t len = 0;
    if (x.a.empty() || decodeValidUtf8(x.a, 0, len), len != x.a.size())
      fail(where + ".content", "must be one character");
  } else
    fail(where, "decoder '" + type + "' is not supported (supported: ByteLevel, "
                "Replace, ByteFallback, Fuse, Strip, Sequence)");
  decoders_.push_back(x);
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
    fail(where, "post-processor '" + type + "' is not supported (supported: "
                "ByteLevel, TemplateProcessing, Sequence)");
  const json &single = p.value("single", json::array());
  bool seenSeq = false;
  for (const json &item : single) {
    if (item.contains("Sequence")) {
      seenSeq = true;
      continue;
    }
    if (!item.contains("SpecialToken") || seenSeq)
      fail(where + ".single", "only a leading special token before the text is "
                              "supported (the runtime adds BOS, never EOS)");
    std::string name = item["SpecialToken"].value("id", std::string());
    const json &st = p.value("special_tokens", json::object());
    if (!st.contains(name) || !st[name].contains("ids") || st[name]["ids"].size() != 1)
      fail(where + ".special_tokens", "'" + name + "' needs exactly one id");
    if (bos >= 0)
      fail(where + ".single", "more than one leading special token");
    bos = st[name]["ids"][0].get<int64_t>();
  }
}

void HfTokenizer::loadConfigs(int64_t templateBos) {
  std::string dir = dirOf(path_);
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
                               "' is not a token of '" + path_ + "'");
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
        "tokenizer '" + path_ + "': no EOS token (neither tokenizer_config.json's "
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

} // namespace hflow::data::hf
