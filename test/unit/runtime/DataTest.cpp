//===- DataTest.cpp - runtime/data: datasets, tokenizers, sampler, rewards -===//
#include "runtime/data/Dataset.h"
#include "runtime/data/Rewards.h"
#include "runtime/data/Tokenizer.h"
#include "runtime/schema/RewardRules.h"

#include <sentencepiece_trainer.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace hflow::data;

namespace {

/// A directory of this process's own under /tmp (lit runs test cases in
/// parallel processes), removed at exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/hflow-data-test-XXXXXX";
    if (!::mkdtemp(tmpl))
      throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const std::string &tmp() {
  static TempDir dir;
  return dir.path;
}

std::string writeFile(const std::string &name, const std::string &content) {
  std::string p = tmp() + "/" + name;
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

std::string readFile(const std::string &p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The message of the std::runtime_error `f` throws ("" when it does not).
std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

std::string dataFile(const std::string &name) {
  return std::string(HFLOW_DATA_TEST_DIR) + "/" + name;
}

// --- a tiny SentencePiece model, trained here --------------------------------

const char *kCorpus[] = {
    "the quick brown fox jumps over the lazy dog",
    "a lazy dog sleeps in the sun all day long",
    "the brown fox and the quick dog are friends",
    "jumps and runs over the hill with the fox",
    "pack my box with five dozen liquor jugs",
    "how vexingly quick daft zebras jump",
};

/// Trains a BPE model of `vocab` pieces; `extra` adds trainer flags.
std::string trainModel(const std::string &name, const std::string &extra) {
  std::string corpus = tmp() + "/corpus.txt";
  if (!fs::exists(corpus)) {
    std::ofstream out(corpus);
    for (int rep = 0; rep < 20; ++rep)
      for (const char *line : kCorpus)
        out << line << "\n";
  }
  std::string prefix = tmp() + "/" + name;
  std::string args = "--input=" + corpus + " --model_prefix=" + prefix +
                     " --vocab_size=64 --model_type=bpe"
                     " --character_coverage=1.0 --num_threads=1 --minloglevel=1 " +
                     extra;
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok())
    throw std::runtime_error("SentencePiece training failed: " +
                             status.ToString());
  return prefix + ".model";
}

/// With a pad piece (id 3); unk 0, bos 1, eos 2 are the trainer's defaults.
const std::string &padModel() {
  static std::string p = trainModel("sp_pad", "--pad_id=3");
  return p;
}
/// Without a pad piece (the trainer's default, as in Llama-2's model).
const std::string &noPadModel() {
  static std::string p = trainModel("sp_nopad", "");
  return p;
}

} // namespace

// --- tokenizers --------------------------------------------------------------

TEST(DataTokenizer, ByteRoundTrip) {
  auto tok = makeByteTokenizer();
  EXPECT_EQ(tok->name(), "byte");
  EXPECT_EQ(tok->vocabSize(), 256);
  EXPECT_EQ(tok->eosId(), 10);
  EXPECT_EQ(tok->padId(), 0);
  EXPECT_EQ(tok->bosId(), -1);

  std::string text = "12+7=19\n";
  EXPECT_EQ(tok->encode(text),
            (std::vector<int64_t>{'1', '2', '+', '7', '=', '1', '9', '\n'}));
  // Non-ASCII (UTF-8 "é€"), a NUL and invalid UTF-8: every byte is its id.
  std::string bytes = std::string("caf\xc3\xa9 \xe2\x82\xac") + '\0' + "\xff\x80";
  std::vector<int64_t> ids = tok->encode(bytes);
  ASSERT_EQ(ids.size(), bytes.size());
  EXPECT_EQ(ids[3], 0xc3);
  EXPECT_EQ(ids[4], 0xa9);
  EXPECT_EQ(ids[ids.size() - 2], 0xff);
  for (int64_t id : ids)
    EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tok->decode(ids), bytes);
  // All 256 values round-trip.
  std::vector<int64_t> all(256);
  for (int i = 0; i < 256; ++i)
    all[i] = i;
  EXPECT_EQ(tok->encode(tok->decode(all)), all);
  // Out-of-vocabulary ids are skipped, never thrown on.
  EXPECT_EQ(tok->decode({'h', 256, -1, 'i', 100000}), "hi");
  EXPECT_EQ(tok->decode({}), "");
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(DataTokenizer, SentencePieceRoundTrip) {
  auto tok = makeSentencePieceTokenizer(padModel());
  EXPECT_EQ(tok->vocabSize(), 64);
  EXPECT_EQ(tok->bosId(), 1);
  EXPECT_EQ(tok->eosId(), 2);
  EXPECT_EQ(tok->padId(), 3);
  EXPECT_EQ(tok->name(), "sentencepiece:" + padModel());

  for (std::string text : {"the quick brown fox", "a lazy dog jumps over the hill",
                           "zebras"}) {
    std::vector<int64_t> ids = tok->encode(text);
    ASSERT_FALSE(ids.empty()) << text;
    EXPECT_LT(ids.size(), text.size()) << "BPE merged nothing in: " << text;
    for (int64_t id : ids)
      EXPECT_TRUE(id >= 0 && id < 64) << id;
    EXPECT_EQ(tok->decode(ids), text);
    // Control ids render as nothing; out-of-range ids are skipped.
    std::vector<int64_t> framed = {tok->bosId()};
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.push_back(64);
    framed.push_back(-7);
    framed.push_back(tok->eosId());
    EXPECT_EQ(tok->decode(framed), text);
  }
  // Encoding never adds BOS/EOS itself.
  std::vector<int64_t> ids = tok->encode("the dog");
  EXPECT_NE(ids.front(), tok->bosId());
  EXPECT_NE(ids.back(), tok->eosId());
}

TEST(DataTokenizer, SentencePieceWithoutPadFallsBackToZero) {
  auto tok = makeSentencePieceTokenizer(noPadModel());
  EXPECT_EQ(tok->padId(), 0);
  EXPECT_EQ(tok->bosId(), 1);
  EXPECT_EQ(tok->eosId(), 2);
  EXPECT_EQ(tok->decode(tok->encode("the lazy fox")), "the lazy fox");
}

TEST(DataTokenizer, SentencePieceWithoutEosIsRefused) {
  std::string model = trainModel("sp_noeos", "--eos_id=-1");
  std::string e = errorOf([&] { makeSentencePieceTokenizer(model); });
  EXPECT_EQ(e, "cannot use SentencePiece model '" + model +
                   "': it defines no EOS piece, so generation could never stop");
}

TEST(DataTokenizer, MakeTokenizer) {
  EXPECT_EQ(makeTokenizer("byte")->name(), "byte");
  EXPECT_EQ(makeTokenizer(padModel())->eosId(), 2);
  // A Hugging Face style directory holding tokenizer.model.
  fs::create_directories(tmp() + "/hfdir");
  fs::copy_file(padModel(), tmp() + "/hfdir/tokenizer.model",
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(makeTokenizer(tmp() + "/hfdir")->name(),
            "sentencepiece:" + tmp() + "/hfdir/tokenizer.model");
}

TEST(DataTokenizer, MakeTokenizerErrors) {
  std::string e = errorOf([] { makeTokenizer(""); });
  EXPECT_NE(e.find("empty tokenizer name"), std::string::npos) << e;
  EXPECT_NE(e.find("\"byte\""), std::string::npos) << e;

  e = errorOf([] { makeTokenizer("bpe"); });
  EXPECT_NE(e.find("unknown tokenizer 'bpe'"), std::string::npos) << e;
  EXPECT_NE(e.find("\"byte\""), std::string::npos) << e;
  EXPECT_NE(e.find(".model"), std::string::npos) << e;

  e = errorOf([] { makeTokenizer("/nonexistent/tokenizer.model"); });
  EXPECT_EQ(e, "cannot load SentencePiece model '/nonexistent/tokenizer.model': "
               "No such file or directory");

  std::string junk = writeFile("junk.model", "this is not a protobuf");
  e = errorOf([&] { makeTokenizer(junk); });
  EXPECT_EQ(e.rfind("cannot load SentencePiece model '" + junk + "': ", 0), 0u)
      << e;
  e = errorOf([&] { makeSentencePieceTokenizer(junk); });
  EXPECT_EQ(e.rfind("cannot load SentencePiece model '" + junk + "': ", 0), 0u)
      << e;

  fs::create_directories(tmp() + "/emptydir");
  e = errorOf([&] { makeTokenizer(tmp() + "/emptydir"); });
  EXPECT_NE(e.find("the directory has neither tokenizer.json nor tokenizer.model"),
            std::string::npos) << e;
  e = errorOf([&] { makeSentencePieceTokenizer(tmp() + "/emptydir"); });
  EXPECT_EQ(e, "cannot load SentencePiece model '" + tmp() +
                   "/emptydir': Is a directory");
}

// --- datasets ------------------------------------------------------------------

TEST(DataDataset, TextRowsAndNumericAnswers) {
  Dataset ds = Dataset::load(dataFile("text.jsonl"));
  EXPECT_EQ(ds.path(), dataFile("text.jsonl"));
  ASSERT_EQ(ds.size(), 5u);
  for (size_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(ds[i].index, (int64_t)i);
    EXPECT_TRUE(ds[i].promptIds.empty());
  }
  EXPECT_EQ(ds[0].prompt, "12+7=");
  EXPECT_EQ(ds[0].answer, "19");
  EXPECT_EQ(ds[1].prompt, "3*4=");
  EXPECT_EQ(ds[1].answer, "12"); // a JSON number, stored as its text
  EXPECT_EQ(ds[2].answer, "1.25");
  EXPECT_EQ(ds[3].prompt, "Say \"hi\"\xc3\xa9");
  EXPECT_EQ(ds[3].answer, ""); // null
  EXPECT_EQ(ds[4].prompt, "no answer here");
  EXPECT_EQ(ds[4].answer, ""); // absent
  EXPECT_THROW(ds[5], std::out_of_range);
}

TEST(DataDataset, IdRowsAndCRLF) {
  Dataset ds = Dataset::load(dataFile("ids.jsonl"));
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_TRUE(ds[0].prompt.empty());
  EXPECT_EQ(ds[0].promptIds, (std::vector<int64_t>{1, 15043, 3186}));
  EXPECT_EQ(ds[0].answer, "a");
  EXPECT_EQ(ds[1].promptIds, (std::vector<int64_t>{5}));
  EXPECT_EQ(ds[1].index, 1);
}

TEST(DataDataset, OtherFieldNames) {
  DatasetOptions opts;
  opts.promptField = "question";
  opts.answerField = "solution";
  Dataset ds = Dataset::load(dataFile("fields.jsonl"), opts);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].prompt.rfind("Natalia sold 48 clips", 0), 0u);
  EXPECT_EQ(ds[0].answer.substr(ds[0].answer.size() - 8), "\n#### 72");
  // With the default names the same file has no 'prompt'.
  std::string e = errorOf([] { Dataset::load(dataFile("fields.jsonl")); });
  EXPECT_EQ(e, dataFile("fields.jsonl") + ":1: no field 'prompt'");
}

