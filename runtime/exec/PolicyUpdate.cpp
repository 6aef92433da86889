//===- PolicyUpdate.cpp - update: the actor's and the critic's PPO step ----===//
//
// An update trains on this replica's rows of the rollout: epochs of
// minibatches (one optimizer step each) of passes whose gradients
// accumulate, each loss weighted by its share of the minibatch as verl
// does. UpdateLoss is one pass's loss (the actor's clipped policy loss
// with its KL and entropy terms, or the critic's clipped value loss);
// MethodRunner::runUpdate cuts the rows into passes and runs them on the role's
// model form.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/MethodRunner.h"
#include "runtime/exec/LengthBuckets.h"
#include "runtime/models/Device.h"
#include "runtime/models/Packing.h"

#include "runtime/rl/Aggregate.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Losses.h"
#include "runtime/rl/RolloutCorrection.h"
#include "runtime/models/Safetensors.h"
#include "runtime/schema/RolloutRejection.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace hflow::exec {

using namespace hflow::plan;

namespace {

/// How a pass's terms add up to its micro-batch's: `share` the
/// micro-batch's rows over the minibatch's (verl's weighting); a length
/// bucket of a micro-batch also weighs its terms by what they average
/// over: `tok` its response tokens over the micro-batch's (token means:
/// clip fractions, ppo_kl, and every loss under token-mean), `row` its
/// rows with a token over the micro-batch's (the other aggregations'
/// sequence means, and the metrics' denominators); seq-mean-token-sum-norm adds its
/// sequences' sums (1). A whole micro-batch: all 1.
struct LossWeight {
  double share = 1, tok = 1, row = 1;
};

/// One pass's loss, weighted by its share of the minibatch, from the
/// hidden states at its response positions; the leader's metrics.
class UpdateLoss {
public:
  /// The call's input of a kind (the nth of it), or null.
  using InputFn = std::function<Val *(BatchKind, int)>;
  /// Stops the run on a loss that is not finite.
  using CheckFn = std::function<void(const char *, double)>;

  /// `correction`: the rollout correction's weights ("w", absent without
  /// importance weights) and response mask ("m") over the rollout's rows,
  /// or null.
  UpdateLoss(const plan::CallArgs &a, const Role &ro, RoleRt &rr, Val &rollout, int64_t R,
             double temperature, InputFn input, CheckFn check, MetricSums *metrics,
             Val *correction)
      : a_(a), ro_(ro), rr_(rr), rollout_(rollout), R_(R), temp_(temperature),
        input_(std::move(input)), check_(std::move(check)), m_(metrics),
        mode_(rl::parse_loss_agg_mode(str(a.loss_agg(), "token-mean"))),
        policyLoss_(rl::parse_policy_loss(str(a.policy_loss(), "vanilla"))),
        correction_(correction) {
    // GSPO averages per sequence whatever the update's mode (as verl): the
    // plan sets the update's loss_agg to seq-mean-token-mean with it, so
    // every term weighs its pass the same way.
    if (policyLoss_ == rl::PolicyLossKind::Gspo && mode_ != rl::LossAggMode::SeqMeanTokenMean)
      throw RunError("policy_loss gspo aggregates seq-mean-token-mean, but the update's "
                     "loss_agg is " + str(a.loss_agg(), "token-mean"));
  }

  at::Tensor operator()(int64_t mlo, int64_t mhi, const at::Tensor &h, const LossWeight &w);
  /// The actor's weighted losses, summed over every pass of the call.
  double lastLoss = 0;

private:
  at::Tensor critic(int64_t mlo, int64_t cnt, const at::Tensor &h, at::Tensor mask,
                    double share, double tokShare, double rowShare);
  at::Tensor actor(int64_t mlo, int64_t cnt, const at::Tensor &h, at::Tensor mask,
                   double share, double tokShare, double rowShare);
  /// Per-token results of r < R columns back to R (zeros, masked out).
  at::Tensor widen(const at::Tensor &x, int64_t r) const {
    return r < R_ ? at::constant_pad_nd(x, {0, R_ - r}) : x;
  }

