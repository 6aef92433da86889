//===- RLTest.cpp - hflow::rl against independently computed references ---===//
//
// Two kinds of tests:
//  - Reference/*: every case of rl_reference.json (written at build time by
//    test/unit/runtime/rl_reference.py, which recomputes each formula of
//    RL-FORMULAS.md in plain Python floats) is run through hflow::rl in three
//    variants and compared elementwise, |got - want| <= tol * max(1, |want|):
//      F64        float64 values, float64 masks    tol 1e-10
//      F64BoolMask float64 values, bool masks      tol 1e-10
//      F32        float32 values, int64 masks      tol 5e-6
//  - hand-worked small cases, gradients, and the error paths.
//
//===----------------------------------------------------------------------===//
#include "runtime/rl/Advantages.h"
#include "runtime/rl/Aggregate.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Losses.h"
#include "runtime/rl/Masked.h"
#include "runtime/rl/RolloutCorrection.h"
#include "runtime/rl/Shaping.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hflow::rl;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------
// The reference file
// ---------------------------------------------------------------------------
struct Reference {
  json doc;
  std::string error; ///< why it could not be read, empty when fine
  std::map<std::string, const json *> byName;
};

const Reference &reference() {
  static Reference ref = [] {
    Reference r;
    std::ifstream in(HFLOW_RL_REFERENCE);
    if (!in) {
      r.error = std::string("cannot open ") + HFLOW_RL_REFERENCE +
                " (it is written at build time by rl_reference.py; is "
                "HFLOW_RL_PYTHON a python3 with torch?)";
      return r;
    }
    try {
      in >> r.doc;
    } catch (const std::exception &e) {
      r.error = std::string("cannot parse ") + HFLOW_RL_REFERENCE + ": " + e.what();
      return r;
    }
    for (const json &c : r.doc.at("cases"))
      r.byName[c.at("name").get<std::string>()] = &c;
    return r;
  }();
  return ref;
}

enum class Variant { F64, F64BoolMask, F32 };

struct RefParam {
  std::string name;
  Variant variant;
};

void PrintTo(const RefParam &p, std::ostream *os) {
  *os << p.name << (p.variant == Variant::F32 ? " float32"
                    : p.variant == Variant::F64 ? " float64"
                                                : " float64/bool-mask");
}

std::vector<RefParam> referenceParams() {
  const Reference &ref = reference();
  std::vector<RefParam> out;
  if (!ref.error.empty()) {
    out.push_back({"<missing reference file>", Variant::F64});
    return out;
  }
  for (const json &c : ref.doc.at("cases"))
    for (Variant v : {Variant::F64, Variant::F64BoolMask, Variant::F32})
      out.push_back({c.at("name").get<std::string>(), v});
  return out;
}

std::string paramName(const testing::TestParamInfo<RefParam> &info) {
  std::string s;
  for (char ch : info.param.name)
    s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  switch (info.param.variant) {
  case Variant::F64:
    return s + "_F64";
  case Variant::F64BoolMask:
    return s + "_F64BoolMask";
  case Variant::F32:
    return s + "_F32";
  }
  return s;
}

bool isMaskName(const std::string &k) {
  return k == "mask" || k == "loss_mask" || k == "response_mask";
}

at::Tensor fromSpec(const json &spec, at::ScalarType dtype) {
  std::vector<int64_t> shape = spec.at("shape").get<std::vector<int64_t>>();
  std::vector<double> data = spec.at("data").get<std::vector<double>>();
  at::Tensor t = at::tensor(data, at::dtype(at::kDouble)).reshape(shape);
  return t.to(dtype);
}

std::optional<double> optParam(const json &p, const char *k) {
  if (!p.contains(k) || p.at(k).is_null())
    return std::nullopt;
  return p.at(k).get<double>();
}

AggOptions aggOptions(const json &p) {
  AggOptions o;
  if (p.contains("dp_size"))
    o.dp_size = p.at("dp_size").get<int64_t>();
  o.batch_num_tokens = optParam(p, "batch_num_tokens");
  o.global_batch_size = optParam(p, "global_batch_size");
  o.loss_scale_factor = optParam(p, "loss_scale_factor");
  return o;
}

using Outputs = std::map<std::string, at::Tensor>;

