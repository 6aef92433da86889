//===- SafetensorsTest.cpp - safetensors files, HF export and import -------===//
#include "runtime/models/Checkpoint.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Parallel.h"
#include "runtime/models/Safetensors.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace hflow::models;

namespace {

/// A fresh directory under /tmp, removed (with its contents) at the end.
struct TempDir {
  std::string path;
  TempDir() {
    static int counter = 0;
    path = "/tmp/hflow-st-test-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const {
    return (fs::path(path) / name).string();
  }
};

/// Runs `f`, expects a std::runtime_error whose message contains every one
/// of `parts`; returns the message.
template <typename F>
std::string expectError(F f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const std::runtime_error &e) {
    std::string msg = e.what();
    for (const auto &p : parts)
      EXPECT_NE(msg.find(p), std::string::npos)
          << "message: " << msg << "\nlacks: " << p;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no std::runtime_error thrown";
  return "";
}

/// A safetensors file from a raw header (and `dataBytes` zero bytes of
/// data); `lenOverride` replaces the header length when >= 0.
void writeRaw(const std::string &path, const std::string &header,
              size_t dataBytes, int64_t lenOverride = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = lenOverride >= 0 ? uint64_t(lenOverride) : header.size();
  for (int i = 0; i < 8; ++i)
    out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  out << std::string(dataBytes, '\0');
}

at::Tensor randomTensor(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor randomTokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::TensorOptions().dtype(at::kLong));
}

LlamaConfig tinyConfig() {
  LlamaConfig c;
  c.name = "tiny";
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kvHeads = 2;
  c.ffn = 64;
  c.vocab = 64;
  c.ropeTheta = 10000.0;
  c.normEps = 1e-5;
  return c;
}

void flipByte(const std::string &path, int64_t fromEnd) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-fromEnd, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-fromEnd, std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
}

} // namespace

//===----------------------------------------------------------------------===//
// The file format
//===----------------------------------------------------------------------===//

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  at::Tensor base = randomTensor({3, 5}, 7);
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f64", base.to(at::kDouble)},
      {"f32", base},
      {"f16", base.to(at::kHalf)},
      {"bf16", base.to(at::kBFloat16)},
      {"i64", (base * 1e6).to(at::kLong)},
      {"i32", (base * 1e4).to(at::kInt)},
      {"i16", (base * 1e3).to(at::kShort)},
      {"i8", (base * 40).to(at::kChar)},
      {"u8", (base * 40 + 128).clamp(0, 255).to(at::kByte)},
      {"bool", base > 0},
      {"scalar", at::scalar_tensor(3.5, at::kDouble)},
      {"empty", at::empty({0, 4}, at::kFloat)},
      {"transposed", base.t()}, // not contiguous
      {"cube", randomTensor({2, 3, 4}, 8)},
  };
  const std::string path = dir / "all.safetensors";
  uint64_t bytes = writeSafetensors(path, tensors, {{"format", "pt"}, {"k", "v"}});
  EXPECT_EQ(bytes, fs::file_size(path));

  SafetensorsFile f(path);
  EXPECT_EQ((8 + f.headerBytes()) % 8, 0u) << "data buffer not 8-byte aligned";
  EXPECT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(f.metadata().count(kSafetensorsChecksumKey), 1u);
  f.verifyChecksum();
  const std::map<std::string, std::string> names = {
      {"f64", "F64"}, {"f32", "F32"},  {"f16", "F16"},   {"bf16", "BF16"},
      {"i64", "I64"}, {"i32", "I32"},  {"i16", "I16"},   {"i8", "I8"},
      {"u8", "U8"},   {"bool", "BOOL"}, {"scalar", "F64"}, {"empty", "F32"},
      {"transposed", "F32"}, {"cube", "F32"}};
  for (const auto &[name, t] : tensors) {
    SCOPED_TRACE(name);
    const auto &info = f.info(name);
    EXPECT_EQ(info.dtype, names.at(name));
    EXPECT_EQ(info.shape, t.sizes().vec());
    at::Tensor exact = f.read(name, SafetensorsFile::ReadMode::Exact);
    EXPECT_EQ(exact.scalar_type(), t.scalar_type());
    EXPECT_TRUE(at::equal(exact, t.contiguous()));
    at::Tensor conv = f.read(name);
    if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) {
      EXPECT_EQ(conv.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(conv, t.to(at::kFloat)));
    } else {
      EXPECT_EQ(conv.scalar_type(), t.scalar_type());
    }
  }
  auto all = f.readAllVerified();
  EXPECT_EQ(all.size(), tensors.size());
  EXPECT_TRUE(at::equal(all.at("bf16"), tensors[3].second));
}