  const plan::CallArgs &a_;
  const Role &ro_;
  RoleRt &rr_;
  Val &rollout_;
  int64_t R_;
  double temp_;
  InputFn input_;
  CheckFn check_;
  MetricSums *m_; // the leader's; null elsewhere
  rl::LossAggMode mode_;
  rl::PolicyLossKind policyLoss_;
  Val *correction_;
};

at::Tensor UpdateLoss::operator()(int64_t mlo, int64_t mhi, const at::Tensor &h,
                                  const LossWeight &w) {
  const int64_t cnt = mhi - mlo;
  const double modeWeight = mode_ == rl::LossAggMode::TokenMean            ? w.tok
                            : mode_ == rl::LossAggMode::SeqMeanTokenSumNorm ? 1.0
                                                                            : w.row;
  const double share = w.share * modeWeight, tokShare = w.share * w.tok,
               rowShare = w.share * w.row;
  // The rollout correction's mask (verl's modified response_mask) in
  // place of the rollout's, for every term of the actor's loss.
  at::Tensor mask = correction_ && ro_.kind() == RoleKind::Actor
                        ? (*correction_)["m"].narrow(0, mlo, cnt)
                        : rollout_["rmask"].narrow(0, mlo, cnt);
  // h holds the first r <= R response columns (the ones some row of the
  // pass has a token in): the heads run on those, and their per-token
  // results are widened back to R with zeros (masked out), so every loss
  // reads R columns as the padded computation does.
  if (ro_.kind() == RoleKind::Critic)
    return critic(mlo, cnt, h, mask, share, tokShare, rowShare);
  return actor(mlo, cnt, h, mask, share, tokShare, rowShare);
}

at::Tensor UpdateLoss::critic(int64_t mlo, int64_t cnt, const at::Tensor &h, at::Tensor mask,
                              double share, double tokShare, double rowShare) {
  Val *vals = input_(BatchKind::Values, 0);
  Val *rets = input_(BatchKind::Returns, 0);
  if (!rets)
    throw RunError("a critic update needs the returns (e.g. adv.returns)");
  at::Tensor vpred = widen(scalarHead(h, rr_.head), h.size(1));
  if (mask.sum().item<double>() == 0) // no trained token: as the actor's
    return vpred.sum() * 0.0;
  // Without the rollout's values the clipped loss has nothing to clip
  // against: it is the plain squared error.
  at::Tensor oldv = vals ? vals->x().narrow(0, mlo, cnt) : vpred.detach();
  auto vl = rl::compute_value_loss(vpred, rets->x().narrow(0, mlo, cnt), oldv, mask,
                                   a_.clip_value().value_or(0.5), mode_);
  check_("value loss", vl.vf_loss.item<double>());
  if (m_) { // weighted by the micro-batch's share of the minibatch
    m_->vfLoss += vl.vf_loss.item<double>() * share;
    m_->vfClip += vl.vf_clipfrac.item<double>() * tokShare;
    m_->criticN += rowShare;
  }
  return vl.vf_loss * share;
}

at::Tensor UpdateLoss::actor(int64_t mlo, int64_t cnt, const at::Tensor &h, at::Tensor mask,
                             double share, double tokShare, double rowShare) {
  const int64_t r = h.size(1);
  at::Tensor toks = rollout_["rtoks"].narrow(0, mlo, cnt).narrow(1, 0, r);
  // Advantages, else the scores themselves (REINFORCE on the raw reward);
  // the old log-probs, else the ones generation reported (equal to a
  // recomputation on the same weights).
  Val *adv = input_(BatchKind::Advantages, 0);
  if (!adv)
    adv = input_(BatchKind::Scores, 0);
  Val *old = input_(BatchKind::LogProbs, 0);
  Val *ref = input_(BatchKind::LogProbs, 1);
  if (!adv)
    throw RunError("an actor update needs advantages or scores");
  at::Tensor oldLp = old ? old->x().narrow(0, mlo, cnt) : rollout_["lp"].narrow(0, mlo, cnt);
  // Packed passes: the logits only at the tokens the loss reads.
  const models::HeadPositions at(rr_.lm->packsRows() && models::packedPassesRequested(),
                                 mask.narrow(1, 0, r));
  at::Tensor logits = rr_.lm->localLogits(at.in(h));
  at::Tensor lp = widen(at.out(rr_.lm->tokenLogprobs(logits, at.in(toks), temp_)), r);
  // No token of this pass is trained (rejection sampling dropped them all,
  // or every episode's environment failed): nothing to learn from it (a
  // loss of 0 that still runs the backward every rank of a lockstep group
  // runs; its figures count nowhere).
  if (mask.sum().item<double>() == 0)
    return lp.sum() * 0.0;
  rl::PolicyLossConfig pc;
  pc.kind = policyLoss_;
  pc.clip_ratio = a_.clip().value_or(0.2);
  if (a_.clip_low().has_value())
    pc.clip_ratio_low = *a_.clip_low();
  if (a_.clip_high().has_value())
    pc.clip_ratio_high = *a_.clip_high();
  pc.clip_ratio_c = a_.clip_ratio_c().value_or(3.0);
  pc.loss_agg_mode = mode_;
  std::optional<at::Tensor> isWeights;
  if (correction_ && correction_->f.count("w"))
    isWeights = (*correction_)["w"].narrow(0, mlo, cnt);
  auto pl = rl::compute_policy_objective(oldLp, lp, adv->x().narrow(0, mlo, cnt), mask, pc,
                                         isWeights);
  at::Tensor loss = pl.pg_loss;
  double klv = 0;
  if (ref) {
    at::Tensor kl = rl::compute_kl_loss(lp, ref->x().narrow(0, mlo, cnt), mask,
                                        rl::parse_kl_penalty(str(a_.kl(), "low_var_kl")),
                                        mode_);
    loss = loss + kl * a_.kl_coef().value_or(0.001);
    klv = kl.item<double>();
  }
  double entCoef = a_.entropy_coef().value_or(0.0);
  at::Tensor ent;
  {
    at::Tensor e = widen(at.out(entCoef > 0 ? rr_.lm->tokenEntropy(logits, temp_)
                                            : rr_.lm->tokenEntropy(logits.detach(), temp_)),
                         r);
    ent = rl::agg_loss(e, mask, mode_);
  }
  if (entCoef > 0)
    loss = loss - ent * entCoef;
  check_("policy loss", loss.item<double>());
  lastLoss += loss.item<double>() * share;
  if (m_) { // weighted by the micro-batch's share of the minibatch
    m_->pgLoss += pl.pg_loss.item<double>() * share;
    m_->pgClip += pl.pg_clipfrac.item<double>() * tokShare;
    m_->ppoKl += pl.ppo_kl.item<double>() * tokShare;
    m_->klLoss += klv * share;
    m_->entropy += ent.item<double>() * share;
    m_->actorN += rowShare;
  }
  return loss * share;
}

/// Every pass of a minibatch of `mbRows` rows (a bucket, or a whole
/// micro-batch of `batches`; `runs[k]`: micro-batch k's passes) with its
/// weights.
void weighPasses(const at::Tensor &rmask, const std::vector<std::pair<int64_t, int64_t>> &batches,
                 const std::vector<std::vector<std::pair<int64_t, int64_t>>> &runs,
                 int64_t mbRows, std::vector<std::pair<int64_t, int64_t>> &passes,
                 std::vector<LossWeight> &weights) {
  for (size_t k = 0; k < batches.size(); ++k) {
    const auto [mlo, mhi] = batches[k];
    const double share = double(mhi - mlo) / double(mbRows);
    const double toks =
        runs[k].size() > 1 ? rmask.narrow(0, mlo, mhi - mlo).sum().item<double>() : 0;
    // The sequence means count the rows with a token left (rejection
    // sampling may mask whole rows), as verl's over the whole micro-batch.
    auto seqs = [&](int64_t a, int64_t b) {
      return (rmask.narrow(0, a, b - a).sum(1) > 0).sum().item<double>();
    };
    const double rows = runs[k].size() > 1 ? seqs(mlo, mhi) : 0;
    for (auto [u, e] : runs[k]) {
      LossWeight w{share};
      if (runs[k].size() > 1) {
        w.row = rows > 0 ? seqs(u, e) / rows : double(e - u) / double(mhi - mlo);
        w.tok = toks > 0 ? rmask.narrow(0, u, e - u).sum().item<double>() / toks
                         : w.row;
      }
      passes.push_back({u, e});
      weights.push_back(w);
    }
  }
}

/// The staleness of the tokens of rows [lo, lo + n) that the actor's
/// optimizer step from version `w` trains on: each token's w less the
/// version that sampled it. A token from newer weights, or staler than the
/// plan's bound, stops the run; the leader adds the figures to `m`.
void recordStaleness(Val &rollout, int64_t lo, int64_t n, int64_t w, int bound,
                     const std::string &where, MetricSums *m) {
  // On the host: the figures below read back with no device sync each.
  at::Tensor v = rollout["version"].narrow(0, lo, n).to(at::kCPU, at::kLong);
  at::Tensor tok = (rollout["rmask"].narrow(0, lo, n).cpu() > 0).logical_and(v >= 0);
  const int64_t count = tok.sum().item<int64_t>();
  if (count == 0)
    return;
  at::Tensor st = (w - v).masked_select(tok);
  const int64_t lowest = st.min().item<int64_t>(), highest = st.max().item<int64_t>();
  if (lowest < 0)
    throw RunError(where + ": a token sampled by policy version " +
                   std::to_string(w - lowest) + " trains the actor at version " +
                   std::to_string(w) + ", which is older: the rollout's versions are wrong");
  if (bound >= 0 && highest > bound)
    throw RunError(where + ": a token sampled by policy version " +
                   std::to_string(w - highest) + " trains the actor at version " +
                   std::to_string(w) + ", " + std::to_string(highest) +
                   " versions later: above the plan's staleness bound " + std::to_string(bound));
  if (m) {
    m->stalSum += st.sum().item<double>();
    m->stalN += (double)count;
    m->staleN += (st > 0).sum().item<double>();
    m->stalMax = std::max(m->stalMax, (double)highest);
  }
}

} // namespace

