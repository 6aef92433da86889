//===- RewardModel.cpp - a reward model's training, held-out accuracy, export -===//
//
// A RewardModel role is a headless body (no LM head) and a score head
// [1, H] read at each sequence's last real non-padding token, as
// transformers' *ForSequenceClassification reads it. `fit` trains it on
// preference pairs with the Bradley-Terry loss
//     -log sigma(r(prompt, chosen) - r(prompt, rejected)),
// averaged over a minibatch's pairs, on any model form (whole, TP, FSDP,
// pipeline stages: the passes go through scoreSequences). --eval-pairs
// measures held-out preference accuracy; --export-hf ROLE=DIR writes the
// model back as a sequence-classification checkpoint.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/MethodRunner.h"
#include "runtime/models/Device.h"

#include "runtime/models/Safetensors.h"
#include "runtime/rl/Losses.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>

namespace hflow::exec {

using namespace hflow::plan;

std::vector<int64_t> MethodRunner::pairSequence(const data::Dataset &ds, const data::Example &ex,
                                          const std::string &response) const {
  std::vector<int64_t> t = text_.promptOf(ds, ex);
  std::vector<int64_t> r = text_.tok->encode(response);
  t.insert(t.end(), r.begin(), r.end());
  t.push_back(text_.tok->eosId());
  return t;
}

at::Tensor MethodRunner::scoreSequences(
    RoleRt &rr, const std::vector<std::vector<int64_t>> &seqs, int64_t micro,
    const std::function<at::Tensor(int, const at::Tensor &)> &lossOf,
    std::vector<double> *losses) {
  const int64_t N = (int64_t)seqs.size();
  micro = std::max<int64_t>(1, micro);
  int64_t L = 1;
  for (const auto &q : seqs)
    L = std::max<int64_t>(L, (int64_t)q.size());
  // Right padded: the positions are 0.. on every row.
  at::Tensor toks = at::full({N, L}, text_.tok->padId(), at::TensorOptions().dtype(at::kLong));
  at::Tensor mask = at::zeros({N, L});
  for (int64_t i = 0; i < N; ++i) {
    const auto &q = seqs[(size_t)i];
    toks[i].narrow(0, 0, (int64_t)q.size())
        .copy_(at::tensor(q, at::TensorOptions().dtype(at::kLong)));
    mask[i].narrow(0, 0, (int64_t)q.size()).fill_(1.0f);
  }
  // Built on the host from token ids; onto the engine's device once.
  toks = toks.to(models::engineDevice());
  mask = mask.to(models::engineDevice());
  std::vector<models::MicroBatch> micros;
  std::vector<int64_t> starts;
  for (int64_t u = 0; u < N; u += micro) {
    const int64_t cnt = std::min(micro, N - u);
    at::Tensor t = toks.narrow(0, u, cnt), mk = mask.narrow(0, u, cnt);
    micros.push_back({t, models::positionsFromMask(mk), mk});
    starts.push_back(u);
  }
  at::Tensor out = at::zeros({N}, models::onEngine(at::kFloat));
  const bool train = (bool)lossOf;
  // Pass i's scores from its final hidden states [b, L, H]; its loss when
  // training.
  auto headOf = [&](int i, const at::Tensor &h) -> at::Tensor {
    const models::MicroBatch &mb = micros[(size_t)i];
    const int64_t b = mb.tokens.size(0);
    at::Tensor at_ = models::scoredPositions(mb.tokens, mb.keyMask, rr.scorePad);
    at::Tensor hl = h.gather(1, at_.view({b, 1, 1}).expand({b, 1, h.size(2)})).squeeze(1);
    at::Tensor sc = scalarHead(hl, rr.head);
    out.narrow(0, starts[(size_t)i], b).copy_(sc.detach());
    return train ? lossOf(i, sc) : at::zeros({}, sc.options());
  };
  std::optional<c10::NoGradGuard> noGrad;
  if (!train)
    noGrad.emplace();
  // Every form runs the passes its way; the ranks that ran the heads
  // share the scores (and the losses) with the form's other ranks.
  std::vector<double> ls = rr.lm->runPasses(micros, headOf, train);
  rr.lm->shareHeadResult(out);
  if (train && losses) {
    ls.resize(micros.size()); // the other stages of a pipeline have none yet
    rr.lm->shareHeadValues(ls);
    losses->insert(losses->end(), ls.begin(), ls.end());
  }
  return out;
}

/// fit: Bradley-Terry training on this replica's preference pairs: epochs
/// x minibatches (one optimizer step each; `minibatch:` counts pairs over
/// all replicas, as for sft) x passes of `micro_batch` pairs (2 sequences
/// each) whose gradients accumulate. Each pass's loss is its pairs' summed
/// -log sigma(r_chosen - r_rejected) over the minibatch's pairs: the
/// minibatch mean, however it is cut.
void MethodRunner::runFit(MethodCall &c) {
  const DataRows d = dataRows(c, describe(c.s) + ": fit trains on preference pairs: the phase "
                                                 "needs a data set whose rows have 'chosen' "
                                                 "and 'rejected' responses");
  const Span sp = d.rows;
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const plan::CallArgs &a = c.a;
  const int s = c.s;
  if (!rr.optim)
    throw RunError(describe(s) + ": reward model " + str(c.ro.name()) + " has no optimizer");
  std::vector<std::vector<int64_t>> seqs; // chosen, rejected, chosen, ...
  const at::Tensor &idsHost = d.ids;
  for (int64_t b = sp.lo; b < sp.hi; ++b) {
    const data::Example &ex = (*ph.dataset)[(size_t)idsHost[b].item<int64_t>()];
    if (!ex.hasPair)
      throw RunError(ph.dataset->path() + ":" + std::to_string(ex.line) + ": " +
                     str(c.ro.name()) + ".fit needs a preference pair: fields 'chosen' "
                     "and 'rejected' (non-empty strings)");
    seqs.push_back(pairSequence(*ph.dataset, ex, ex.chosen));
    seqs.push_back(pairSequence(*ph.dataset, ex, ex.rejected));
  }
  const int64_t B = sp.hi - sp.lo; // pairs
  const TrainingCut cut = TrainingCut::of(c, B);
  const int64_t epochs = cut.epochs, mbRows = cut.minibatch, micro = cut.micro;
  double lastLoss = 0;
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t m0 = 0; m0 < B; m0 += mbRows) {
      std::vector<std::vector<int64_t>> mb(seqs.begin() + 2 * m0,
                                           seqs.begin() + 2 * (m0 + mbRows));
      int64_t L = 1;
      for (const auto &q : mb)
        L = std::max<int64_t>(L, (int64_t)q.size());
      PassMeter meter(rr);
      for (int64_t u = 0; u < mbRows; u += micro)
        meter.add(2 * std::min(micro, mbRows - u), L, 1, true);
      auto lossOf = [&](int, const at::Tensor &sc) {
        at::Tensor pairs = sc.view({-1, 2});
        return rl::bradley_terry_loss(pairs.select(1, 0), pairs.select(1, 1), (double)mbRows)
            .loss;
      };
      std::vector<double> losses;
      at::Tensor scores = scoreSequences(rr, mb, 2 * micro, lossOf, &losses);
      meter.done();
      double mbLoss = 0;
      for (double l : losses)
        mbLoss += l;
      grads_.checkLoss(rr, "reward-model loss", mbLoss);
      if (c.leader) {
        at::Tensor pairs = scores.view({-1, 2});
        rl::PreferenceLossOutput o =
            rl::bradley_terry_loss(pairs.select(1, 0), pairs.select(1, 1), (double)mbRows);
        metrics_->rmLoss += mbLoss;
        metrics_->rmAcc += o.accuracy.item<double>();
        metrics_->rmMargin += o.margin.item<double>();
        metrics_->rmN += 1;
      }
      grads_.apply(rr, a.lr().value_or(0));
      lastLoss = mbLoss;
    }
  digests_[s] = lastLoss;
}

} // namespace hflow::exec