TEST(Safetensors, HeaderMatchesTheSpecLayout) {
  // Parse the header by hand: little-endian length, JSON, offsets relative to
  // the data buffer, tensors back to back.
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  at::Tensor a = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor b = at::arange(4, at::kLong);
  SafetensorsWriteOptions noChecksum;
  noChecksum.checksum = false;
  writeSafetensors(path, {{"a", a}, {"b", b}}, {}, noChecksum);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_FALSE(h.contains("__metadata__"));
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "I64");
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({24, 56}));
  EXPECT_EQ(bytes.size(), 8 + n + 56);
  float a5;
  std::memcpy(&a5, bytes.data() + 8 + n + 5 * 4, 4);
  EXPECT_EQ(a5, 5.0f);
}

TEST(Safetensors, FloatDtypeOptionStoresBF16) {
  TempDir dir;
  at::Tensor t = randomTensor({4, 6}, 3);
  at::Tensor ids = at::arange(5, at::kLong);
  const std::string path = dir / "bf.safetensors";
  SafetensorsWriteOptions opt;
  opt.floatDtype = at::kBFloat16;
  writeSafetensors(path, {{"w", t}, {"ids", ids}}, {}, opt);
  SafetensorsFile f(path);
  EXPECT_EQ(f.info("w").dtype, "BF16");
  EXPECT_EQ(f.info("ids").dtype, "I64"); // integers untouched
  EXPECT_TRUE(at::equal(f.read("w"), t.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(fs::file_size(path), 8 + f.headerBytes() + 4 * 6 * 2 + 5 * 8);
}

TEST(Safetensors, WriterRejectsBadNames) {
  TempDir dir;
  at::Tensor t = at::zeros({2});
  expectError([&] { writeSafetensors(dir / "a", {{"x", t}, {"x", t}}); },
              {dir / "a", "tensor 'x' given twice"});
  expectError([&] { writeSafetensors(dir / "b", {{"__metadata__", t}}); },
              {"invalid tensor name '__metadata__'"});
  expectError([&] { writeSafetensors(dir / "c", {{"", t}}); },
              {"invalid tensor name ''"});
  EXPECT_TRUE(fs::is_empty(dir.path)) << "a failed write left a file behind";
}

TEST(Safetensors, HeaderValidationErrors) {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  auto open = [&] { SafetensorsFile f(p); };

  { // shorter than the length field
    std::ofstream(p, std::ios::binary) << "abcde";
    expectError(open, {"safetensors " + p, "truncated: the file has 5 bytes"});
  }
  writeRaw(p, "{}", 0, /*len=*/1000);
  expectError(open, {p, "header length 1000 runs past the end of the file (10 bytes)"});

  writeRaw(p, "{\"a\": {\"dtype\": ", 0);
  expectError(open, {p, "header is not valid JSON"});

  writeRaw(p, "[1, 2]", 0);
  expectError(open, {p, "header is not a JSON object"});

  writeRaw(p, R"({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2);
  expectError(open, {p, "tensor 'a': unknown dtype 'F8_E4M3'"});

  writeRaw(p, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  expectError(open, {p, "tensor 'a': data_offsets [0, 16] run past the end of "
                        "the data buffer (8 bytes)"});

  writeRaw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 4]}})", 8);
  expectError(open, {p, "tensor 'a': data_offsets [8, 4] end before they begin"});

  writeRaw(p,
           R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
           12);
  expectError(open, {p, "tensors 'a' [0, 8) and 'b' [4, 12) overlap"});

  writeRaw(p,
           R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
               "b": {"dtype": "I8", "shape": [2], "data_offsets": [6, 8]}})",
           16);
  expectError(open, {p, "tensors 'a' [0, 16) and 'b' [6, 8) overlap"});

  writeRaw(p, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expectError(open, {p, "tensor 'a': shape [3] of F32 needs 12 bytes, but "
                        "data_offsets [0, 8] hold 8"});

  writeRaw(p,
           R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904],
                     "data_offsets": [0, 8]}})",
           8);
  expectError(open, {p, "tensor 'a': shape", "needs more bytes than the file has"});

  writeRaw(p, R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
  expectError(open, {p, "tensor 'a': shape [-2] has an entry that is not a non-negative integer"});

  writeRaw(p, R"({"a": {"dtype": "F32", "shape": [2]}})", 8);
  expectError(open, {p, "tensor 'a': no \"data_offsets\""});

  writeRaw(p, R"({"__metadata__": {"n": 3}})", 0);
  expectError(open, {p, "__metadata__ value of 'n' is not a string"});

  // A valid file cut short: the last tensor no longer fits.
  writeSafetensors(p, {{"w", at::ones({4, 4})}});
  fs::resize_file(p, fs::file_size(p) - 4);
  expectError(open, {p, "tensor 'w': data_offsets [0, 64] run past the end of "
                        "the data buffer (60 bytes); is the file truncated?"});

  expectError([&] { SafetensorsFile f(dir / "nope.safetensors"); },
              {dir / "nope.safetensors", "cannot open"});
}