/// An actor update's rollout correction (rollout_is, rollout_rs) over rows
/// `rows` of the rollout, from its old log-probs (the proximal policy's)
/// and the rollout's own; nothing when the call sets none. The leader adds
/// its figures to the metrics; --dump-values writes its inputs and results.
std::optional<Val> MethodRunner::rolloutCorrection(MethodCall &c, Val &rollout, Span rows) {
  const plan::CallArgs &a = c.a;
  rl::RolloutCorrectionConfig cfg;
  try {
    cfg.level = rl::parse_correction_level(str(a.rollout_is(), "none"));
    if (a.rollout_rs())
      cfg.rejection = rollout::parseRejectionOptions(str(a.rollout_rs()),
                                                     str(a.rollout_rs_threshold()));
  } catch (const std::invalid_argument &e) { // the plan loader refuses such a plan
    throw RunError(describe(c.s) + ": " + e.what());
  }
  if (a.rollout_is_threshold())
    cfg.threshold = *a.rollout_is_threshold();
  else if (cfg.level == rl::CorrectionLevel::Decoupled)
    cfg.threshold.reset(); // AReaL's cap: none unless set
  if (cfg.level == rl::CorrectionLevel::None && cfg.rejection.empty())
    return std::nullopt;
  Val *old = inputOfKind(c, BatchKind::LogProbs, 0);
  if (!old) // hflowc refuses such a program
    throw RunError(describe(c.s) + ": the rollout correction needs the update's old log-probs");
  const int64_t lo = rows.lo, b = rows.hi - rows.lo;
  at::Tensor oldLp = old->x().narrow(0, lo, b), behav = rollout["lp"].narrow(0, lo, b),
             rmask = rollout["rmask"].narrow(0, lo, b);
  rl::RolloutCorrection rc;
  try {
    rc = rl::compute_rollout_correction(oldLp, behav, rmask, cfg);
  } catch (const std::invalid_argument &e) {
    throw RunError(describe(c.s) + ": " + e.what());
  }
  Val v;
  v.kind = BatchKind::LogProbs;
  v.rows = rollout.rows;
  v.f["m"] = rollout["rmask"].clone();
  v.f["m"].narrow(0, lo, b).copy_(rc.mask);
  if (rc.weights.defined()) {
    v.f["w"] = at::zeros_like(rollout["rmask"]);
    v.f["w"].narrow(0, lo, b).copy_(rc.weights);
  }
  if (c.leader) {
    metrics_->corrN += rc.tokens;
    metrics_->corrWSum += rc.weightSum;
    metrics_->corrHigh += rc.high;
    metrics_->corrRejected += rc.rejected;
    metrics_->corrWMax = std::max(metrics_->corrWMax, rc.weightMax);
    metrics_->corrWeighs = rc.weights.defined() ? 1 : 0;
  }
  if (!o_.dumpValues.empty() && c.leader) {
    std::vector<std::pair<std::string, at::Tensor>> ts = {
        {"old_log_prob", oldLp.contiguous()},
        {"rollout_log_prob", behav.contiguous()},
        {"response_mask", rmask.contiguous()},
        {"modified_response_mask", rc.mask.contiguous()},
        {"row", rollout["ids"].narrow(0, lo, b).contiguous()}};
    if (rc.weights.defined())
      ts.push_back({"rollout_is_weights", rc.weights.contiguous()});
    const std::string dir =
        o_.dumpValues + "/" + c.ph.name + "-" + std::to_string(c.it + 1);
    char threshold[40] = "";
    if (a.rollout_is_threshold())
      std::snprintf(threshold, sizeof threshold, "%.17g", *a.rollout_is_threshold());
    try {
      std::filesystem::create_directories(dir);
      models::writeSafetensors(dir + "/step-" + std::to_string(c.s) +
                                   "-update-correction-rows" + std::to_string(lo) +
                                   ".safetensors",
                               ts, {{"step", describe(c.s)},
                                    {"rollout_is", str(a.rollout_is(), "none")},
                                    {"rollout_is_threshold", threshold},
                                    {"rollout_rs", str(a.rollout_rs())},
                                    {"rollout_rs_threshold", str(a.rollout_rs_threshold())}});
    } catch (const std::exception &e) {
      throw RunError(std::string("--dump-values: ") + e.what());
    }
  }
  return v;
}

