//===- CheckpointTest.cpp - atomic files and training-state checkpoints ----===//
#include "runtime/models/Checkpoint.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Safetensors.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace hflow::models;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    static int counter = 0;
    path = "/tmp/hflow-ckpt-test-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const {
    return (fs::path(path) / name).string();
  }
};

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

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Entries of `dir` whose name contains ".tmp-" or ".old-" (".hflow-tmp-" too).
std::vector<std::string> leftovers(const std::string &dir) {
  std::vector<std::string> out;
  for (const auto &e : fs::recursive_directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.find("tmp-") != std::string::npos || n.find(".old-") != std::string::npos)
      out.push_back(e.path().string());
  }
  return out;
}

CheckpointState sampleState(int64_t step, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  CheckpointState s;
  s.step = step;
  at::Tensor w = at::randn({16, 8}, gen, at::TensorOptions().dtype(at::kFloat));
  s.tensors["model.w"] = w;
  s.tensors["adam.m"] = at::randn({16, 8}, gen, at::TensorOptions().dtype(at::kDouble));
  s.tensors["adam.v.bf16"] = w.abs().to(at::kBFloat16);
  s.tensors["adam.v.f16"] = w.abs().to(at::kHalf);
  s.tensors["adam.step"] = at::scalar_tensor(int64_t(step), at::kLong);
  s.tensors["data.order"] = at::randperm(50, gen, at::TensorOptions().dtype(at::kLong));
  s.tensors["mask"] = w > 0;
  s.tensors["counts"] = at::arange(7, at::kInt);
  s.tensors["empty"] = at::empty({0, 3}, at::kFloat);
  s.meta = {{"data_position", 12345},
            {"epoch", 2},
            {"lr", 1.25e-6},
            {"run", {{"name", "ppo"}, {"seeds", {1, 2, 3}}}}};
  return s;
}

void expectSameState(const CheckpointState &a, const CheckpointState &b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.meta, b.meta);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto &[name, t] : a.tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(b.tensors.count(name), 1u);
    const at::Tensor &u = b.tensors.at(name);
    EXPECT_EQ(t.scalar_type(), u.scalar_type());
    EXPECT_EQ(t.sizes(), u.sizes());
    EXPECT_TRUE(at::equal(t, u));
  }
}

struct HookReset {
  ~HookReset() { testhooks::setSaveFailureHook({}); }
};

} // namespace