TEST(Safetensors, ChecksumDetectsCorruption) {
  TempDir dir;
  const std::string p = dir / "c.safetensors";
  writeSafetensors(p, {{"w", randomTensor({8, 8}, 1)}});
  SafetensorsFile(p).verifyChecksum();
  flipByte(p, 3);
  SafetensorsFile f(p); // the header is still fine
  expectError([&] { f.verifyChecksum(); }, {p, "checksum mismatch"});
  expectError([&] { f.readAllVerified(); }, {p, "checksum mismatch", "corrupt"});
}

TEST(Safetensors, RowRangeReadsEqualSlicesOfTheFullRead) {
  TempDir dir;
  const std::string p = dir / "rows.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"m", randomTensor({7, 5}, 1)},
      {"bf", randomTensor({6, 3}, 2).to(at::kBFloat16)},
      {"vec", at::arange(10, at::kLong)},
      {"cube", randomTensor({4, 2, 3}, 3)},
  };
  writeSafetensors(p, tensors);
  SafetensorsFile f(p);
  for (const auto &[name, t] : tensors) {
    at::Tensor full = f.read(name);
    for (int64_t r0 = 0; r0 <= t.size(0); ++r0)
      for (int64_t r1 = r0; r1 <= t.size(0); ++r1) {
        SCOPED_TRACE(name + " [" + std::to_string(r0) + ", " + std::to_string(r1) + ")");
        at::Tensor rows = f.readRows(name, r0, r1);
        EXPECT_EQ(rows.scalar_type(), full.scalar_type());
        EXPECT_TRUE(at::equal(rows, full.slice(0, r0, r1)));
      }
  }
  EXPECT_EQ(f.readRows("bf", 1, 2, SafetensorsFile::ReadMode::Exact).scalar_type(),
            at::kBFloat16);
  expectError([&] { f.readRows("m", 3, 8); },
              {p, "tensor 'm': rows [3, 8) are outside its shape [7, 5]"});
  expectError([&] { f.readRows("m", 4, 3); }, {p, "tensor 'm': rows [4, 3)"});
  expectError([&] { f.read("nope"); }, {p, "no tensor 'nope'"});
}

TEST(Safetensors, BoxReadsOnlyTheBoxBytes) {
  TempDir dir;
  const std::string p = dir / "box.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"m", randomTensor({7, 5}, 1)},
      {"bf", randomTensor({6, 4}, 2).to(at::kBFloat16)},
      {"vec", randomTensor({9}, 3)},
  };
  writeSafetensors(p, tensors);
  SafetensorsFile f(p);
  EXPECT_EQ(f.bytesRead(), 0u);
  for (const auto &[name, t] : tensors) {
    at::Tensor full = f.read(name).view({t.dim() == 1 ? 1 : t.size(0), -1});
    const int64_t rows = full.size(0), cols = full.size(1);
    for (int64_t r0 = 0; r0 < rows; ++r0)
      for (int64_t r1 = r0; r1 <= rows; ++r1)
        for (int64_t c0 = 0; c0 <= cols; c0 += 2)
          for (int64_t c1 = c0; c1 <= cols; ++c1) {
            SCOPED_TRACE(name + " rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                         ") cols [" + std::to_string(c0) + ", " + std::to_string(c1) + ")");
            const uint64_t before = f.bytesRead();
            at::Tensor box = f.readBox(name, r0, r1, c0, c1);
            EXPECT_TRUE(at::equal(box, full.slice(0, r0, r1).slice(1, c0, c1)));
            // Exactly the box's bytes in the stored dtype.
            EXPECT_EQ(f.bytesRead() - before,
                      (uint64_t)((r1 - r0) * (c1 - c0) * t.element_size()));
          }
  }
  expectError([&] { f.readBox("m", 0, 8, 0, 5); },
              {p, "tensor 'm': box rows [0, 8) x cols [0, 5) is outside its shape [7, 5]"});
  expectError([&] { f.readBox("vec", 0, 1, 3, 10); }, {p, "outside its shape [9]"});
}