/// Runs one reference case through hflow::rl.
Outputs run(const json &c, Variant variant) {
  const at::ScalarType dt = variant == Variant::F32 ? at::kFloat : at::kDouble;
  const at::ScalarType mdt = variant == Variant::F64   ? at::kDouble
                             : variant == Variant::F32 ? at::kLong
                                                       : at::kBool;
  const json &I = c.at("inputs");
  const json &P = c.at("params");
  auto in = [&](const char *k) {
    const json &spec = I.at(k);
    if (std::string(k) == "index") {
      std::vector<int64_t> d = spec.at("data").get<std::vector<int64_t>>();
      return at::tensor(d, at::dtype(at::kLong));
    }
    return fromSpec(spec, isMaskName(k) ? mdt : dt);
  };
  const std::string fn = c.at("fn").get<std::string>();
  auto axis = [&]() -> std::optional<int64_t> {
    if (P.contains("axis"))
      return P.at("axis").get<int64_t>();
    return std::nullopt;
  };
  if (fn == "masked_sum")
    return {{"out", masked_sum(in("values"), in("mask"), axis())}};
  if (fn == "masked_mean")
    return {{"out", masked_mean(in("values"), in("mask"), axis())}};
  if (fn == "masked_var")
    return {{"out", masked_var(in("values"), in("mask"), P.at("unbiased").get<bool>())}};
  if (fn == "masked_whiten")
    return {{"out", masked_whiten(in("values"), in("mask"), P.at("shift_mean").get<bool>())}};
  if (fn == "clip_by_value")
    return {{"out", clip_by_value(in("x"), in("lo"), in("hi"))}};
  if (fn == "entropy_from_logits")
    return {{"out", entropy_from_logits(in("logits"))}};
  if (fn == "agg_loss")
    return {{"out", agg_loss(in("loss_mat"), in("loss_mask"),
                             P.at("mode").get<std::string>(), aggOptions(P))}};
  auto adv = [](const AdvantageOutput &o) {
    return Outputs{{"advantages", o.advantages}, {"returns", o.returns}};
  };
  if (fn == "gae")
    return adv(compute_gae_advantage_return(in("token_level_rewards"), in("values"),
                                            in("response_mask"), P.at("gamma").get<double>(),
                                            P.at("lam").get<double>()));
  if (fn == "grpo")
    return adv(compute_grpo_outcome_advantage(
        in("token_level_rewards"), in("response_mask"), in("index"),
        P.at("epsilon").get<double>(), P.at("norm_adv_by_std_in_grpo").get<bool>()));
  if (fn == "rloo")
    return adv(compute_rloo_outcome_advantage(in("token_level_rewards"),
                                              in("response_mask"), in("index")));
  if (fn == "reinforce_pp")
    return adv(compute_reinforce_plus_plus_outcome_advantage(
        in("token_level_rewards"), in("response_mask"), P.at("gamma").get<double>()));
  if (fn == "reinforce_pp_baseline")
    return adv(compute_reinforce_plus_plus_baseline_outcome_advantage(
        in("token_level_rewards"), in("response_mask"), in("index")));
  if (fn == "remax")
    return adv(compute_remax_outcome_advantage(in("token_level_rewards"),
                                               in("reward_baselines"), in("response_mask")));
  if (fn == "policy_loss" && P.contains("policy_loss")) {
    // GSPO and CISPO, and the gradient of the loss in the log-probs.
    PolicyLossConfig cfg;
    cfg.kind = parse_policy_loss(P.at("policy_loss").get<std::string>());
    cfg.clip_ratio = P.at("clip_ratio").get<double>();
    cfg.clip_ratio_low = optParam(P, "clip_ratio_low");
    cfg.clip_ratio_high = optParam(P, "clip_ratio_high");
    cfg.loss_agg_mode = parse_loss_agg_mode(P.at("mode").get<std::string>());
    cfg.agg = aggOptions(P);
    std::optional<at::Tensor> w;
    if (I.contains("rollout_is_weights"))
      w = in("rollout_is_weights");
    at::Tensor lp = in("log_prob").clone().requires_grad_(true);
    PolicyLossOutput o = compute_policy_objective(in("old_log_prob"), lp, in("advantages"),
                                                  in("response_mask"), cfg, w);
    o.pg_loss.backward();
    at::Tensor grad = lp.grad();
    return {{"pg_loss", o.pg_loss.detach()},
            {"pg_clipfrac", o.pg_clipfrac},
            {"ppo_kl", o.ppo_kl.detach()},
            {"pg_clipfrac_lower", o.pg_clipfrac_lower},
            {"pg_losses", o.pg_losses.detach()},
            {"grad_log_prob", grad}};
  }
  if (fn == "overlong_penalty") {
    at::Tensor pen;
    at::Tensor out = overlong_penalty(in("scores"), in("response_mask"),
                                      P.at("max_len").get<int64_t>(),
                                      P.at("buffer").get<int64_t>(),
                                      P.at("factor").get<double>(), &pen);
    return {{"scores", out}, {"penalty", pen}};
  }
  if (fn == "policy_loss") {
    PolicyLossConfig cfg;
    cfg.clip_ratio = P.at("clip_ratio").get<double>();
    cfg.clip_ratio_low = optParam(P, "clip_ratio_low");
    cfg.clip_ratio_high = optParam(P, "clip_ratio_high");
    cfg.clip_ratio_c = P.at("clip_ratio_c").get<double>();
    cfg.loss_agg_mode = parse_loss_agg_mode(P.at("mode").get<std::string>());
    cfg.agg = aggOptions(P);
    std::optional<at::Tensor> w;
    if (I.contains("rollout_is_weights"))
      w = in("rollout_is_weights");
    PolicyLossOutput o = compute_policy_loss(in("old_log_prob"), in("log_prob"),
                                             in("advantages"), in("response_mask"), cfg, w);
    return {{"pg_loss", o.pg_loss},
            {"pg_clipfrac", o.pg_clipfrac},
            {"ppo_kl", o.ppo_kl},
            {"pg_clipfrac_lower", o.pg_clipfrac_lower},
            {"pg_losses", o.pg_losses}};
  }
  if (fn == "rollout_correction") {
    RolloutCorrectionConfig cfg;
    cfg.level = P.at("level").is_null()
                    ? CorrectionLevel::None
                    : parse_correction_level(P.at("level").get<std::string>());
    cfg.threshold = optParam(P, "threshold");
    if (!P.at("rs").is_null())
      cfg.rejection = hflow::rollout::parseRejectionOptions(
          P.at("rs").get<std::string>(), P.at("rs_threshold").get<std::string>());
    RolloutCorrection o = compute_rollout_correction(in("old_log_prob"), in("rollout_log_prob"),
                                                     in("response_mask"), cfg);
    // The figures in the values' dtype, as the reference compares them.
    auto scalar = [&](double v) { return at::scalar_tensor(v, o.mask.scalar_type()); };
    Outputs out = {{"mask", o.mask},
                   {"tokens", scalar(o.tokens)},
                   {"rejected", scalar(o.rejected)},
                   {"seq_rejected", scalar(o.seqRejected)}};
    if (o.weights.defined()) {
      out["weights"] = o.weights;
      out["weight_sum"] = scalar(o.weightSum);
      out["weight_max"] = scalar(o.weightMax);
      out["high"] = scalar(o.high);
    }
    return out;
  }
  if (fn == "value_loss") {
    ValueLossOutput o = compute_value_loss(
        in("vpreds"), in("returns"), in("values"), in("response_mask"),
        P.at("cliprange_value").get<double>(),
        parse_loss_agg_mode(P.at("mode").get<std::string>()), aggOptions(P));
    return {{"vf_loss", o.vf_loss}, {"vf_clipfrac", o.vf_clipfrac}};
  }
  if (fn == "kl_penalty")
    return {{"out", kl_penalty(in("log_prob"), in("ref_log_prob"),
                               P.at("mode").get<std::string>())}};
  if (fn == "kl_loss")
    return {{"out", compute_kl_loss(in("log_prob"), in("ref_log_prob"), in("response_mask"),
                                    parse_kl_penalty(P.at("mode").get<std::string>()),
                                    parse_loss_agg_mode(P.at("agg_mode").get<std::string>()))}};
  if (fn == "compute_rewards")
    return {{"out", compute_rewards(in("token_level_scores"), in("old_log_prob"),
                                    in("ref_log_prob"), P.at("kl_ratio").get<double>())}};
  if (fn == "apply_kl_penalty") {
    KLRewardOutput o = apply_kl_penalty(in("token_level_scores"), in("old_log_prob"),
                                        in("ref_log_prob"), in("response_mask"),
                                        P.at("beta").get<double>(),
                                        parse_kl_penalty(P.at("mode").get<std::string>()));
    return {{"token_level_rewards", o.token_level_rewards},
            {"kld", o.kld},
            {"current_kl", at::scalar_tensor(o.current_kl, at::kDouble)}};
  }
  if (fn == "adaptive_kl") {
    AdaptiveKLController ctl(P.at("init_kl_coef").get<double>(),
                             P.at("target_kl").get<double>(), P.at("horizon").get<double>());
    std::vector<double> cur = I.at("current_kl").at("data").get<std::vector<double>>();
    std::vector<int64_t> n = I.at("n_steps").at("data").get<std::vector<int64_t>>();
    std::vector<double> vals;
    for (size_t i = 0; i < cur.size(); ++i) {
      ctl.update(cur[i], n[i]);
      vals.push_back(ctl.value);
    }
    return {{"values", at::tensor(vals, at::dtype(at::kDouble))}};
  }
  if (fn == "entropy_loss")
    return {{"out", compute_entropy_loss(in("logits"), in("response_mask"),
                                         parse_loss_agg_mode(P.at("mode").get<std::string>()))}};
  throw std::runtime_error("RLTest: no runner for fn '" + fn + "'");
}

