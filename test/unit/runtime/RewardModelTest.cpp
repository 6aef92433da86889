//===- RewardModelTest.cpp - a reward model against an independent forward -===//
//
// test/integration/Inputs/seqcls_reference.py (python3-torch, float64, its
// own Llama forward from the published formulas) writes a random
// LlamaForSequenceClassification checkpoint and the Bradley-Terry loss of a
// few preference pairs with its gradient for every weight. hflow loads the
// checkpoint (a headless body and its score head), scores the same
// sequences at the same positions, and its loss and gradients must match.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/Safetensors.h"
#include "runtime/rl/Losses.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace hflow;

namespace {

struct Pair {
  std::string prompt, chosen, rejected;
};

std::vector<int64_t> bytesOf(const std::string &s) {
  std::vector<int64_t> v;
  for (unsigned char c : s)
    v.push_back(c);
  return v;
}

int run(const std::string &cmd) { return std::system(cmd.c_str()); }

} // namespace

TEST(RewardModel, BradleyTerryMatchesIndependentReference) {
  const std::string py = HFLOW_TORCH_PYTHON, script = HFLOW_SEQCLS_REFERENCE;
  ASSERT_FALSE(py.empty()) << "no python3 with torch (Debian's python3-torch) was found";
  const fs::path dir = fs::temp_directory_path() / ("hflow-rm-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<Pair> pairs = {{"12+7=", "19", "18"},
                                   {"3+4=", "7", "70"},
                                   {"40+2=", "42", "24"},
                                   {"1+1=", "2", "3"}};
  {
    std::ofstream f(dir / "pairs.jsonl");
    for (const Pair &p : pairs)
      f << nlohmann::json{{"prompt", p.prompt}, {"chosen", p.chosen}, {"rejected", p.rejected}}
               .dump()
        << "\n";
  }
  const std::string ck = (dir / "ck").string();
  ASSERT_EQ(run(py + " " + script + " make " + ck + " --seed 5"), 0);
  ASSERT_EQ(run(py + " " + script + " bradley-terry " + ck + " " + (dir / "pairs.jsonl").string() +
                " " + (dir / "bt.json").string()),
            0);
  nlohmann::json ref;
  std::ifstream(dir / "bt.json") >> ref;

  models::LlamaConfig cfg = models::hfConfigFromJson(ck);
  ASSERT_FALSE(cfg.lmHead) << "a sequence-classification config is headless";
  ASSERT_EQ(cfg.padToken, 0);
  models::Llama m(cfg, 0);
  models::loadHfIntoLlama(ck, m);
  at::Tensor head = models::loadHfScoreHead(ck, cfg.hidden);
  m.setTrainable(true);
  head.requires_grad_(true);

  // chosen, rejected, chosen, ...: prompt + response + "\n", right padded.
  std::vector<std::vector<int64_t>> seqs;
  for (const Pair &p : pairs)
    for (const std::string *r : {&p.chosen, &p.rejected}) {
      std::vector<int64_t> t = bytesOf(p.prompt), x = bytesOf(*r);
      t.insert(t.end(), x.begin(), x.end());
      t.push_back('\n');
      seqs.push_back(t);
    }
  const int64_t N = (int64_t)seqs.size();
  int64_t T = 0;
  for (auto &s : seqs)
    T = std::max<int64_t>(T, (int64_t)s.size());
  at::Tensor toks = at::zeros({N, T}, at::kLong), mask = at::zeros({N, T});
  for (int64_t i = 0; i < N; ++i)
    for (size_t j = 0; j < seqs[(size_t)i].size(); ++j) {
      toks[i][(int64_t)j] = seqs[(size_t)i][j];
      mask[i][(int64_t)j] = 1.0f;
    }
  at::Tensor h = m.hidden(toks, models::positionsFromMask(mask), mask);
  at::Tensor at_ = models::scoredPositions(toks, mask, cfg.padToken);
  at::Tensor sc =
      at::linear(h.gather(1, at_.view({N, 1, 1}).expand({N, 1, h.size(2)})).squeeze(1), head)
          .squeeze(-1);
  for (int64_t i = 0; i < N; ++i) {
    const double want = ref["scores"][(size_t)i].get<double>();
    EXPECT_NEAR(sc[i].item<double>(), want, 1e-5 * std::max(1.0, std::abs(want))) << "score " << i;
  }
  at::Tensor pr = sc.view({-1, 2});
  rl::PreferenceLossOutput bt =
      rl::bradley_terry_loss(pr.select(1, 0), pr.select(1, 1), (double)pairs.size());
  const double wantLoss = ref["loss"].get<double>();
  EXPECT_NEAR(bt.loss.item<double>(), wantLoss, 1e-6 * std::max(1.0, wantLoss));
  bt.loss.backward();

  // Every weight's gradient, matched by its Hugging Face name: the largest
  // difference relative to the largest reference entry.
  std::vector<at::Tensor> leaves = m.parameters();
  int checked = 0;
  double worst = 0;
  auto compare = [&](const std::string &hf, const at::Tensor &g) {
    ASSERT_TRUE(ref["grads"].contains(hf)) << hf;
    const auto &r = ref["grads"][hf];
    std::vector<double> data = r["data"].get<std::vector<double>>();
    at::Tensor want = at::tensor(data, at::kDouble);
    at::Tensor got = g.detach().to(at::kDouble).reshape({-1});
    ASSERT_EQ(got.numel(), want.numel()) << hf;
    const double scale = std::max(want.abs().max().item<double>(), 1e-12);
    const double err = (got - want).abs().max().item<double>() / scale;
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << hf;
    ++checked;
  };
  for (const auto &[name, view] : m.namedParameters()) {
    at::Tensor g;
    for (const at::Tensor &p : leaves)
      if (p.data_ptr() == view.data_ptr())
        g = p.grad();
    ASSERT_TRUE(g.defined()) << name;
    compare(models::hfParameterName(name), g);
  }
  compare("score.weight", head.grad());
  EXPECT_EQ(checked, (int)ref["grads"].size());
  std::printf("[ref] %lld scores, Bradley-Terry loss %.9f (reference %.9f), %d gradients, "
              "largest relative difference %.2e\n",
              (long long)N, bt.loss.item<double>(), wantLoss, checked, worst);
  fs::remove_all(dir);
}