TEST(Safetensors, HfShardLoadReadsEachRanksBoxes) {
  // Each rank of an FSDP or TP group reads its own boxes from an exported
  // (sharded) HF directory: the shards equal the slices of the model, and
  // the bytes read are exactly the boxes' (4 bytes per number).
  LlamaConfig cfg = tinyConfig();
  cfg.qkvBias = true;
  TempDir dir;
  Llama src(cfg, 3);
  exportHf(dir.path, src, /*maxShardBytes=*/20000);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto named = src.namedParameters();
  auto shapes = llamaParameterShapes(cfg);
  ASSERT_EQ(shapes.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(shapes[i].first, named[i].first);
    EXPECT_EQ(shapes[i].second, named[i].second.sizes().vec());
  }
  int64_t total = 0;
  for (auto &[name, t] : named)
    total += t.numel();
  for (int f : {1, 2, 3}) {
    int64_t sum = 0;
    for (int k = 0; k < f; ++k) {
      SCOPED_TRACE("fsdp " + std::to_string(k) + " of " + std::to_string(f));
      std::vector<std::pair<std::string, at::Tensor>> shards;
      std::vector<std::pair<std::string, Box>> boxes;
      int64_t numbers = 0;
      for (auto &[name, t] : named) {
        Box b = FSDPLlama::boxOf(t.size(0), t.size(1), f, k);
        boxes.push_back({name, b});
        shards.push_back({name, at::zeros({b.rows(), b.cols()})});
        numbers += b.numel();
      }
      uint64_t bytes = loadHfShards(dir.path, cfg, shards, boxes);
      EXPECT_EQ(bytes, (uint64_t)numbers * 4);
      sum += numbers;
      for (size_t i = 0; i < named.size(); ++i) {
        const Box &b = boxes[i].second;
        EXPECT_TRUE(at::equal(shards[i].second, named[i].second.slice(0, b.r0, b.r1)
                                                    .slice(1, b.c0, b.c1)))
            << named[i].first;
      }
    }
    EXPECT_EQ(sum, total); // the ranks' boxes partition the model
  }
  // Column boxes (a row-parallel weight's TP shard), read row by row.
  std::vector<std::pair<std::string, at::Tensor>> one = {
      {"layers.1.attn.o", at::zeros({cfg.hidden, cfg.hidden / 2})}};
  std::vector<std::pair<std::string, Box>> oneBox = {
      {"layers.1.attn.o", Box{0, cfg.hidden, cfg.hidden / 2, cfg.hidden}}};
  EXPECT_EQ(loadHfShards(dir.path, cfg, one, oneBox),
            (uint64_t)(cfg.hidden * cfg.hidden / 2 * 4));
  at::Tensor o;
  for (auto &[n, t] : named)
    if (n == "layers.1.attn.o")
      o = t;
  ASSERT_TRUE(o.defined());
  EXPECT_TRUE(at::equal(one[0].second, o.slice(1, cfg.hidden / 2, cfg.hidden)));
  // A config that does not match the files: nothing is written.
  LlamaConfig wrong = cfg;
  wrong.ffn = cfg.ffn * 2;
  at::Tensor untouched = at::full({1, cfg.hidden}, 7.0f);
  std::vector<std::pair<std::string, at::Tensor>> norm = {{"final_norm", untouched}};
  std::vector<std::pair<std::string, Box>> normBox = {{"final_norm", Box{0, 1, 0, cfg.hidden}}};
  expectError([&] { loadHfShards(dir.path, wrong, norm, normBox); },
              {"mlp.gate_proj.weight", "expected"});
  EXPECT_TRUE(untouched.eq(7.0f).all().item<bool>());
}

//===----------------------------------------------------------------------===//
// Hugging Face directories
//===----------------------------------------------------------------------===//