class Reference_ : public testing::TestWithParam<RefParam> {};

TEST_P(Reference_, MatchesPythonReference) {
  const Reference &ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const RefParam &p = GetParam();
  const json &c = *ref.byName.at(p.name);
  const bool f32 = p.variant == Variant::F32;
  const double tol = f32 ? 5e-6 : 1e-10;
  const at::ScalarType dt = f32 ? at::kFloat : at::kDouble;

  Outputs got = run(c, p.variant);
  const json &want = c.at("outputs");
  double worst = 0; // max over outputs of |got - want| / max(1, |want|)
  ASSERT_EQ(got.size(), want.size()) << "outputs of " << p.name;
  for (const auto &[key, spec] : want.items()) {
    ASSERT_TRUE(got.count(key)) << p.name << ": no output '" << key << "'";
    at::Tensor g = got.at(key);
    std::vector<int64_t> shape = spec.at("shape").get<std::vector<int64_t>>();
    ASSERT_EQ(g.sizes().vec(), shape) << p.name << "." << key << ": shape";
    // Results carry the input dtype (the controller's double is the exception).
    if (c.at("fn") != "adaptive_kl" && key != "current_kl")
      EXPECT_EQ(g.scalar_type(), dt) << p.name << "." << key << ": dtype";
    std::vector<double> w = spec.at("data").get<std::vector<double>>();
    at::Tensor gd = g.detach().to(at::kDouble).contiguous().reshape({-1});
    ASSERT_EQ(gd.numel(), static_cast<int64_t>(w.size()));
    const double *gp = gd.data_ptr<double>();
    int bad = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      double err = std::abs(gp[i] - w[i]);
      worst = std::max(worst, err / std::max(1.0, std::abs(w[i])));
      if (!(err <= tol * std::max(1.0, std::abs(w[i])))) {
        if (++bad <= 5)
          ADD_FAILURE() << p.name << "." << key << "[" << i << "]: got " << gp[i]
                        << ", want " << w[i] << " (|diff| " << err << ", tol " << tol
                        << " * max(1, |want|))";
      }
    }
    EXPECT_EQ(bad, 0) << p.name << "." << key << ": " << bad << " of " << w.size()
                      << " elements out of tolerance";
  }
  std::printf("[ max err  ] %s: %.3e (tol %.0e)\n", p.name.c_str(), worst, tol);
}

