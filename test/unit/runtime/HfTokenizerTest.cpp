//===- HfTokenizerTest.cpp - tokenizer.json: hand-checked cases and errors -===//
//
// The real Qwen/Llama/Mistral files are checked id for id against Hugging
// Face's Rust `tokenizers` in test/integration/tokenizer-*.test; these are
// the small cases worked out by hand, and every refusal.
//
//===----------------------------------------------------------------------===//
#include "runtime/data/Prompt.h"
#include "runtime/data/Tokenizer.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace hflow::data;

namespace {

/// The directories this process made, removed at exit.
struct Dirs {
  std::vector<std::string> all;
  ~Dirs() {
    std::error_code ec;
    for (const auto &d : all)
      fs::remove_all(d, ec);
  }
};

std::string newDir() {
  static Dirs dirs;
  char tmpl[] = "/tmp/hflow-hftok-test-XXXXXX";
  if (!::mkdtemp(tmpl))
    throw std::runtime_error("mkdtemp failed");
  dirs.all.push_back(tmpl);
  return tmpl;
}

void write(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "(no error)";
}

/// GPT-2's byte -> char table, written out independently of the code
/// under test.
std::string byteChar(int b) {
  static std::vector<std::string> table = [] {
    std::vector<int> cps(256, -1);
    int n = 0;
    for (int c = 0; c < 256; ++c) {
      bool keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
      cps[c] = keep ? c : 256 + n++;
    }
    std::vector<std::string> t;
    for (int cp : cps) {
      std::string s;
      if (cp < 0x80)
        s += char(cp);
      else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      }
      t.push_back(s);
    }
    return t;
  }();
  return table[b];
}

/// A byte-level tokenizer: ids 0..255 are the bytes; "Ġt" 256, "he" 257,
/// "Ġthe" 258; added tokens <|end|> 300 (special), <x> 301 (not special).
json byteLevelJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[byteChar(b)] = b;
  vocab[byteChar(' ') + "t"] = 256;
  vocab["he"] = 257;
  vocab[byteChar(' ') + "the"] = 258;
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array(
      {{{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"normalized", false},
        {"lstrip", false}, {"rstrip", false}, {"single_word", false}},
       {{"id", 301}, {"content", "<x>"}, {"special", false}, {"normalized", false},
        {"lstrip", false}, {"rstrip", false}, {"single_word", false}}});
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", " ?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["post_processor"] = {{"type", "ByteLevel"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", json::array({byteChar(' ') + " t", "h e",
                                        json::array({byteChar(' ') + "t", "he"})})}};
  return j;
}

std::string writeTokenizer(const json &tok, const json &config = json(),
                           const json &gen = json()) {
  std::string d = newDir();
  write(d + "/tokenizer.json", tok.dump());
  if (!config.is_null())
    write(d + "/tokenizer_config.json", config.dump());
  if (!gen.is_null())
    write(d + "/generation_config.json", gen.dump());
  return d;
}

const json kConfig = {{"eos_token", "<|end|>"}, {"chat_template", "{{ messages }}"}};

} // namespace

TEST(HfTokenizer, ByteLevelMergesAndAddedTokens) {
  std::string d = writeTokenizer(byteLevelJson(), kConfig);
  auto tok = makeTokenizer(d);
  EXPECT_EQ(tok->name(), "hf:" + d + "/tokenizer.json");
  EXPECT_EQ(tok->vocabSize(), 302);
  // " the" merges to one id; "the" cannot use the "Ġt" merge.
  EXPECT_EQ(tok->encode(" the"), (std::vector<int64_t>{258}));
  EXPECT_EQ(tok->encode("the"), (std::vector<int64_t>{'t', 257}));
  // Added tokens split first, so " the" before one still merges.
  EXPECT_EQ(tok->encode(" the<|end|>the<x>"),
            (std::vector<int64_t>{258, 300, 't', 257, 301}));
  EXPECT_EQ(tok->decode({258, 300, 't', 257, 301}), " thethe<x>");
  EXPECT_EQ(tok->decodeKeepSpecial({258, 300, 't', 257, 301}), " the<|end|>the<x>");
  EXPECT_EQ(tok->eosId(), 300);
  EXPECT_EQ(tok->padId(), 300); // none named: EOS
  EXPECT_EQ(tok->bosId(), -1);
  EXPECT_EQ(tok->stopIds(), (std::vector<int64_t>{300}));
  EXPECT_EQ(tok->chatTemplate(), "{{ messages }}");
  EXPECT_EQ(tok->specialTokenText("eos_token"), "<|end|>");
  EXPECT_EQ(tok->tokenText(257), "he");
  // Out-of-range and unknown ids are skipped.
  EXPECT_EQ(tok->decode({-1, 258, 299, 100000}), " the");
}