TEST(Safetensors, HfParameterNames) {
  EXPECT_EQ(hfParameterName("embed"), "model.embed_tokens.weight");
  EXPECT_EQ(hfParameterName("layers.0.attn_norm"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(hfParameterName("layers.11.attn.q"), "model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(hfParameterName("layers.1.attn.k_bias"), "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(hfParameterName("layers.1.attn.o"), "model.layers.1.self_attn.o_proj.weight");
  EXPECT_EQ(hfParameterName("layers.2.mlp_norm"),
            "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(hfParameterName("layers.2.mlp.down"), "model.layers.2.mlp.down_proj.weight");
  EXPECT_EQ(hfParameterName("final_norm"), "model.norm.weight");
  EXPECT_EQ(hfParameterName("lm_head"), "lm_head.weight");
  EXPECT_THROW(hfParameterName("layers.x.attn.q"), std::invalid_argument);
  EXPECT_THROW(hfParameterName("layers.1.attn.z"), std::invalid_argument);
  // A mixture's names follow the model type.
  EXPECT_EQ(hfParameterName("layers.1.mlp.router", "qwen3_moe"), "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(hfParameterName("layers.1.mlp.experts.12.up", "qwen3_moe"),
            "model.layers.1.mlp.experts.12.up_proj.weight");
  EXPECT_EQ(hfParameterName("layers.0.mlp.router", "mixtral"),
            "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(hfParameterName("layers.0.mlp.experts.3.gate", "mixtral"),
            "model.layers.0.block_sparse_moe.experts.3.w1.weight");
  EXPECT_EQ(hfParameterName("layers.0.mlp.experts.3.up", "mixtral"),
            "model.layers.0.block_sparse_moe.experts.3.w3.weight");
  EXPECT_EQ(hfParameterName("layers.0.mlp.experts.3.down", "mixtral"),
            "model.layers.0.block_sparse_moe.experts.3.w2.weight");
  EXPECT_THROW(hfParameterName("layers.0.mlp.router"), std::invalid_argument);
  EXPECT_THROW(hfParameterName("layers.0.mlp.experts.x.up", "mixtral"), std::invalid_argument);
  EXPECT_THROW(hfParameterName("layers.0.mlp.experts.1.w1", "mixtral"), std::invalid_argument);
  EXPECT_TRUE(hfParameterIs1D("layers.3.attn.v_bias"));
  EXPECT_TRUE(hfParameterIs1D("final_norm"));
  EXPECT_FALSE(hfParameterIs1D("layers.3.attn.v"));
}

struct HfCase {
  const char *name;
  bool tie, bias, sharded;
};

void PrintTo(const HfCase &c, std::ostream *os) { *os << c.name; }

class SafetensorsHfExport : public ::testing::TestWithParam<HfCase> {};

TEST_P(SafetensorsHfExport, ExportThenLoadGivesIdenticalLogits) {
  const HfCase &c = GetParam();
  LlamaConfig cfg = tinyConfig();
  cfg.tieEmbeddings = c.tie;
  cfg.qkvBias = c.bias;
  if (c.bias)
    cfg.ropeTheta = 1e6, cfg.normEps = 1e-6;
  TempDir dir;
  Llama src(cfg, 1);
  // Non-trivial norms and biases, so a mix-up of them shows in the logits.
  {
    c10::NoGradGuard g;
    uint64_t seed = 100;
    for (auto &[name, t] : src.namedParameters())
      if (hfParameterIs1D(name))
        t.copy_(randomTensor(t.sizes(), seed++) * 0.1 +
                (name.find("norm") != std::string::npos ? 1.0 : 0.0));
  }
  // ~22 KB of float32 weights; 8 KB shards split them.
  const uint64_t maxShard = c.sharded ? 8192 : (1ULL << 30);
  auto files = exportHf(dir.path, src, maxShard);
  if (c.sharded) {
    EXPECT_GT(files.size(), 2u);
    EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
    char first[64], last[64];
    std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", files.size());
    std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", files.size(),
                  files.size());
    EXPECT_EQ(fs::path(files.front()).filename().string(), first);
    EXPECT_EQ(fs::path(files.back()).filename().string(), last);
    auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
    EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], first);
    EXPECT_EQ(index["weight_map"].size(), src.namedParameters().size());
    EXPECT_EQ(index["metadata"]["total_size"], cfg.paramCount() * 4);
    for (const auto &f : files) // each shard within the limit (single big tensors aside)
      EXPECT_LE(SafetensorsFile(f).dataBytes(), std::max<uint64_t>(maxShard, 64 * 32 * 4));
  } else {
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0], dir / "model.safetensors");
    EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
    SafetensorsFile f(files[0]);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.dataBytes(), uint64_t(cfg.paramCount()) * 4);
    EXPECT_EQ(f.has("lm_head.weight"), !c.tie);
    EXPECT_EQ(f.has("model.layers.0.self_attn.q_proj.bias"), c.bias);
    EXPECT_EQ(f.info("model.norm.weight").shape, std::vector<int64_t>{32});
  }
  // Nothing but the export's files (no temp files left).
  for (const auto &e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find("tmp-"), std::string::npos);

  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  EXPECT_EQ(config["model_type"], c.bias ? "qwen2" : "llama");
  EXPECT_EQ(config["architectures"][0], c.bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["tie_word_embeddings"], c.tie);
  LlamaConfig back = hfConfigFromJson(dir.path);
  EXPECT_EQ(back.layers, cfg.layers);
  EXPECT_EQ(back.hidden, cfg.hidden);
  EXPECT_EQ(back.heads, cfg.heads);
  EXPECT_EQ(back.kvHeads, cfg.kvHeads);
  EXPECT_EQ(back.ffn, cfg.ffn);
  EXPECT_EQ(back.vocab, cfg.vocab);
  EXPECT_EQ(back.ropeTheta, cfg.ropeTheta);
  EXPECT_EQ(back.normEps, cfg.normEps);
  EXPECT_EQ(back.tieEmbeddings, cfg.tieEmbeddings);
  EXPECT_EQ(back.qkvBias, cfg.qkvBias);

  at::Tensor tokens = randomTokens(2, 9, cfg.vocab, 5);
  at::Tensor want = src.forward(tokens);
  Llama dst(cfg, 2);
  EXPECT_FALSE(at::equal(dst.forward(tokens), want));
  loadHfIntoLlama(dir.path, dst);
  EXPECT_TRUE(at::equal(dst.forward(tokens), want));
  auto a = src.namedParameters(), b = dst.namedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;

  auto loaded = loadHfLlama(dir.path);
  EXPECT_TRUE(at::equal(loaded->forward(tokens), want));

  // A shard's rows, read alone, are the rows of the full tensor.
  const std::string down = "model.layers.1.mlp.down_proj.weight";
  at::Tensor full = HfWeights(dir.path).read(down);
  EXPECT_TRUE(at::equal(readHfRows(dir.path, down, 8, 24), full.slice(0, 8, 24)));
  EXPECT_TRUE(at::equal(readHfRows(dir.path, "model.norm.weight", 4, 12),
                        HfWeights(dir.path).read("model.norm.weight").slice(0, 4, 12)));
}