INSTANTIATE_TEST_SUITE_P(RL, Reference_, testing::ValuesIn(referenceParams()), paramName);

TEST(RLReference, CoversEveryFunction) {
  const Reference &ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  std::map<std::string, int> fns;
  for (const json &c : ref.doc.at("cases"))
    fns[c.at("fn").get<std::string>()]++;
  for (const char *f : {"masked_sum", "masked_mean", "masked_var", "masked_whiten",
                        "clip_by_value", "entropy_from_logits", "agg_loss", "gae", "grpo",
                        "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax",
                        "policy_loss", "value_loss", "kl_penalty", "kl_loss",
                        "compute_rewards", "apply_kl_penalty", "adaptive_kl",
                        "entropy_loss", "overlong_penalty"})
    EXPECT_GT(fns[f], 0) << "no reference case for " << f;
}

// ---------------------------------------------------------------------------
// Hand-worked cases
// ---------------------------------------------------------------------------
at::Tensor d2(std::vector<std::vector<double>> rows) {
  std::vector<at::Tensor> r;
  for (auto &row : rows)
    r.push_back(at::tensor(row, at::dtype(at::kDouble)));
  return at::stack(r);
}

double at_(const at::Tensor &t, int64_t i, int64_t j) {
  return t.index({i, j}).item<double>();
}

// r = [1, 0, 2], V = [1, 2, 3], gamma = lam = 0.5, all tokens valid.
//  t=2: delta = 2 + 0.5*0 - 3 = -1;            A2 = -1
//  t=1: delta = 0 + 0.5*3 - 2 = -0.5;          A1 = -0.5 + 0.25*(-1)   = -0.75
//  t=0: delta = 1 + 0.5*2 - 1 = 1;             A0 = 1 + 0.25*(-0.75)   = 0.8125
// returns = A + V = [1.8125, 1.25, 2].
TEST(RLHand, GaeOneByThree) {
  at::Tensor r = d2({{1, 0, 2}}), V = d2({{1, 2, 3}}), m = d2({{1, 1, 1}});
  AdvantageOutput o = compute_gae_advantage_return(r, V, m, 0.5, 0.5);
  const double A[3] = {0.8125, -0.75, -1.0};
  const double R[3] = {1.8125, 1.25, 2.0};
  double mu = (A[0] + A[1] + A[2]) / (3 + 1e-8);
  double var = 0;
  for (double a : A)
    var += (a - mu) * (a - mu);
  var = var / (3 + 1e-8) * (3.0 / 2.0);
  for (int t = 0; t < 3; ++t) {
    EXPECT_DOUBLE_EQ(at_(o.returns, 0, t), R[t]) << "t=" << t;
    EXPECT_NEAR(at_(o.advantages, 0, t), (A[t] - mu) / std::sqrt(var + 1e-8), 1e-12);
  }
}