TEST(DataDataset, ChatRowsAndNestedFields) {
  // verl's layout: a chat prompt and reward_model.ground_truth.
  std::string p = writeFile(
      "chat.jsonl",
      "{\"prompt\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
      "{\"role\": \"user\", \"content\": \"2+2?\"}], "
      "\"reward_model\": {\"ground_truth\": \"4\"}}\n");
  DatasetOptions o;
  o.answerField = "reward_model.ground_truth";
  Dataset ds = Dataset::load(p, o);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].prompt, "");
  EXPECT_TRUE(ds[0].promptIds.empty());
  EXPECT_EQ(ds[0].messages, "[{\"content\":\"Be brief.\",\"role\":\"system\"},"
                            "{\"content\":\"2+2?\",\"role\":\"user\"}]");
  EXPECT_EQ(ds[0].answer, "4");
  // A dotted prompt field; a key with a dot in it is found whole first.
  p = writeFile("nested.jsonl", "{\"extra\": {\"q\": \"hi\"}, \"a.b\": \"x\"}\n");
  o.promptField = "extra.q";
  o.answerField = "a.b";
  ds = Dataset::load(p, o);
  EXPECT_EQ(ds[0].prompt, "hi");
  EXPECT_EQ(ds[0].answer, "x");
}

TEST(DataDataset, Errors) {
  auto load = [](const std::string &p) {
    return errorOf([&] { Dataset::load(p); });
  };
  std::string missing = tmp() + "/missing.jsonl";
  EXPECT_EQ(load(missing),
            "cannot open data file '" + missing + "': No such file or directory");
  EXPECT_EQ(load(tmp()), "cannot open data file '" + tmp() + "': Is a directory");

  std::string p = writeFile("bad_json.jsonl", "{\"prompt\": \"a\"}\n"
                                              "{\"prompt\": \"b\",}\n");
  std::string e = load(p);
  EXPECT_EQ(e.rfind(p + ":2: not valid JSON: ", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;

  // Line numbers are the file's (1-based, blank lines counted).
  p = writeFile("no_prompt.jsonl", "{\"prompt\": \"a\"}\n\n{\"answer\": \"b\"}\n");
  EXPECT_EQ(load(p), p + ":3: no field 'prompt'");

  p = writeFile("bool_prompt.jsonl", "{\"prompt\": true}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt' must be a string, an array of "
                         "integers or an array of messages (got boolean)");
  p = writeFile("bad_chat.jsonl", "{\"prompt\": [{\"role\": \"user\"}]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt': message 0 needs a string 'content'");
  p = writeFile("bad_chat2.jsonl",
                "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}, 3]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt': message 1 is not an object (got number)");
  p = writeFile("bad_chat3.jsonl", "{\"prompt\": [{\"role\": 1, \"content\": \"a\"}]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt': message 0 needs a non-empty string 'role'");
  p = writeFile("empty_prompt.jsonl", "{\"prompt\": \"x\"}\n{\"prompt\": \"\"}\n");
  EXPECT_EQ(load(p), p + ":2: field 'prompt' is empty");
  p = writeFile("empty_ids.jsonl", "{\"prompt\": []}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt' is empty");
  p = writeFile("bad_ids.jsonl", "{\"prompt\": [1, 2, -3]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt': element 2 is not a non-negative "
                         "integer token id (got -3)");
  p = writeFile("float_ids.jsonl", "{\"prompt\": [1.5]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'prompt': element 0 is not a non-negative "
                         "integer token id (got 1.5)");
  p = writeFile("bad_answer.jsonl", "{\"prompt\": \"a\", \"answer\": [1]}\n");
  EXPECT_EQ(load(p), p + ":1: field 'answer' must be a string or a number "
                         "(got array)");
  p = writeFile("not_object.jsonl", "[1, 2]\n");
  EXPECT_EQ(load(p), p + ":1: not a JSON object (got array)");
  p = writeFile("empty.jsonl", "");
  EXPECT_EQ(load(p), p + ": no examples");
  p = writeFile("blank.jsonl", "\n  \n\t\r\n");
  EXPECT_EQ(load(p), p + ": no examples");
}

// --- sampler and sharding --------------------------------------------------------

TEST(DataSampler, SplitMix64) {
  // Vigna's reference: the first output of a splitmix64 generator seeded
  // with 0 (the state advances by the golden gamma before mixing).
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafULL);
}

TEST(DataSampler, SameSeedSameOrder) {
  Sampler a(100, 7), b(100, 7), c(100, 8);
  std::vector<int64_t> sa, sb, sc;
  for (int i = 0; i < 30; ++i) {
    auto x = a.next(7), y = b.next(7), z = c.next(7);
    sa.insert(sa.end(), x.begin(), x.end());
    sb.insert(sb.end(), y.begin(), y.end());
    sc.insert(sc.end(), z.begin(), z.end());
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  // Each epoch is a permutation, and consecutive epochs differ.
  std::vector<int64_t> e0 = a.epochOrder(0), e1 = a.epochOrder(1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_NE(e0, e1);
  std::vector<int64_t> identity(sorted);
  EXPECT_NE(e0, identity);
  EXPECT_EQ(std::vector<int64_t>(sa.begin(), sa.begin() + 100), e0);
  EXPECT_EQ(std::vector<int64_t>(sa.begin() + 100, sa.begin() + 200), e1);
}

TEST(DataSampler, FixedOrder) {
  // The algorithm is fixed (docs/data.md): these orders must never change,
  // on any platform or standard library.
  Sampler s(10, 42);
  EXPECT_EQ(s.epochOrder(0), (std::vector<int64_t>{2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
  EXPECT_EQ(s.epochOrder(1), (std::vector<int64_t>{5, 2, 0, 1, 8, 7, 9, 6, 4, 3}));
}

TEST(DataSampler, EpochCrossing) {
  Sampler s(5, 3);
  std::vector<int64_t> e0 = s.epochOrder(0), e1 = s.epochOrder(1),
                       e2 = s.epochOrder(2);
  EXPECT_EQ(s.position(), 0u);
  EXPECT_EQ(s.next(3), std::vector<int64_t>(e0.begin(), e0.begin() + 3));
  // The tail of epoch 0 is not dropped: 2 from epoch 0, then epoch 1.
  EXPECT_EQ(s.next(3), (std::vector<int64_t>{e0[3], e0[4], e1[0]}));
  EXPECT_EQ(s.position(), 6u);
  EXPECT_EQ(s.epoch(), 1u);
  // A batch larger than the dataset spans epochs.
  std::vector<int64_t> want(e1.begin() + 1, e1.end());
  want.insert(want.end(), e2.begin(), e2.end());
  want.push_back(s.epochOrder(3)[0]);
  EXPECT_EQ(s.next(10), want);
  EXPECT_EQ(s.position(), 16u);
  EXPECT_TRUE(s.next(0).empty());
  EXPECT_EQ(s.position(), 16u);
}

TEST(DataSampler, SetPositionReproduces) {
  Sampler a(13, 99);
  for (int i = 0; i < 5; ++i)
    a.next(4); // 20 consumed: one epoch and 7
  ASSERT_EQ(a.position(), 20u);
  std::vector<std::vector<int64_t>> future;
  for (int i = 0; i < 6; ++i)
    future.push_back(a.next(4));

  Sampler b(13, 99);
  b.setPosition(20);
  EXPECT_EQ(b.position(), 20u);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(b.next(4), future[i]) << "batch " << i;
  // Going back works too (the cached epoch is recomputed).
  b.setPosition(0);
  Sampler c(13, 99);
  EXPECT_EQ(b.next(30), c.next(30));
}

TEST(DataSampler, NoShuffleAndErrors) {
  Sampler s(4, 123, /*shuffle=*/false);
  EXPECT_EQ(s.next(6), (std::vector<int64_t>{0, 1, 2, 3, 0, 1}));
  Sampler one(1, 5);
  EXPECT_EQ(one.next(3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(errorOf([] { Sampler(0, 1); }), "sampler: the dataset is empty");
}

TEST(DataShard, Rows) {
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(shardRows(8, 4, i), std::make_pair(size_t(2 * i), size_t(2 * i + 2)));
  EXPECT_EQ(shardRows(8, 1, 0), std::make_pair(size_t(0), size_t(8)));
  EXPECT_EQ(shardRows(0, 2, 1), std::make_pair(size_t(0), size_t(0)));
  EXPECT_EQ(errorOf([] { shardRows(6, 4, 0); }),
            "shardRows: a global batch of 6 rows does not divide across 4 DP "
            "ranks");
  EXPECT_NE(errorOf([] { shardRows(8, 0, 0); }), "");
  EXPECT_NE(errorOf([] { shardRows(8, 4, 4); }), "");
  EXPECT_NE(errorOf([] { shardRows(8, 4, -1); }), "");
  // The shards tile the batch.
  size_t next = 0;
  for (int i = 0; i < 6; ++i) {
    auto [b, e] = shardRows(24, 6, i);
    EXPECT_EQ(b, next);
    next = e;
  }
  EXPECT_EQ(next, 24u);
}

// --- rewards -----------------------------------------------------------------------

namespace {
Example ex(const std::string &prompt, const std::string &answer) {
  Example e;
  e.prompt = prompt;
  e.answer = answer;
  return e;
}
} // namespace

TEST(DataRewards, Names) {
  std::vector<std::string> names = rewardRuleNames();
  EXPECT_EQ(names, (std::vector<std::string>{"arith", "even_tokens", "exact_match",
                                             "final_number", "format_number",
                                             "gsm8k", "math_boxed"}));
  std::string e = errorOf([] { rewardRule("accuracy"); });
  EXPECT_EQ(e, "unknown reward rule 'accuracy'; known: arith, even_tokens, "
               "exact_match, final_number, format_number, gsm8k, math_boxed");
  for (const std::string &n : names)
    EXPECT_TRUE(static_cast<bool>(rewardRule(n)));
  // The names the compiler accepts (runtime/schema/RewardRules.h) are
  // exactly the rules the runtime has.
  std::vector<std::string> schema;
  for (const hflow::rules::RuleInfo &r : hflow::rules::kRules)
    schema.emplace_back(r.name);
  EXPECT_EQ(schema, names);
}

TEST(DataRewards, ExactMatch) {
  RewardRule r = rewardRule("exact_match");
  Example e = ex("12+7=", " 19 ");
  EXPECT_EQ(r("19", e), 1.0);
  EXPECT_EQ(r("  19  \n", e), 1.0);
  EXPECT_EQ(r("\n\n19\nmore text", e), 1.0);
  EXPECT_EQ(r("19 \r\n", e), 1.0);
  EXPECT_EQ(r("190", e), 0.0);
  EXPECT_EQ(r("1 9", e), 0.0);
  EXPECT_EQ(r("", e), 0.0);
  EXPECT_EQ(r("The answer is 19", e), 0.0);
  EXPECT_EQ(r("", ex("p", "")), 1.0);
  EXPECT_EQ(r("Paris\nLondon", ex("capital?", "Paris")), 1.0);
}

TEST(DataRewards, FinalNumber) {
  RewardRule r = rewardRule("final_number");
  Example e = ex("q", "72");
  EXPECT_EQ(r("72", e), 1.0);
  EXPECT_EQ(r("48 + 24 = 72", e), 1.0);
  EXPECT_EQ(r("The total is 72.", e), 1.0);
  EXPECT_EQ(r("72.00 clips", e), 1.0);
  EXPECT_EQ(r("48 + 24 = 72, not 71", e), 0.0); // the last number counts
  EXPECT_EQ(r("#### 72\nI mean 71", e), 1.0);    // "####" is preferred
  EXPECT_EQ(r("no number", e), 0.0);
  EXPECT_EQ(r("", e), 0.0);
  // Commas, signs, decimals, and a GSM8K-style answer field.
  EXPECT_EQ(r("she has $1,234 left", ex("q", "1234")), 1.0);
  EXPECT_EQ(r("so 1,234,567", ex("q", "#### 1,234,567")), 1.0);
  EXPECT_EQ(r("5-3", ex("q", "3")), 1.0); // "5-3" is 5 and 3, not -3
  EXPECT_EQ(r("x = 2.50", ex("q", "2.5")), 1.0);
  EXPECT_EQ(r("-0", ex("q", "0")), 1.0);
  EXPECT_EQ(r("48/2 = 24 clips\n48+24 = 72\n#### 72",
              ex("q", "In May 24.\n#### 72")),
            1.0);
  EXPECT_EQ(r("#### 73", ex("q", "In May 24.\n#### 72")), 0.0);
  EXPECT_EQ(r("72", ex("q", "no number")), 0.0);
  EXPECT_EQ(rewardRule("gsm8k")("#### 72", e), 1.0);
}

TEST(DataRewards, MathBoxed) {
  RewardRule r = rewardRule("math_boxed");
  // The last \boxed counts; nested braces are kept whole.
  EXPECT_EQ(r("so \\boxed{3} ... no, \\boxed{\\frac{1}{2}}", ex("q", "\\frac12")), 1.0);
  EXPECT_EQ(r("\\boxed{\\frac{1}{2}} then \\boxed{3}", ex("q", "\\frac12")), 0.0);
  // The answer's own \boxed, or all of it.
  EXPECT_EQ(r("\\boxed{42}", ex("q", "The answer is $\\boxed{42}$.")), 1.0);
  EXPECT_EQ(r("\\boxed{ 42 }", ex("q", "42")), 1.0);
  // MATH's normal form: dfrac, \left/\right, spaces, degrees, units, a/b,
  // 0.5, a short "x =", \sqrt2, dollars and percent signs.
  EXPECT_EQ(r("\\boxed{\\dfrac{3}{4}}", ex("q", "\\frac{3}{4}")), 1.0);
  EXPECT_EQ(r("\\boxed{\\left( 1, 2 \\right)}", ex("q", "(1,2)")), 1.0);
  EXPECT_EQ(r("\\boxed{90^\\circ}", ex("q", "90")), 1.0);
  EXPECT_EQ(r("\\boxed{5 \\text{ cm}}", ex("q", "5")), 1.0);
  EXPECT_EQ(r("\\boxed{3/4}", ex("q", "\\frac{3}{4}")), 1.0);
  EXPECT_EQ(r("\\boxed{0.5}", ex("q", "\\frac{1}{2}")), 1.0);
  EXPECT_EQ(r("\\boxed{x = 7}", ex("q", "7")), 1.0);
  EXPECT_EQ(r("\\boxed{2\\sqrt2}", ex("q", "2\\sqrt{2}")), 1.0);
  EXPECT_EQ(r("\\boxed{\\$18.90}", ex("q", "18.90")), 1.0);
  EXPECT_EQ(r("\\boxed{25\\%}", ex("q", "25")), 1.0);
  // Plain numbers compare by value.
  EXPECT_EQ(r("\\boxed{1,000}", ex("q", "1000.0")), 1.0);
  EXPECT_EQ(r("\\boxed{1001}", ex("q", "1000")), 0.0);
  // "\boxed X" without braces, up to '$'; \fbox too.
  EXPECT_EQ(r("$\\boxed 7$", ex("q", "7")), 1.0);
  EXPECT_EQ(r("\\fbox{7}", ex("q", "7")), 1.0);
  // No box, an unclosed box, an empty box: 0.
  EXPECT_EQ(r("the answer is 7", ex("q", "7")), 0.0);
  EXPECT_EQ(r("\\boxed{7", ex("q", "7")), 0.0);
  EXPECT_EQ(r("\\boxed{}", ex("q", "")), 0.0);
}

TEST(DataRewards, Arith) {
  RewardRule r = rewardRule("arith");
  EXPECT_EQ(r("19", ex("12+7=", "")), 1.0);
  EXPECT_EQ(r(" 19\n", ex("12+7=", "0")), 1.0); // the prompt wins over the answer
  EXPECT_EQ(r("19 apples", ex("12+7=", "")), 1.0);
  EXPECT_EQ(r("019", ex("12+7=", "")), 1.0);
  EXPECT_EQ(r("18", ex("12+7=", "19")), 0.0);
  EXPECT_EQ(r("x19", ex("12+7=", "")), 0.0);
  EXPECT_EQ(r("", ex("12+7=", "")), 0.0);
  EXPECT_EQ(r("\n19", ex("12+7=", "")), 0.0); // only spaces and tabs are skipped
  EXPECT_EQ(r("12", ex("3*4=", "")), 1.0);
  EXPECT_EQ(r("-4", ex("3 - 7 =", "")), 1.0);
  EXPECT_EQ(r("-21", ex("-3*7", "")), 1.0);
  EXPECT_EQ(r("10", ex("5--5=", "")), 1.0);
  EXPECT_EQ(r("0", ex("5-5=", "")), 1.0);
  EXPECT_EQ(r("-0", ex("5-5=", "")), 1.0);
  EXPECT_EQ(r("1000000000000000000000000000000000000",
              ex("999999999999999999*999999999999999999=", "")),
            0.0);
  EXPECT_EQ(r("999999999999999998000000000000000001",
              ex("999999999999999999*999999999999999999=", "")),
            1.0);
  // Few-shot prompts: the last non-blank line is the question.
  EXPECT_EQ(r("9", ex("1+1=2\n4+5=\n\n", "")), 1.0);
  // Unparseable prompts (or id prompts) use the answer field.
  EXPECT_EQ(r("42", ex("What is six times seven?", " 42 ")), 1.0);
  EXPECT_EQ(r("41", ex("What is six times seven?", "42")), 0.0);
  EXPECT_EQ(r("42", ex("10-5-3=", "42")), 1.0); // three operands: not parsed
  EXPECT_EQ(r("42", ex("6/7=", "42")), 1.0);
  EXPECT_EQ(r("42", ex("q", "forty-two")), 0.0);
  Example ids;
  ids.promptIds = {1, 2, 3};
  ids.answer = "7";
  EXPECT_EQ(r("7", ids), 1.0);
}

TEST(DataRewards, FormatNumber) {
  RewardRule r = rewardRule("format_number");
  Example e = ex("12+7=", "19");
  EXPECT_EQ(r("19", e), 1.0);
  EXPECT_EQ(r("123\nanything", e), 1.0);
  EXPECT_EQ(r("-5", e), 1.0);
  EXPECT_EQ(r("0", e), 1.0);
  EXPECT_EQ(r("", e), 0.0);
  EXPECT_EQ(r("-", e), 0.0);
  EXPECT_EQ(r(" 19", e), 0.0);
  EXPECT_EQ(r("19 ", e), 0.0);
  EXPECT_EQ(r("1.5", e), 0.0);
  EXPECT_EQ(r("19a", e), 0.0);
  EXPECT_EQ(r("\n19", e), 0.0);
}

TEST(DataRewards, EvenTokens) {
  RewardRule r = rewardRule("even_tokens");
  Example e = ex("p", "");
  EXPECT_EQ(r("", e), 0.0);
  EXPECT_EQ(r("BBBB", e), 1.0); // 'B' = 66
  EXPECT_EQ(r("AAAA", e), 0.0); // 'A' = 65
  EXPECT_DOUBLE_EQ(r("AB\n", e), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(r(std::string("\xff\xfe", 2), e), 0.5);
}

// --- hflow-mkdata ---------------------------------------------------------------

namespace {
/// Runs hflow-mkdata with `args`; returns its exit status, stdout+stderr in
/// `out`.
int mkdata(const std::string &args, std::string *out = nullptr) {
  std::string log = tmp() + "/mkdata.log";
  std::string cmd = std::string(HFLOW_MKDATA) + " " + args + " >" + log + " 2>&1";
  int st = std::system(cmd.c_str());
  if (out)
    *out = readFile(log);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
} // namespace

TEST(DataMkdata, DistinctAndDisjoint) {
  std::string train = tmp() + "/train.jsonl", test = tmp() + "/test.jsonl";
  ASSERT_EQ(mkdata("arith --seed 1 --count 60 --max-a 9 --max-b 9 -o " + train), 0);
  ASSERT_EQ(mkdata("arith --seed 2 --count 40 --max-a 9 --max-b 9 --exclude " +
                   train + " -o " + test),
            0);
  Dataset tr = Dataset::load(train), te = Dataset::load(test);
  ASSERT_EQ(tr.size(), 60u);
  ASSERT_EQ(te.size(), 40u);
  std::set<std::string> seen;
  RewardRule arith = rewardRule("arith"), fmt = rewardRule("format_number");
  for (const Dataset *d : {&tr, &te})
    for (size_t i = 0; i < d->size(); ++i) {
      const Example &x = (*d)[i];
      EXPECT_TRUE(seen.insert(x.prompt).second) << "repeated: " << x.prompt;
      EXPECT_EQ(x.prompt.back(), '=');
      EXPECT_NE(x.prompt.find('+'), std::string::npos);
      // The answer is the true sum.
      EXPECT_EQ(arith(x.answer, x), 1.0) << x.prompt << " " << x.answer;
      EXPECT_EQ(fmt(x.answer, x), 1.0);
    }
  EXPECT_EQ(seen.size(), 100u); // together: every pair of [0,9] x [0,9]
  // The exact line format.
  std::string first = readFile(train).substr(0, readFile(train).find('\n'));
  EXPECT_EQ(first, "{\"prompt\": \"" + tr[0].prompt + "\", \"answer\": \"" +
                       tr[0].answer + "\"}");
  // Deterministic: the same arguments write the same bytes.
  std::string again = tmp() + "/train2.jsonl";
  ASSERT_EQ(mkdata("arith --seed=1 --count=60 --max-a=9 --max-b=9 -o " + again), 0);
  EXPECT_EQ(readFile(again), readFile(train));
  // No room left: 100 prompts, 60 excluded, 41 asked for.
  std::string out;
  EXPECT_EQ(mkdata("arith --seed 3 --count 41 --max-a 9 --max-b 9 --exclude " +
                       train + " -o " + tmp() + "/none.jsonl",
                   &out),
            1);
  EXPECT_NE(out.find("only 40 distinct prompts exist"), std::string::npos) << out;
}

TEST(DataMkdata, Chat) {
  // --chat writes the rows of the same arguments without it, as chats.
  std::string plain = tmp() + "/plain.jsonl", chat = tmp() + "/chat.jsonl",
              sys = tmp() + "/sys.jsonl", held = tmp() + "/held.jsonl";
  ASSERT_EQ(mkdata("arith --seed 4 --count 50 --max-a 9 --max-b 9 -o " + plain), 0);
  ASSERT_EQ(mkdata("arith --seed 4 --count 50 --max-a 9 --max-b 9 --chat -o " + chat), 0);
  ASSERT_EQ(mkdata("arith --seed 4 --count 50 --max-a 9 --max-b 9 --chat --system "
                   "'Say \"the\" sum.' -o " + sys),
            0);
  Dataset p = Dataset::load(plain), c = Dataset::load(chat), s = Dataset::load(sys);
  ASSERT_EQ(c.size(), 50u);
  ASSERT_EQ(s.size(), 50u);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_TRUE(c[i].prompt.empty());
    EXPECT_EQ(c[i].messages,
              "[{\"content\":\"" + p[i].prompt + "\",\"role\":\"user\"}]");
    EXPECT_EQ(s[i].messages, "[{\"content\":\"Say \\\"the\\\" sum.\",\"role\":\"system\"},"
                             "{\"content\":\"" + p[i].prompt + "\",\"role\":\"user\"}]");
    EXPECT_EQ(c[i].answer, p[i].answer);
    // The arith rule scores a chat row by its answer.
    EXPECT_EQ(rewardRule("arith")(c[i].answer, c[i]), 1.0);
  }
  // --exclude reads a chat file's user messages: the other 50 prompts.
  ASSERT_EQ(mkdata("arith --seed 5 --count 50 --max-a 9 --max-b 9 --exclude " + chat +
                   " -o " + held),
            0);
  std::set<std::string> seen;
  for (size_t i = 0; i < p.size(); ++i)
    seen.insert(p[i].prompt);
  Dataset h = Dataset::load(held);
  for (size_t i = 0; i < h.size(); ++i)
    EXPECT_TRUE(seen.insert(h[i].prompt).second) << h[i].prompt;
  std::string out;
  EXPECT_EQ(mkdata("arith --seed 1 --count 2 --max-a 3 --max-b 3 --system x -o -", &out), 2);
  EXPECT_NE(out.find("--system needs --chat"), std::string::npos) << out;
}

TEST(DataMkdata, OtherOpsAndLargeRanges) {
  std::string out;
  for (std::string op : {"-", "*"}) {
    std::string p = tmp() + "/op.jsonl";
    ASSERT_EQ(mkdata("arith --seed 5 --count 30 --max-a 20 --max-b 30 --op '" +
                     op + "' -o " + p),
              0);
    Dataset d = Dataset::load(p);
    for (size_t i = 0; i < d.size(); ++i) {
      EXPECT_NE(d[i].prompt.find(op), std::string::npos);
      EXPECT_EQ(rewardRule("arith")(d[i].answer, d[i]), 1.0) << d[i].prompt;
    }
  }
  // A space too large to list: drawn with rejection of repeats.
  std::string big = tmp() + "/big.jsonl";
  ASSERT_EQ(mkdata("arith --seed 9 --count 500 --max-a 1000000 --max-b 1000000 -o " +
                   big),
            0);
  Dataset d = Dataset::load(big);
  ASSERT_EQ(d.size(), 500u);
  std::set<std::string> seen;
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_TRUE(seen.insert(d[i].prompt).second);
    EXPECT_EQ(rewardRule("arith")(d[i].answer, d[i]), 1.0) << d[i].prompt;
  }
  // Standard output.
  ASSERT_EQ(mkdata("arith --seed 1 --count 2 --max-a 3 --max-b 3 -o -", &out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2);
}

TEST(DataMkdata, Usage) {
  std::string out;
  EXPECT_EQ(mkdata("--help", &out), 0);
  EXPECT_NE(out.find("usage: hflow-mkdata arith"), std::string::npos) << out;
  EXPECT_NE(out.find("--exclude"), std::string::npos) << out;

  struct Case {
    std::string args, message;
  } cases[] = {
      {"", "no task given"},
      {"gsm8k", "unknown task 'gsm8k'"},
      {"arith --count 5 --max-a 9 --max-b 9 -o x", "missing: --seed"},
      {"arith --seed 1 --count 5 --max-a 9", "missing: --max-b -o"},
      {"arith --seed x --count 5 --max-a 9 --max-b 9 -o x",
       "--seed wants a non-negative integer, not 'x'"},
      {"arith --seed 1 --count 0 --max-a 9 --max-b 9 -o x",
       "--count must be at least 1"},
      {"arith --seed 1 --count 5 --max-a -3 --max-b 9 -o x",
       "--max-a wants a non-negative integer, not '-3'"},
      {"arith --seed 1 --count 5 --max-a 9 --max-b 9 --op / -o x",
       "--op must be +, - or *, not '/'"},
      {"arith --seed 1 --count 5 --max-a 9 --max-b 9 --frobnicate -o x",
       "unknown argument '--frobnicate'"},
      {"arith --seed 1 --count 5 --max-a 9 --max-b 9 -o", "-o needs a value"},
      {"arith --seed 1 --count 5 --max-a 9999999999999999999 --max-b 9 -o x",
       "--max-a 9999999999999999999 is too large"},
  };
  for (const Case &c : cases) {
    EXPECT_EQ(mkdata(c.args, &out), 2) << c.args;
    EXPECT_NE(out.find("hflow-mkdata: error: " + c.message), std::string::npos)
        << c.args << "\n" << out;
  }
  // The --exclude file is never overwritten.
  std::string f = writeFile("keep.jsonl", "{\"prompt\": \"1+1=\"}\n");
  EXPECT_EQ(mkdata("arith --seed 1 --count 5 --max-a 9 --max-b 9 --exclude " + f +
                       " -o " + f,
                   &out),
            2);
  EXPECT_NE(out.find("is the --exclude file (an input): hflow never writes over what it reads"),
            std::string::npos)
      << out;
  EXPECT_EQ(readFile(f), "{\"prompt\": \"1+1=\"}\n");
  // A bad --exclude file is reported as the dataset error.
  EXPECT_EQ(mkdata("arith --seed 1 --count 5 --max-a 9 --max-b 9 --exclude " +
                       tmp() + "/nope.jsonl -o " + tmp() + "/o.jsonl",
                   &out),
            1);
  EXPECT_NE(out.find("cannot open data file"), std::string::npos) << out;
  // An unwritable output.
  EXPECT_EQ(mkdata("arith --seed 1 --count 5 --max-a 9 --max-b 9 -o /nonexistent/o.jsonl",
                   &out),
            1);
  EXPECT_NE(out.find("cannot write '/nonexistent/o.jsonl': No such file or directory"),
            std::string::npos)
      << out;
}