INSTANTIATE_TEST_SUITE_P(
    Safetensors, SafetensorsHfExport,
    ::testing::Values(HfCase{"Untied", false, false, false},
                      HfCase{"UntiedSharded", false, false, true},
                      HfCase{"Tied", true, false, false},
                      HfCase{"TiedSharded", true, false, true},
                      HfCase{"QkvBias", true, true, false},
                      HfCase{"QkvBiasSharded", false, true, true}),
    [](const ::testing::TestParamInfo<HfCase> &i) { return std::string(i.param.name); });

TEST(Safetensors, HfExportSwitchesLayoutAndRemovesStaleFiles) {
  LlamaConfig cfg = tinyConfig();
  Llama m(cfg, 3);
  TempDir dir;
  auto shards = exportHf(dir.path, m, 8192);
  ASSERT_GT(shards.size(), 1u);
  auto single = exportHf(dir.path, m, 1 << 30);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  for (const auto &s : shards)
    EXPECT_FALSE(fs::exists(s)) << s;
  EXPECT_TRUE(fs::exists(single[0]));
  shards = exportHf(dir.path, m, 8192);
  EXPECT_FALSE(fs::exists(single[0]));
  EXPECT_TRUE(HfWeights(dir.path).sharded());
  Llama other(cfg, 4);
  loadHfIntoLlama(dir.path, other);
  at::Tensor tokens = randomTokens(1, 5, cfg.vocab, 1);
  EXPECT_TRUE(at::equal(other.forward(tokens), m.forward(tokens)));
}

TEST(Safetensors, HfLoadMismatchedConfigNamesTensorAndShapes) {
  LlamaConfig cfg = tinyConfig();
  TempDir dir;
  exportHf(dir.path, Llama(cfg, 1), 1 << 30);
  LlamaConfig wider = cfg;
  wider.hidden = 48;
  Llama m(wider, 2);
  at::Tensor tokens = randomTokens(1, 4, cfg.vocab, 1);
  at::Tensor before = m.forward(tokens);
  expectError([&] { loadHfIntoLlama(dir.path, m); },
              {dir / "model.safetensors", "tensor 'model.embed_tokens.weight'",
               "has shape [64, 32], expected [64, 48]"});
  // Checked before anything is copied: the model is untouched.
  EXPECT_TRUE(at::equal(m.forward(tokens), before));

  LlamaConfig moreKv = cfg;
  moreKv.kvHeads = 4;
  Llama k(moreKv, 2);
  expectError([&] { loadHfIntoLlama(dir.path, k); },
              {"tensor 'model.layers.0.self_attn.k_proj.weight'",
               "has shape [16, 32], expected [32, 32]"});
}