// Same, the middle token masked (an observation token):
//  t=2: A2 = -1, nextvalues = 3, lastgaelam = -1
//  t=1 (masked): nextvalues stays 3, lastgaelam stays -1 -> A1 = -1
//  t=0: delta = 1 + 0.5*3 - 1 = 1.5;  A0 = 1.5 + 0.25*(-1) = 1.25
// returns = [2.25, 1, 2]; advantages whitened over t = 0, 2 only, but written
// at t = 1 too.
TEST(RLHand, GaeMaskedMiddleToken) {
  at::Tensor r = d2({{1, 0, 2}}), V = d2({{1, 2, 3}}), m = d2({{1, 0, 1}});
  AdvantageOutput o = compute_gae_advantage_return(r, V, m, 0.5, 0.5);
  EXPECT_DOUBLE_EQ(at_(o.returns, 0, 0), 2.25);
  EXPECT_DOUBLE_EQ(at_(o.returns, 0, 1), 1.0);
  EXPECT_DOUBLE_EQ(at_(o.returns, 0, 2), 2.0);
  double mu = (1.25 - 1.0) / (2 + 1e-8);
  double var = ((1.25 - mu) * (1.25 - mu) + (-1 - mu) * (-1 - mu)) / (2 + 1e-8) * 2.0;
  double inv = 1 / std::sqrt(var + 1e-8);
  EXPECT_NEAR(at_(o.advantages, 0, 0), (1.25 - mu) * inv, 1e-12);
  EXPECT_NEAR(at_(o.advantages, 0, 1), (-1 - mu) * inv, 1e-12); // masked: not zero
  EXPECT_NEAR(at_(o.advantages, 0, 2), (-1 - mu) * inv, 1e-12);
}

// Scores (row sums) [1, 0, 2 | 5]: group {0,1,2} mean 1, std 1; row 3 alone.
TEST(RLHand, GrpoAndRloo) {
  at::Tensor r = d2({{1, 0}, {0, 0}, {2, 0}, {5, 0}});
  at::Tensor m = d2({{1, 1}, {1, 1}, {1, 0}, {1, 1}});
  at::Tensor idx = at::tensor(std::vector<int64_t>{4, 4, 4, 9}, at::dtype(at::kLong));
  AdvantageOutput g = compute_grpo_outcome_advantage(r, m, idx);
  EXPECT_DOUBLE_EQ(at_(g.advantages, 0, 0), 0.0);
  EXPECT_DOUBLE_EQ(at_(g.advantages, 1, 1), -1.0 / (1.0 + 1e-6));
  EXPECT_DOUBLE_EQ(at_(g.advantages, 2, 0), 1.0 / (1.0 + 1e-6));
  EXPECT_DOUBLE_EQ(at_(g.advantages, 2, 1), 0.0); // masked -> 0
  EXPECT_DOUBLE_EQ(at_(g.advantages, 3, 0), 5.0 / 1.0000009536743164); // float32(1)+1e-6
  EXPECT_TRUE(g.returns.equal(g.advantages));
  AdvantageOutput dr = compute_grpo_outcome_advantage(r, m, idx, 1e-6, false);
  EXPECT_DOUBLE_EQ(at_(dr.advantages, 1, 0), -1.0);
  EXPECT_DOUBLE_EQ(at_(dr.advantages, 3, 1), 5.0);
  // RLOO: s_i minus the mean of the others; a group of one keeps s_i.
  AdvantageOutput l = compute_rloo_outcome_advantage(r, m, idx);
  EXPECT_DOUBLE_EQ(at_(l.advantages, 0, 0), 0.0);
  EXPECT_DOUBLE_EQ(at_(l.advantages, 1, 0), -1.5);
  EXPECT_DOUBLE_EQ(at_(l.advantages, 2, 0), 1.5);
  EXPECT_DOUBLE_EQ(at_(l.advantages, 3, 0), 5.0);
}

// All-equal group: std = 0, a = 0 / epsilon = 0.
TEST(RLHand, GrpoAllEqualGroupIsZero) {
  at::Tensor r = d2({{0.5, 0.5}, {1, 0}, {0, 1}});
  at::Tensor m = at::ones({3, 2}, at::kDouble);
  at::Tensor idx = at::zeros({3}, at::kLong);
  AdvantageOutput g = compute_grpo_outcome_advantage(r, m, idx);
  EXPECT_EQ(g.advantages.abs().max().item<double>(), 0.0);
}