/// update: PPO epochs over minibatches (one optimizer step each) of the
/// actor's clipped policy loss with optional KL and entropy terms, or the
/// critic's clipped value loss.
void MethodRunner::runUpdate(MethodCall &c) {
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const plan::CallArgs &a = c.a;
  const int s = c.s;
  const int64_t P = ph.P, R = ph.R;
  Span rows;
  Val *rollout = &rolloutOf(c, rows);
  const int64_t lo = rows.lo, hi = rows.hi, b = hi - lo;
  const int64_t budget = a.max_batch_tokens().value_or(0);
  // Epochs x minibatches of this replica's rows (one optimizer step each)
  // x passes of `micro_batch` sequences whose gradients accumulate (each
  // loss weighted by its share of the minibatch, as verl does).
  const TrainingCut cut = TrainingCut::of(c, b);
  const int64_t epochs = cut.epochs, mbRows = cut.minibatch, micro = cut.micro;
  const double lrOver = a.lr().value_or(0);
  // The rollout correction: once over this replica's rows (it depends on
  // the old and the rollout's log-probs only, which the update leaves).
  std::optional<Val> correction;
  if (c.ro.kind() == RoleKind::Actor)
    correction = rolloutCorrection(c, *rollout, rows);
  UpdateLoss microLoss(
      a, c.ro, rr, *rollout, R, ph.rolloutTemp,
      [&](BatchKind k, int nth) { return inputOfKind(c, k, nth); },
      [&](const char *what, double v) { grads_.checkLoss(rr, what, v); },
      c.leader ? &*metrics_ : nullptr, correction ? &*correction : nullptr);
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t m0 = 0; m0 < b; m0 += mbRows) {
      // max_batch_tokens: micro-batches by a token budget instead (each
      // still weighted by its share of the minibatch's rows, as verl's
      // dynamic batch size does).
      const auto batches = rowBatches(*rollout, lo + m0, lo + m0 + mbRows, micro, budget,
                                      describe(s), budget > 0 ? rr.lm->lockstepGroup() : nullptr);
      // Length buckets (see forwardResponses): every value the update
      // reads, in the buckets' row order while the minibatch trains.
      std::optional<RowOrder> order;
      std::vector<std::vector<std::pair<int64_t, int64_t>>> runs;
      for (auto b_ : batches)
        runs.push_back({b_});
      if ((trimPasses() && lengthBuckets())) {
        Buckets bk = lengthBucketsOf(*rollout, lo + m0, lo + m0 + mbRows, batches);
        equalizeRuns(bk, rr.lm->lockstepGroup());
        if (bk.any) {
          std::vector<Val *> vals;
          for (int v : c.in)
            vals.push_back(&vals_.at(v));
          if (correction)
            vals.push_back(&*correction);
          order.emplace(std::move(vals), lo + m0, bk.perm);
          runs = std::move(bk.runs);
        }
      }
      PassMeter meter(rr);
      for (const auto &rs : runs)
        for (auto [u, e] : rs) {
          const auto [p, r] = trimPasses() ? realWidth(*rollout, u, e) : std::make_pair(P, R);
          // The heads run on the r columns that hold a response token.
          meter.add(e - u, p + r, r, true);
        }
      std::vector<std::pair<int64_t, int64_t>> passes;
      std::vector<LossWeight> weights;
      weighPasses(correction ? (*correction)["m"] : (*rollout)["rmask"], batches, runs, mbRows,
                  passes, weights);
      // Every pass over its own columns; the heads over the response
      // columns holding a token (as logprob's and values' passes run them:
      // the same shapes, the same log-probs), on the ranks that hold the
      // final hidden states (a pipeline's last stage).
      std::vector<models::MicroBatch> micros;
      std::vector<std::pair<int64_t, int64_t>> widths;
      for (auto [u, e] : passes) {
        int64_t p = P, r = R;
        micros.push_back(seqMicro(*rollout, u, e, trimPasses(), p, r, replayLayers(c, *rollout)));
        widths.push_back({p, r});
      }
      rr.lm->runPasses(micros, [&](int i, const at::Tensor &h) {
        const auto [u, e] = passes[(size_t)i];
        const auto [p, r] = widths[(size_t)i];
        return microLoss(u, e, h.narrow(1, p - 1, r), weights[(size_t)i]);
      }, true);
      // A mixture's load-balancing loss, which the passes added.
      if (const std::optional<double> aux = rr.lm->lastAuxLoss(); aux && c.leader) {
        metrics_->moeAux += *aux;
        metrics_->moeN += 1;
      }
      meter.done();
      order.reset(); // the plan's row order again
      if (c.ro.kind() == RoleKind::Actor && rr.optim && ph.stalenessBound >= 0 &&
          rollout->f.count("version"))
        recordStaleness(*rollout, lo + m0, mbRows, rr.optim->steps(), ph.stalenessBound,
                        describe(s), c.leader ? &*metrics_ : nullptr);
      grads_.apply(rr, lrOver);
    }
  // The loss is where the heads ran (a pipeline's last stage).
  std::vector<double> shared{microLoss.lastLoss};
  rr.lm->shareHeadValues(shared);
  const double lastLoss = shared[0];
  digests_[s] = 0;
  if (rr.holdsShards()) // shards differ between ranks; the replica's loss agrees
    digests_[s] = lastLoss;
  else
    for (auto &p : rr.lm->parameters())
      digests_[s] += p.detach().to(at::kDouble).sum().item<double>();
}

} // namespace hflow::exec