TEST(Safetensors, HfLoadTiedAndUntiedHeads) {
  LlamaConfig tied = tinyConfig();
  tied.tieEmbeddings = true;
  LlamaConfig untied = tinyConfig();
  TempDir tiedDir, untiedDir;
  exportHf(tiedDir.path, Llama(tied, 1), 1 << 30);
  Llama u(untied, 2);
  expectError([&] { loadHfIntoLlama(tiedDir.path, u); },
              {"tensor 'lm_head.weight' is missing", "expected shape [64, 32]",
               "parameter 'lm_head'"});
  // A tied model ignores an lm_head.weight in the files (as transformers
  // does): the embedding is the head.
  Llama src(untied, 3);
  exportHf(untiedDir.path, src, 1 << 30);
  Llama t(tied, 4);
  loadHfIntoLlama(untiedDir.path, t);
  EXPECT_TRUE(at::equal(t.namedParameters()[0].second, src.namedParameters()[0].second));
}

TEST(Safetensors, HfLoadConvertsHalfPrecisionAndRejectsIntegers) {
  LlamaConfig cfg = tinyConfig();
  Llama src(cfg, 1);
  std::vector<std::pair<std::string, at::Tensor>> hf;
  for (const auto &[name, t] : src.namedParameters())
    hf.emplace_back(hfParameterName(name), hfParameterIs1D(name) ? t.reshape({-1}) : t);
  TempDir dir;
  SafetensorsWriteOptions bf16;
  bf16.floatDtype = at::kBFloat16;
  writeSafetensors(dir / "model.safetensors", hf, {{"format", "pt"}}, bf16);
  Llama dst(cfg, 2);
  loadHfIntoLlama(dir.path, dst);
  auto a = src.namedParameters(), b = dst.namedParameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(b[i].second, a[i].second.to(at::kBFloat16).to(at::kFloat)))
        << a[i].first;

  hf[3].second = at::zeros(hf[3].second.sizes(), at::kLong);
  writeSafetensors(dir / "model.safetensors", hf);
  expectError([&] { loadHfIntoLlama(dir.path, dst); },
              {"tensor '" + hf[3].first + "' has dtype I64",
               "expected a floating-point dtype"});
}

TEST(Safetensors, HfDirectoryErrors) {
  TempDir dir;
  expectError([&] { HfWeights w(dir.path); },
              {dir.path, "neither model.safetensors nor model.safetensors.index.json"});
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": ";
  expectError([&] { HfWeights w(dir.path); },
              {dir / "model.safetensors.index.json", "not valid JSON"});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})";
  writeSafetensors(dir / "s1.safetensors", {{"a", at::ones({2, 2})}});
  HfWeights w(dir.path);
  EXPECT_TRUE(w.sharded());
  EXPECT_EQ(w.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(at::equal(w.read("a"), at::ones({2, 2})));
  expectError([&] { w.read("b"); }, {dir / "s2.safetensors", "cannot open"});
  expectError([&] { w.read("c"); }, {dir.path, "no tensor 'c'"});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "s1.safetensors", "z": "s1.safetensors"}})";
  expectError([&] { HfWeights(dir.path).read("z"); },
              {"weight_map puts 'z' in s1.safetensors, which has no such tensor"});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "../s1.safetensors"}})";
  expectError([&] { HfWeights w2(dir.path); },
              {"which is not a file name in the directory"});
}