// REINFORCE++: r = [1, 2, 3, 4], m = [1, 1, 0, 1], gamma = 0.5:
//  t=3: G = 4 (run 4); t=2: G = 3 + 2 = 5, run reset to 0 (masked);
//  t=1: G = 2; t=0: G = 1 + 1 = 2.   ReMax returns: masked reverse cumsum.
TEST(RLHand, ReinforcePlusPlusAndRemax) {
  at::Tensor r = d2({{1, 2, 3, 4}, {1, 1, 1, 1}}), m = d2({{1, 1, 0, 1}, {1, 0, 0, 0}});
  AdvantageOutput o = compute_reinforce_plus_plus_outcome_advantage(r, m, 0.5);
  const double G[4] = {2, 2, 5, 4};
  for (int t = 0; t < 4; ++t)
    EXPECT_DOUBLE_EQ(at_(o.returns, 0, t), G[t]);
  EXPECT_DOUBLE_EQ(at_(o.advantages, 0, 2), 0.0); // times m
  at::Tensor b = at::tensor(std::vector<double>{2.0, 0.5}, at::dtype(at::kDouble));
  AdvantageOutput x = compute_remax_outcome_advantage(r, b, m);
  const double R0[4] = {7, 6, 4, 4}, A0[4] = {5, 4, 4, 2};
  for (int t = 0; t < 4; ++t) {
    EXPECT_DOUBLE_EQ(at_(x.returns, 0, t), R0[t]);
    EXPECT_DOUBLE_EQ(at_(x.advantages, 0, t), A0[t]);
  }
  EXPECT_DOUBLE_EQ(at_(x.advantages, 1, 0), 0.5);
  EXPECT_DOUBLE_EQ(at_(x.advantages, 1, 1), 0.0);
}

// Two tokens, eps = 0.2, c = 3:
//  token 0: A = 1,  d = 0.5: L1 = -e^0.5 = -1.6487, L2 = -1.2 -> C1 = -1.2 (clipped)
//  token 1: A = -1, d = 2:   L1 = e^2 = 7.389, L2 = 1.2 -> C1 = 7.389; L3 = 3 -> 3
// pg_losses = [-1.2, 3], token-mean 0.9; ppo_kl = -(0.5 + 2)/2.
TEST(RLHand, PolicyLossClipAndDualClip) {
  at::Tensor old = d2({{-1, -3}}), lp = d2({{-0.5, -1}}), A = d2({{1, -1}});
  at::Tensor m = d2({{1, 1}});
  PolicyLossOutput o = compute_policy_loss(old, lp, A, m);
  EXPECT_NEAR(at_(o.pg_losses, 0, 0), -1.2, 1e-15);
  EXPECT_DOUBLE_EQ(at_(o.pg_losses, 0, 1), 3.0);
  EXPECT_NEAR(o.pg_loss.item<double>(), 0.9, 1e-15);
  EXPECT_DOUBLE_EQ(o.pg_clipfrac.item<double>(), 1.0 / (2 + 1e-8));
  EXPECT_DOUBLE_EQ(o.pg_clipfrac_lower.item<double>(), 1.0 / (2 + 1e-8));
  EXPECT_DOUBLE_EQ(o.ppo_kl.item<double>(), -2.5 / (2 + 1e-8));
}

// Gradients w.r.t. log_prob (token-mean over 3 tokens): inside the clip range
// d/dlp (-A rho) / 3 = -A rho / 3; a clipped token and a dual-clipped token
// have zero gradient.
TEST(RLHand, PolicyLossGradient) {
  at::Tensor old = d2({{-1, -1, -3}});
  at::Tensor lp = d2({{-0.95, -0.5, -1}}).requires_grad_(true);
  at::Tensor A = d2({{2, 1, -1}}), m = d2({{1, 1, 1}});
  PolicyLossOutput o = compute_policy_loss(old, lp, A, m);
  o.pg_loss.backward();
  at::Tensor g = lp.grad();
  EXPECT_NEAR(at_(g, 0, 0), -2 * std::exp(0.05) / 3, 1e-14);
  EXPECT_EQ(at_(g, 0, 1), 0.0);
  EXPECT_EQ(at_(g, 0, 2), 0.0);
}

// X = [[1,2,3],[4,5,6]], M = [[1,1,0],[0,0,0]] (the second row is empty).
TEST(RLHand, AggLossModes) {
  at::Tensor X = d2({{1, 2, 3}, {4, 5, 6}}), M = d2({{1, 1, 0}, {0, 0, 0}});
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::TokenMean).item<double>(), 1.5);
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::SeqMeanTokenSum).item<double>(), 3.0);
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::SeqMeanTokenMean).item<double>(),
                   3.0 / (2 + 1e-8));
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::SeqMeanTokenSumNorm).item<double>(), 1.0);
  AggOptions o;
  o.dp_size = 2;
  o.global_batch_size = 4;
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::SeqMeanTokenSum, o).item<double>(), 1.5);
  EXPECT_DOUBLE_EQ(agg_loss(X, M, LossAggMode::SeqMeanTokenSumNorm, o).item<double>(), 1.0)
      << "dp_size does not apply to seq-mean-token-sum-norm";
  // No valid token: token-mean divides 0 by 0 (no 1e-8), as verl does.
  EXPECT_TRUE(std::isnan(agg_loss(X, at::zeros_like(M), "token-mean").item<double>()));
  // NaN at a masked position of a row with valid tokens: masked_sum hides it
  // (token-mean), the seq modes' plain X*M does not. In a row with no valid
  // token it is hidden again, by the masked_sum over sequences.
  at::Tensor Xn = X.clone();
  Xn.index_put_({0, 2}, std::nan(""));
  EXPECT_DOUBLE_EQ(agg_loss(Xn, M, LossAggMode::TokenMean).item<double>(), 1.5);
  for (LossAggMode mode : {LossAggMode::SeqMeanTokenSum, LossAggMode::SeqMeanTokenMean,
                           LossAggMode::SeqMeanTokenSumNorm})
    EXPECT_TRUE(std::isnan(agg_loss(Xn, M, mode).item<double>())) << to_string(mode);
  at::Tensor Xe = X.clone();
  Xe.index_put_({1, 0}, std::nan(""));
  EXPECT_DOUBLE_EQ(agg_loss(Xe, M, LossAggMode::SeqMeanTokenSum).item<double>(), 3.0);
  EXPECT_TRUE(std::isnan(agg_loss(Xe, M, LossAggMode::SeqMeanTokenSumNorm).item<double>()));
}