TEST(HfTokenizer, NfcAndInvalidUtf8) {
  std::string d = writeTokenizer(byteLevelJson(), kConfig);
  auto tok = makeTokenizer(d);
  // e + U+0301 (combining acute) becomes é (C3 A9) before the model.
  EXPECT_EQ(tok->encode("e\xCC\x81"), (std::vector<int64_t>{0xC3, 0xA9}));
  // Invalid bytes become U+FFFD (EF BF BD), as a Rust string would hold.
  EXPECT_EQ(tok->encode("\xFF"), (std::vector<int64_t>{0xEF, 0xBF, 0xBD}));
  // A truncated sequence decodes to one U+FFFD per maximal invalid part.
  EXPECT_EQ(tok->decode({0xC3}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode({0xE2, 0x82, 'a'}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(tok->decode({0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
}

TEST(HfTokenizer, StreamDecoderHoldsSplitCharacters) {
  std::string d = writeTokenizer(byteLevelJson(), kConfig);
  auto tok = makeTokenizer(d);
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(258), " the");
  EXPECT_EQ(sd.push(0xF0), "");
  EXPECT_EQ(sd.push(0x9F), "");
  EXPECT_EQ(sd.push(0x98), "");
  EXPECT_EQ(sd.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(sd.push(300), ""); // special: decode() renders nothing
  EXPECT_EQ(sd.push('a'), "a");
  EXPECT_EQ(sd.push(0xC3), "");
  EXPECT_EQ(sd.finish(), "\xEF\xBF\xBD");
}

TEST(HfTokenizer, ConfigsGiveBosEosPadAndStops) {
  json cfg = {{"bos_token", {{"content", "<x>"}}},
              {"eos_token", "<|end|>"},
              {"pad_token", "!"},
              {"add_bos_token", true},
              {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                             {{"name", "default"}, {"template", "D"}}})}};
  json gen = {{"eos_token_id", json::array({301, 300, 5})}};
  auto tok = makeTokenizer(writeTokenizer(byteLevelJson(), cfg, gen));
  EXPECT_EQ(tok->bosId(), 301);
  EXPECT_EQ(tok->eosId(), 300);
  EXPECT_EQ(tok->padId(), '!');
  EXPECT_EQ(tok->stopIds(), (std::vector<int64_t>{300, 301, 5}));
  EXPECT_EQ(tok->chatTemplate(), "D");
  // Never added by encode(): the caller prepends bosId().
  EXPECT_EQ(tok->encode("a"), (std::vector<int64_t>{'a'}));

  // No tokenizer_config.json: EOS from generation_config.json; BOS from a
  // TemplateProcessing post-processor.
  json t = byteLevelJson();
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<x>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<x>", {{"id", "<x>"}, {"ids", {301}}, {"tokens", {"<x>"}}}}}}};
  tok = makeTokenizer(writeTokenizer(t, json(), {{"eos_token_id", 300}, {"pad_token_id", 0}}));
  EXPECT_EQ(tok->bosId(), 301);
  EXPECT_EQ(tok->eosId(), 300);
  EXPECT_EQ(tok->padId(), 0);
}

TEST(HfTokenizer, SentencePieceStyle) {
  // Llama-2's layout: Prepend + Replace normalizers, no pre-tokenizer,
  // byte fallback, and the Replace/ByteFallback/Fuse/Strip decoder.
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::string sp = "\xE2\x96\x81"; // U+2581
  vocab[sp] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["hi"] = 262;
  vocab[sp + "hi"] = 263;
  json t;
  t["added_tokens"] = json::array({{{"id", 2}, {"content", "</s>"}, {"special", true},
                                    {"normalized", false}}});
  t["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", sp}},
                                                  {{"type", "Replace"},
                                                   {"pattern", {{"String", " "}}},
                                                   {"content", sp}}})}};
  t["pre_tokenizer"] = nullptr;
  t["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"},
                                             {"pattern", {{"String", sp}}},
                                             {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "},
                                             {"start", 1}, {"stop", 0}}})}};
  t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"unk_token", "<unk>"},
                {"byte_fallback", true}, {"fuse_unk", true},
                {"merges", json::array({"h i", sp + " hi"})}};
  auto tok = makeTokenizer(writeTokenizer(t, {{"eos_token", "</s>"}}));
  // "hi é": ▁hi ▁ then é by byte fallback (C3 A9).
  EXPECT_EQ(tok->encode("hi \xC3\xA9"), (std::vector<int64_t>{263, 259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->decode({263, 259, 3 + 0xC3, 3 + 0xA9}), "hi \xC3\xA9");
  // A lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(tok->decode({263, 3 + 0xA9}), "hi\xEF\xBF\xBD");
}

TEST(HfTokenizer, MakeTokenizerPicksTheFile) {
  std::string d = writeTokenizer(byteLevelJson(), kConfig);
  // The .json path itself, and a JSON file under another name.
  EXPECT_EQ(makeTokenizer(d + "/tokenizer.json")->vocabSize(), 302);
  fs::copy_file(d + "/tokenizer.json", d + "/renamed.model");
  EXPECT_EQ(makeTokenizer(d + "/renamed.model")->name(), "hf:" + d + "/renamed.model");
}

TEST(HfTokenizer, Refusals) {
  auto err = [](const json &t, const json &cfg = kConfig, const json &gen = json()) {
    std::string d = writeTokenizer(t, cfg, gen);
    return errorOf([&] { makeTokenizer(d); });
  };
  auto has = [](const std::string &e, const std::string &what) {
    return e.find(what) != std::string::npos;
  };
  std::string d = newDir();
  write(d + "/tokenizer.json", "{\"model\": ");
  std::string e = errorOf([&] { makeTokenizer(d); });
  EXPECT_TRUE(has(e, "tokenizer file '" + d + "/tokenizer.json' is not valid JSON")) << e;

  e = err({{"model_type", "llama"}});
  EXPECT_TRUE(has(e, "has no 'model' object (this looks like a model's config.json)")) << e;

  json t = byteLevelJson();
  t["model"]["type"] = "Unigram";
  e = err(t);
  EXPECT_TRUE(has(e, "model.type: model type 'Unigram' is not supported")) << e;

  t = byteLevelJson();
  t["normalizer"] = {{"type", "Lowercase"}};
  e = err(t);
  EXPECT_TRUE(has(e, "normalizer: normalizer 'Lowercase' is not supported")) << e;

  t = byteLevelJson();
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  e = err(t);
  EXPECT_TRUE(has(e, "pre_tokenizer.pretokenizers[0].pattern: the regex does not compile")) << e;

  t = byteLevelJson();
  t["pre_tokenizer"]["pretokenizers"][1]["type"] = "Whitespace";
  e = err(t);
  EXPECT_TRUE(has(e, "pre_tokenizer.pretokenizers[1]: pre-tokenizer 'Whitespace' is not supported")) << e;

  t = byteLevelJson();
  t["model"]["merges"].push_back("q zz");
  e = err(t);
  EXPECT_TRUE(has(e, "model.merges[3]: merge 'q zz' names a token not in the vocabulary")) << e;

  t = byteLevelJson();
  t["model"]["dropout"] = 0.1;
  EXPECT_TRUE(has(err(t), "BPE dropout is not supported"));

  t = byteLevelJson();
  t["added_tokens"][0]["single_word"] = true;
  EXPECT_TRUE(has(err(t), "added_tokens[0]: 'single_word' added tokens are not supported"));

  t = byteLevelJson();
  t["decoder"] = {{"type", "WordPiece"}};
  EXPECT_TRUE(has(err(t), "decoder: decoder 'WordPiece' is not supported"));

  t = byteLevelJson();
  t["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_TRUE(has(err(t), "post-processor 'BertProcessing' is not supported"));

  e = err(byteLevelJson(), json::object());
  EXPECT_TRUE(has(e, "no EOS token")) << e;
  e = err(byteLevelJson(), {{"eos_token", "<nope>"}});
  EXPECT_TRUE(has(e, "eos_token '<nope>' is not a token of")) << e;
  e = err(byteLevelJson(), {{"eos_token", "<|end|>"}, {"add_eos_token", true}});
  EXPECT_TRUE(has(e, "add_eos_token true is not supported")) << e;
  e = err(byteLevelJson(), kConfig, {{"eos_token_id", json::array({300, 999})}});
  EXPECT_TRUE(has(e, "'eos_token_id' must be token ids below 302 (got 999)")) << e;
  e = err(byteLevelJson(), {{"eos_token", "<|end|>"}, {"chat_template", 3}});
  EXPECT_TRUE(has(e, "chat_template must be a string or a list")) << e;
}

TEST(HfTokenizer, PromptEncoder) {
  json cfg = {{"eos_token", "<|end|>"},
              {"bos_token", "<x>"},
              {"add_bos_token", true},
              {"chat_template", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                                "{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
                                "[assistant]{% endif %}"}};
  auto tok = makeTokenizer(writeTokenizer(byteLevelJson(), cfg));
  PromptEncoder pe(*tok);
  EXPECT_TRUE(pe.hasTemplate());
  Example text;
  text.prompt = " the";
  // Plain text: BOS, then the text.
  EXPECT_EQ(pe.encode(text, "d.jsonl"), (std::vector<int64_t>{301, 258}));
  Example ids;
  ids.promptIds = {1, 2, 3};
  EXPECT_EQ(pe.encode(ids, "d.jsonl"), (std::vector<int64_t>{1, 2, 3}));
  // A chat: the template (which writes BOS itself) with the generation
  // prompt; no second BOS.
  Example chat;
  chat.messages = R"([{"role":"user","content":"hi"}])";
  chat.line = 7;
  EXPECT_EQ(pe.text(chat, "d.jsonl"), "<x>[user]hi[assistant]");
  std::vector<int64_t> got = pe.encode(chat, "d.jsonl");
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0], 301);
  EXPECT_EQ(std::count(got.begin(), got.end(), 301), 1);
  EXPECT_EQ(tok->decodeKeepSpecial(got), "<x>[user]hi[assistant]");

  // A template that raises names the data line.
  cfg["chat_template"] = "{{ raise_exception('only one turn') }}";
  auto tok2 = makeTokenizer(writeTokenizer(byteLevelJson(), cfg));
  PromptEncoder pe2(*tok2);
  std::string e = errorOf([&] { pe2.encode(chat, "d.jsonl"); });
  EXPECT_EQ(e.rfind("d.jsonl:7: rendering the chat template: ", 0), 0u) << e;
  EXPECT_NE(e.find("only one turn"), std::string::npos) << e;
  // No template at all.
  cfg.erase("chat_template");
  auto tok3 = makeTokenizer(writeTokenizer(byteLevelJson(), cfg));
  PromptEncoder pe3(*tok3);
  EXPECT_FALSE(pe3.hasTemplate());
  e = errorOf([&] { pe3.encode(chat, "d.jsonl"); });
  EXPECT_NE(e.find("d.jsonl:7: the prompt is a chat (a list of messages) but the "
                   "tokenizer"), std::string::npos) << e;
  // A template outside the supported subset fails at construction.
  cfg["chat_template"] = "{% include 'x' %}";
  auto tok4 = makeTokenizer(writeTokenizer(byteLevelJson(), cfg));
  e = errorOf([&] { PromptEncoder bad(*tok4); });
  EXPECT_NE(e.find("tokenizer_config.json: chat_template:1:"), std::string::npos) << e;
}