TEST(Safetensors, HfConfigFromJson) {
  TempDir dir;
  auto write = [&](const std::string &text) {
    std::ofstream(dir / "config.json") << text;
  };
  // Llama-2-7B's config.json (the fields that matter).
  write(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
            "tie_word_embeddings": false, "torch_dtype": "float16",
            "vocab_size": 32000})");
  LlamaConfig c = hfConfigFromJson(dir / "config.json");
  EXPECT_EQ(c.layers, 32);
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.ffn, 11008);
  EXPECT_EQ(c.vocab, 32000);
  EXPECT_EQ(c.normEps, 1e-5);
  EXPECT_EQ(c.ropeTheta, 10000.0);
  EXPECT_FALSE(c.qkvBias);
  EXPECT_EQ(c.paramCount(), 6738415616LL);

  // Qwen2.5-0.5B: biases implied by qwen2, GQA, tied.
  write(R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
            "num_attention_heads": 14, "num_hidden_layers": 24,
            "num_key_value_heads": 2, "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
            "vocab_size": 151936})");
  c = hfConfigFromJson(dir.path);
  EXPECT_TRUE(c.qkvBias);
  EXPECT_TRUE(c.tieEmbeddings);
  EXPECT_EQ(c.kvHeads, 2);
  EXPECT_EQ(c.ropeTheta, 1e6);
  EXPECT_EQ(c.paramCount(), 494032768LL);

  write(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": 2})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {dir / "config.json", "has no 'vocab_size'"});
  write(R"({"model_type": "gpt2"})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {"model_type 'gpt2' is not supported"});
  write(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": 0, "vocab_size": 10})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {"'num_hidden_layers' must be a positive integer, got 0"});
  write("{\"model_type\": ");
  expectError([&] { hfConfigFromJson(dir.path); }, {dir / "config.json", "not valid JSON"});
  fs::remove(dir / "config.json");
  expectError([&] { hfConfigFromJson(dir.path); }, {"cannot read " + dir / "config.json"});
}

// Qwen3, Llama 3.1 and Mistral config.json files: their published parameter
// counts (Qwen3-0.6B 596,049,920; Llama-3.1-8B 8,030,261,248; Mistral-7B
// 7,241,732,096), the new keys, the refusals hflowc makes too (one code,
// runtime/schema/HfConfig.cpp), and export -> config.json -> the same config.
TEST(Safetensors, HfConfigArchitectures) {
  TempDir dir;
  auto write = [&](const std::string &text) { std::ofstream(dir / "config.json") << text; };
  write(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "hidden_size": 1024, "intermediate_size": 3072, "head_dim": 128,
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
            "attention_bias": false, "attention_dropout": 0.0, "hidden_act": "silu",
            "max_position_embeddings": 40960, "max_window_layers": 28,
            "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
            "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  LlamaConfig q = hfConfigFromJson(dir.path);
  EXPECT_EQ(q.arch, "qwen3");
  EXPECT_EQ(q.headDim(), 128);
  EXPECT_EQ(q.headSize, 128); // not hidden / heads (64)
  EXPECT_TRUE(q.qkNorm);
  EXPECT_FALSE(q.qkvBias);
  EXPECT_EQ(q.paramCount(), 596049920LL);

  write(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128,
            "mlp_bias": false, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "vocab_size": 128256})");
  LlamaConfig l = hfConfigFromJson(dir.path);
  EXPECT_EQ(l.headSize, 0); // 128 = 4096 / 32: the default
  EXPECT_EQ(l.ropeScaling.factor, 8.0);
  EXPECT_EQ(l.ropeScaling.originalMaxPositions, 8192);
  EXPECT_EQ(l.paramCount(), 8030261248LL);

  write(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
            "rope_theta": 10000.0, "vocab_size": 32000})");
  LlamaConfig m = hfConfigFromJson(dir.path);
  EXPECT_EQ(m.arch, "mistral");
  EXPECT_EQ(m.slidingWindow, 4096);
  EXPECT_EQ(m.paramCount(), 7241732096LL);

  const std::string base = R"("model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10)";
  write("{" + base + R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {dir / "config.json", "'rope_scaling' of type 'dynamic' is not supported"});
  write("{" + base + R"(, "use_sliding_window": true})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {"'use_sliding_window' true is not supported for qwen2"});
  write("{" + base + R"(, "hidden_act": "gelu_pytorch_tanh"})");
  expectError([&] { hfConfigFromJson(dir.path); },
              {"hidden_act 'gelu_pytorch_tanh' is not supported"});
  write("{" + base + R"(, "num_experts": 4})");
  expectError([&] { hfConfigFromJson(dir.path); }, {"'num_experts' 4 describes a mixture"});

  // Export writes what load reads back.
  for (LlamaConfig c : {q, l, m}) {
    c.layers = 1, c.hidden = 32, c.heads = 4, c.kvHeads = 2, c.ffn = 16, c.vocab = 64;
    if (c.headSize)
      c.headSize = 16;
    std::ofstream(dir / "config.json") << hfConfigJson(c);
    LlamaConfig back = hfConfigFromJson(dir.path);
    EXPECT_EQ(back.arch, c.arch);
    EXPECT_EQ(back.headDim(), c.headDim());
    EXPECT_EQ(back.qkNorm, c.qkNorm);
    EXPECT_EQ(back.ropeScaling.factor, c.ropeScaling.factor);
    EXPECT_EQ(back.ropeScaling.highFreqFactor, c.ropeScaling.highFreqFactor);
    EXPECT_EQ(back.slidingWindow, c.slidingWindow);
    EXPECT_EQ(back.paramCount(), c.paramCount());
    EXPECT_EQ(hfConfigJson(back), hfConfigJson(c)) << c.arch;
  }
}