TEST(RLHand, KLPenaltiesAndEntropy) {
  at::Tensor lp = d2({{-1, -2, -3}}), ref = d2({{-1, -1, -30}});
  at::Tensor k3 = kl_penalty(lp, ref, KLPenalty::K3);
  EXPECT_EQ(at_(k3, 0, 0), 0.0);
  EXPECT_NEAR(at_(k3, 0, 1), std::exp(1.0) - 2.0, 1e-15); // x = ref - lp = 1
  // x = -27 is clamped to -20; e^-20 + 20 - 1 = 19.000000002 is clamped to 10
  EXPECT_EQ(at_(k3, 0, 2), 10.0);
  EXPECT_DOUBLE_EQ(at_(kl_penalty(lp, ref, "mse"), 0, 1), 0.5);
  EXPECT_DOUBLE_EQ(at_(kl_penalty(lp, ref, "abs"), 0, 1), 1.0);
  EXPECT_DOUBLE_EQ(at_(kl_penalty(lp, ref, "k1"), 0, 1), -1.0);
  // uniform over 4 -> log 4; one-hot-ish -> ~0
  at::Tensor z = at::zeros({1, 2, 4}, at::kDouble);
  z.index_put_({0, 1, 0}, 1000.0);
  at::Tensor h = entropy_from_logits(z);
  EXPECT_NEAR(at_(h, 0, 0), std::log(4.0), 1e-15);
  EXPECT_NEAR(at_(h, 0, 1), 0.0, 1e-12);
  FixedKLController f(0.1);
  f.update(5.0, 100);
  EXPECT_EQ(f.value, 0.1);
  AdaptiveKLController a(0.1, 0.02, 10000);
  a.update(0.1, 1000); // error clipped to 0.2 -> * (1 + 0.2 * 0.1)
  EXPECT_DOUBLE_EQ(a.value, 0.1 * 1.02);
}

TEST(RLHand, OtherFloatingDtypes) {
  // bfloat16 runs and stays within its precision of float64. (float16 is not
  // tested: LibTorch 1.13 has no CPU kernel for clamp on Half.)
  at::Tensor old = d2({{-1, -3, -2, -0.5}}), lp = d2({{-0.5, -1, -2.1, -0.45}});
  at::Tensor A = d2({{1, -1, 0.5, -0.3}}), m = d2({{1, 1, 1, 0}});
  double want = compute_policy_loss(old, lp, A, m).pg_loss.item<double>();
  for (at::ScalarType t : {at::kBFloat16}) {
    PolicyLossOutput o = compute_policy_loss(old.to(t), lp.to(t), A.to(t), m.to(at::kBool));
    EXPECT_EQ(o.pg_loss.scalar_type(), t);
    EXPECT_NEAR(o.pg_loss.item<double>(), want, 0.05) << c10::toString(t);
  }
}

// ---------------------------------------------------------------------------
// Error paths: std::invalid_argument with a message naming function and arg
// ---------------------------------------------------------------------------
template <typename F>
std::string messageOf(F &&f) {
  try {
    f();
  } catch (const std::invalid_argument &e) {
    return e.what();
  } catch (const std::exception &e) {
    return std::string("<wrong exception type> ") + e.what();
  }
  return "<no exception>";
}

#define EXPECT_THROWS_WITH(stmt, ...)                                          \
  do {                                                                         \
    std::string msg_ = messageOf([&] { stmt; });                               \
    for (const char *part : {__VA_ARGS__})                                     \
      EXPECT_NE(msg_.find(part), std::string::npos)                            \
          << "message '" << msg_ << "' lacks '" << part << "'";               \
  } while (0)