TEST(Checkpoint, RoundTripIsBitExactIncludingGeneratorState) {
  TempDir dir;
  CheckpointState s = sampleState(10, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  (void)at::randn({5}, gen); // advance it, normal cache included
  s.tensors["rng.cpu"] = generatorState(gen);
  at::Tensor nextDraw = at::randn({6}, gen);

  std::string stepDir = saveCheckpoint(dir.path, s);
  EXPECT_EQ(stepDir, dir / "step-10");
  EXPECT_TRUE(fs::is_regular_file(dir / "step-10/state.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(dir / "step-10/meta.json"));
  EXPECT_EQ(slurp(dir / "latest"), "step-10\n");
  EXPECT_TRUE(leftovers(dir.path).empty());
  auto meta = nlohmann::json::parse(slurp(dir / "step-10/meta.json"));
  EXPECT_EQ(meta["format"], "hflow-checkpoint");
  EXPECT_EQ(meta["step"], 10);
  EXPECT_EQ(meta["state_fnv1a64"],
            SafetensorsFile(dir / "step-10/state.safetensors")
                .metadata()
                .at(kSafetensorsChecksumKey));

  CheckpointState back = loadCheckpoint(dir.path);
  expectSameState(s, back);
  expectSameState(s, loadCheckpoint(dir.path, 10));

  auto fresh = at::make_generator<at::CPUGeneratorImpl>(7);
  restoreGenerator(fresh, back.tensors.at("rng.cpu"));
  EXPECT_TRUE(at::equal(at::randn({6}, fresh), nextDraw));
  expectError([&] { restoreGenerator(fresh, at::zeros({3}, at::kFloat)); },
              {"generator state must be a 1-D uint8 tensor"});
}

TEST(Checkpoint, LatestFollowsTheNewestSave) {
  TempDir dir;
  EXPECT_EQ(latestCheckpointStep(dir.path), -1);
  expectError([&] { loadCheckpoint(dir.path); },
              {"no checkpoint in '" + dir.path + "'", dir / "latest"});
  for (int64_t step : {5, 10, 15})
    saveCheckpoint(dir.path, sampleState(step, step));
  EXPECT_EQ(latestCheckpointStep(dir.path), 15);
  EXPECT_EQ(listCheckpointSteps(dir.path), (std::vector<int64_t>{5, 10, 15}));
  expectSameState(loadCheckpoint(dir.path), sampleState(15, 15));
  expectSameState(loadCheckpoint(dir.path, 5), sampleState(5, 5));
  expectError([&] { loadCheckpoint(dir.path, 7); },
              {"no checkpoint step-7", dir / "step-7"});
  // Saving a step again replaces it.
  CheckpointState again = sampleState(10, 99);
  saveCheckpoint(dir.path, again);
  EXPECT_EQ(latestCheckpointStep(dir.path), 10);
  expectSameState(loadCheckpoint(dir.path), again);
  EXPECT_TRUE(leftovers(dir.path).empty());
}

TEST(Checkpoint, FailedSaveKeepsThePreviousCheckpoint) {
  HookReset reset;
  TempDir dir;
  CheckpointState first = sampleState(1, 1);
  saveCheckpoint(dir.path, first);
  for (const char *where : {"tmpdir-created", "state-written", "meta-written", "renamed"}) {
    SCOPED_TRACE(where);
    testhooks::setSaveFailureHook([&](const std::string &stage) {
      if (stage == where)
        throw std::runtime_error("injected failure at " + stage);
    });
    expectError([&] { saveCheckpoint(dir.path, sampleState(2, 2)); },
                {"saving checkpoint step-2 in '" + dir.path + "'",
                 std::string("injected failure at ") + where});
    EXPECT_EQ(slurp(dir / "latest"), "step-1\n");
    EXPECT_FALSE(fs::exists(dir / "step-2"));
    EXPECT_TRUE(leftovers(dir.path).empty());
    expectSameState(loadCheckpoint(dir.path), first);
  }

  // A failed re-save of an existing step keeps the old contents of it.
  testhooks::setSaveFailureHook({});
  CheckpointState second = sampleState(2, 2);
  saveCheckpoint(dir.path, second);
  testhooks::setSaveFailureHook([](const std::string &stage) {
    if (stage == "renamed")
      throw std::runtime_error("injected");
  });
  expectError([&] { saveCheckpoint(dir.path, sampleState(2, 77)); }, {"injected"});
  EXPECT_EQ(slurp(dir / "latest"), "step-2\n");
  expectSameState(loadCheckpoint(dir.path), second);
  EXPECT_TRUE(leftovers(dir.path).empty());
  testhooks::setSaveFailureHook({});
  saveCheckpoint(dir.path, sampleState(2, 77));
  expectSameState(loadCheckpoint(dir.path), sampleState(2, 77));
  EXPECT_EQ(listCheckpointSteps(dir.path), (std::vector<int64_t>{1, 2}));
}

TEST(Checkpoint, UnwritableDirectoryFailsEarlyAndCleanly) {
  TempDir dir;
  std::ofstream(dir / "file") << "not a directory";
  expectError([&] { checkWritable(dir / "file/ckpt"); },
              {"checkpoint directory '" + dir / "file/ckpt" + "' cannot be created"});
  expectError([&] { checkWritable(dir / "file"); },
              {"exists and is not a directory"});
  expectError([&] { saveCheckpoint(dir / "file/ckpt", sampleState(1, 1)); },
              {"saving checkpoint step-1", "cannot create the directory"});
  checkWritable(dir / "new/nested"); // created
  EXPECT_TRUE(fs::is_directory(dir / "new/nested"));
  EXPECT_TRUE(fs::is_empty(dir / "new/nested")); // the probe is gone
  expectError([&] { checkWritable(dir.path, ~uint64_t(0)); }, {"bytes free"});
  CheckpointState negative;
  negative.step = -1;
  EXPECT_THROW(saveCheckpoint(dir.path, negative), std::invalid_argument);

  // Permissions do not stop root; the rest needs an ordinary user.
  if (::geteuid() == 0)
    return;
  const std::string ro = dir / "ro";
  CheckpointState first = sampleState(1, 1);
  saveCheckpoint(ro, first);
  ASSERT_EQ(::chmod(ro.c_str(), 0500), 0);
  expectError([&] { checkWritable(ro); }, {"'" + ro + "' is not writable"});
  expectError([&] { saveCheckpoint(ro, sampleState(2, 2)); }, {"saving checkpoint step-2"});
  ASSERT_EQ(::chmod(ro.c_str(), 0700), 0);
  EXPECT_EQ(latestCheckpointStep(ro), 1);
  EXPECT_FALSE(fs::exists(fs::path(ro) / "step-2"));
  expectSameState(loadCheckpoint(ro), first);
}

TEST(Checkpoint, CorruptCheckpointsAreDetected) {
  TempDir dir;
  CheckpointState s = sampleState(3, 3);
  saveCheckpoint(dir.path, s);
  const std::string state = dir / "step-3/state.safetensors";
  const std::string meta = dir / "step-3/meta.json";
  const std::string good = slurp(state), goodMeta = slurp(meta);
  auto restore = [&] {
    std::ofstream(state, std::ios::binary | std::ios::trunc) << good;
    std::ofstream(meta, std::ios::binary | std::ios::trunc) << goodMeta;
  };

  { // one flipped bit in the data
    std::string bad = good;
    bad[bad.size() - 10] ^= 0x01;
    std::ofstream(state, std::ios::binary | std::ios::trunc) << bad;
    expectError([&] { loadCheckpoint(dir.path); },
                {"safetensors " + state, "checksum mismatch", "corrupt"});
  }
  restore();
  std::ofstream(state, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 100);
  expectError([&] { loadCheckpoint(dir.path); }, {state, "is the file truncated?"});
  restore();
  std::ofstream(state, std::ios::binary | std::ios::trunc) << good.substr(0, 6);
  expectError([&] { loadCheckpoint(dir.path); }, {state, "truncated: the file has 6 bytes"});

  restore();
  std::ofstream(meta, std::ios::trunc) << goodMeta.substr(0, goodMeta.size() / 2);
  expectError([&] { loadCheckpoint(dir.path); }, {meta, "not valid JSON"});

  restore();
  {
    auto j = nlohmann::json::parse(goodMeta);
    j["state_fnv1a64"] = "0123456789abcdef";
    std::ofstream(meta, std::ios::trunc) << j.dump();
    expectError([&] { loadCheckpoint(dir.path); },
                {state, "differs from " + meta, "do not belong together"});
    j = nlohmann::json::parse(goodMeta);
    j["step"] = 4;
    std::ofstream(meta, std::ios::trunc) << j.dump();
    expectError([&] { loadCheckpoint(dir.path); }, {meta, "says step 4, expected 3"});
    j = nlohmann::json::parse(goodMeta);
    j.erase("format");
    std::ofstream(meta, std::ios::trunc) << j.dump();
    expectError([&] { loadCheckpoint(dir.path); }, {meta, "not an hflow checkpoint"});
  }

  restore();
  std::ofstream(dir / "latest", std::ios::trunc) << "garbage\n";
  expectError([&] { loadCheckpoint(dir.path); },
              {dir / "latest", "expected \"step-<N>\", found \"garbage\""});
  std::ofstream(dir / "latest", std::ios::trunc) << "step-3\n";
  expectSameState(loadCheckpoint(dir.path), s);
}

TEST(Checkpoint, RestoreIntoChecksNameShapeAndDtype) {
  CheckpointState s;
  s.step = 4;
  s.tensors["w"] = at::arange(12, at::kFloat).view({3, 4});
  at::Tensor dst = at::zeros({3, 4});
  restoreInto(s, "w", dst);
  EXPECT_TRUE(at::equal(dst, s.tensors["w"]));
  EXPECT_FALSE(dst.is_same(s.tensors["w"])); // copied, not aliased
  at::Tensor wrong = at::zeros({4, 3});
  expectError([&] { restoreInto(s, "w", wrong); },
              {"checkpoint tensor 'w': expected [4, 3] Float, found [3, 4] Float"});
  at::Tensor wrongType = at::zeros({3, 4}, at::kDouble);
  expectError([&] { restoreInto(s, "w", wrongType); },
              {"expected [3, 4] Double, found [3, 4] Float"});
  expectError([&] { restoreInto(s, "missing", dst); },
              {"checkpoint step 4 has no tensor 'missing' (expected [3, 4] Float)"});
  at::Tensor undefined;
  restoreInto(s, "w", undefined);
  EXPECT_TRUE(at::equal(undefined, s.tensors["w"]));
}

TEST(Checkpoint, ModelWeightsRoundTripIntoAnotherModel) {
  LlamaConfig cfg;
  cfg.layers = 2, cfg.hidden = 32, cfg.heads = 4, cfg.kvHeads = 2, cfg.ffn = 64;
  cfg.vocab = 64, cfg.qkvBias = true;
  Llama a(cfg, 1), b(cfg, 2);
  CheckpointState s;
  s.step = 100;
  for (const auto &[name, t] : a.namedParameters())
    s.tensors["actor." + name] = t;
  TempDir dir;
  saveCheckpoint(dir.path, s);
  CheckpointState back = loadCheckpoint(dir.path);
  for (auto &[name, t] : b.namedParameters())
    restoreInto(back, "actor." + name, t);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor tokens = at::randint(cfg.vocab, {2, 7}, gen, at::TensorOptions().dtype(at::kLong));
  EXPECT_TRUE(at::equal(a.forward(tokens), b.forward(tokens)));

  LlamaConfig wider = cfg;
  wider.hidden = 48;
  Llama c(wider, 3);
  auto named = c.namedParameters();
  expectError([&] { restoreInto(back, "actor.embed", named[0].second); },
              {"checkpoint tensor 'actor.embed': expected [64, 48] Float, found [64, 32] Float"});
}

TEST(Checkpoint, AtomicFileWriter) {
  TempDir dir;
  const std::string p = dir / "f.txt";
  writeFileAtomic(p, "one");
  EXPECT_EQ(slurp(p), "one");
  {
    AtomicFileWriter w(p);
    w.write("two, partly");
    EXPECT_TRUE(fs::exists(w.tempPath()));
    EXPECT_EQ(w.tempPath(), dir / ".f.txt.hflow-tmp-" + std::to_string(::getpid()));
    // destroyed without commit(): nothing happens to p
  }
  EXPECT_EQ(slurp(p), "one");
  EXPECT_TRUE(leftovers(dir.path).empty());
  {
    AtomicFileWriter w(p);
    w.write("three");
    w.commit();
    EXPECT_EQ(w.bytesWritten(), 5u);
  }
  EXPECT_EQ(slurp(p), "three");
  expectError([&] { writeFileAtomic(dir / "no/such/dir/f", "x"); },
              {"cannot write '" + dir / "no/such/dir/f" + "': No such file or directory"});
  EXPECT_EQ(fnv1a64("", 0), kFnv1a64Offset);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL); // the published test vector
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
}

// What gives the numbers their meaning is covered by the integrity checksum:
// two tensors' offsets swapped in the state file's header (the data buffer,
// and so its own checksum, unchanged) and an edited meta.json are refused.
TEST(Checkpoint, HeadersAndMetaAreCovered) {
  TempDir d;
  CheckpointState st;
  st.step = 3;
  st.tensors["a"] = at::full({4}, 1.0f);
  st.tensors["b"] = at::full({4}, 2.0f);
  st.meta = {{"rank", 0}};
  saveCheckpoint(d.path, st);
  EXPECT_EQ(loadCheckpoint(d.path, 3).tensors.at("b")[0].item<float>(), 2.0f);

  const std::string state = d / "step-3/state.safetensors";
  std::string blob = slurp(state);
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  nlohmann::json h = nlohmann::json::parse(blob.substr(8, n));
  std::swap(h["a"]["data_offsets"], h["b"]["data_offsets"]);
  std::string text = h.dump();
  ASSERT_LE(text.size(), n);
  text.append(n - text.size(), ' ');
  {
    std::ofstream out(state, std::ios::binary | std::ios::trunc);
    out << blob.substr(0, 8) << text << blob.substr(8 + n);
  }
  expectError([&] { loadCheckpoint(d.path, 3); },
              {"step-3/meta.json: the integrity checksum", "the checkpoint is corrupt"});

  saveCheckpoint(d.path, st); // a good one again, then edit its meta.json
  const std::string metaPath = d / "step-3/meta.json";
  nlohmann::json meta = nlohmann::json::parse(slurp(metaPath));
  meta["meta"]["rank"] = 1;
  {
    std::ofstream out(metaPath, std::ios::trunc);
    out << meta.dump(2) << "\n";
  }
  expectError([&] { loadCheckpoint(d.path, 3); },
              {"step-3/meta.json: the integrity checksum", "changed since it was written"});
}