TEST(RLErrors, ShapesDtypesAndVerlRaises) {
  at::Tensor x = at::randn({2, 3}, at::kDouble), m = at::ones({2, 3}, at::kDouble);
  at::Tensor idx = at::zeros({2}, at::kLong);
  EXPECT_THROWS_WITH(masked_mean(x, at::ones({2, 4}, at::kDouble)),
                     "hflow::rl::masked_mean", "`mask` has shape [2, 4]",
                     "`values` has shape [2, 3]");
  EXPECT_THROWS_WITH(masked_mean(x, m.to(at::kFloat)), "masked_mean", "`mask` must be bool",
                     "Float");
  EXPECT_THROWS_WITH(masked_sum(x.to(at::kLong), m), "masked_sum",
                     "`values` must have a floating dtype");
  EXPECT_THROWS_WITH(masked_sum(x, m, 2), "masked_sum", "axis 2 is out of range");
  EXPECT_THROWS_WITH(masked_var(x, at::zeros({2, 3}, at::kDouble)), "masked_var",
                     "sum(mask) == 0");
  at::Tensor one = at::zeros({2, 3}, at::kDouble);
  one.index_put_({0, 0}, 1.0);
  EXPECT_THROWS_WITH(masked_var(x, one), "masked_var", "sum(mask) == 1");
  EXPECT_NO_THROW(masked_var(x, one, /*unbiased=*/false));
  EXPECT_THROWS_WITH(compute_gae_advantage_return(x, x, one, 1, 1), "masked_var");
  EXPECT_THROWS_WITH(compute_gae_advantage_return(x, at::randn({2, 4}, at::kDouble), m, 1, 1),
                     "compute_gae_advantage_return", "`values` has shape [2, 4]");
  EXPECT_THROWS_WITH(compute_gae_advantage_return(x, x.to(at::kFloat), m, 1, 1),
                     "`values` has dtype Float", "`token_level_rewards` has dtype Double");
  EXPECT_THROWS_WITH(compute_gae_advantage_return(x[0], x[0], m[0], 1, 1),
                     "`token_level_rewards` must be 2-D");
  EXPECT_THROWS_WITH(compute_grpo_outcome_advantage(x, m, idx.to(at::kInt)),
                     "compute_grpo_outcome_advantage", "`index` must be int64");
  EXPECT_THROWS_WITH(compute_rloo_outcome_advantage(x, m, at::zeros({3}, at::kLong)),
                     "compute_rloo_outcome_advantage", "`index` must have shape [2]");
  EXPECT_THROWS_WITH(compute_reinforce_plus_plus_baseline_outcome_advantage(
                         x, m, at::zeros({2, 1}, at::kLong)),
                     "`index` must have shape [2]");
  EXPECT_THROWS_WITH(compute_remax_outcome_advantage(x, at::zeros({3}, at::kDouble), m),
                     "compute_remax_outcome_advantage", "`reward_baselines` must have shape [2]");
  PolicyLossConfig bad;
  bad.clip_ratio_c = 1.0;
  EXPECT_THROWS_WITH(compute_policy_loss(x, x, x, m, bad), "compute_policy_loss",
                     "clip_ratio_c", "must be > 1.0");
  EXPECT_THROWS_WITH(compute_policy_loss(x, x, at::randn({3, 2}, at::kDouble), m),
                     "`advantages` has shape [3, 2]");
  EXPECT_THROWS_WITH(compute_value_loss(x, x, x, at::ones({2}, at::kDouble), 0.2),
                     "compute_value_loss", "`response_mask` has shape [2]");
  EXPECT_THROWS_WITH(parse_kl_penalty("k3+"), "parse_kl_penalty", "'k3+'",
                     "NotImplementedError");
  EXPECT_THROWS_WITH(parse_kl_penalty("full"), "'full'", "NotImplementedError");
  EXPECT_THROWS_WITH(parse_kl_penalty("kl2"), "unknown kl penalty 'kl2'");
  EXPECT_THROWS_WITH(kl_penalty(x, x.to(at::kFloat), KLPenalty::K1), "kl_penalty",
                     "`ref_log_prob` has dtype Float");
  EXPECT_THROWS_WITH(parse_loss_agg_mode("token-sum"), "invalid loss_agg_mode 'token-sum'");
  EXPECT_THROWS_WITH(agg_loss(x, m, "seq-mean"), "invalid loss_agg_mode");
  AggOptions dp0;
  dp0.dp_size = 0;
  EXPECT_THROWS_WITH(agg_loss(x, m, LossAggMode::TokenMean, dp0), "agg_loss", "dp_size");
  EXPECT_THROWS_WITH(compute_entropy_loss(at::randn({2, 4, 5}, at::kDouble), m),
                     "compute_entropy_loss", "logits [2, 4, 5]", "response_mask [2, 3]");
  EXPECT_THROWS_WITH(AdaptiveKLController(0.1, 0.1, 0), "AdaptiveKLController",
                     "horizon must be larger than 0");
  EXPECT_THROWS_WITH(apply_kl_penalty(x, x, x, at::ones({2, 3}, at::kFloat), 0.1),
                     "apply_kl_penalty", "`response_mask` must be bool");
}

} // namespace
