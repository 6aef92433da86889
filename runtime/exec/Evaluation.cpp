//===- Evaluation.cpp - held-out evaluation, the reference's start --------===//
//
// See Evaluator.h: greedy responses to the held-out prompts (--eval) on the
// actor's replicas, scored by the reward rule; the reward models' held-out
// pair accuracy (--eval-pairs); and at a phase after the first, the
// reference model takes the actor's current weights.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Evaluator.h"
#include "runtime/exec/Episodes.h"
#include "runtime/models/Device.h"
#include "runtime/models/Safetensors.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <filesystem>

namespace hflow::exec {

using namespace hflow::plan;

/// Greedy responses to the held-out prompts on the actor's generation
/// replicas, scored by the reward rule; (sum, count) go to the metrics.
void Evaluator::evaluate(const std::string &when, int64_t it) {
  evaluatePairs(it < 0 ? when : when + "-" + std::to_string(it + 1));
  if (!s_.heldOut.eval)
    return;
  refreshGenerationCopies(roles_);
  struct Drop { // ShardsOnly actors free their whole copy again, however this ends
    std::map<int, RoleRt> &roles;
    ~Drop() { dropWholeCopies(roles); }
  } drop{roles_};
  int gen = -1;
  for (auto &[r, rr] : roles_)
    if (role(r).kind() == RoleKind::Actor && rr.model && rr.holding != Holding::GenerationRank)
      gen = r; // an actor generating apart is evaluated where it trains
  if (gen < 0)
    return;
  const Role &ro = role(gen);
  const RoleRt &rr = roles_.at(gen);
  const Layout &l = rr.apart ? *ro.train() : *ro.generate();
  const int per = rr.apart ? 1 : std::max(1, l.tp() * l.pp() * l.sp() * l.cp());
  if (rr.pos % per != 0)
    return; // one rank per replica scores
  const int dp = std::max(1, (int)ints(ro.ranks()).size() / per);
  const int replica = rr.pos / per;
  const int64_t N = o_.evalCount > 0 ? std::min<int64_t>(o_.evalCount, s_.heldOut.eval->size())
                                     : (int64_t)s_.heldOut.eval->size();
  const int64_t lo = replica * N / dp, hi = (replica + 1) * N / dp;
  const int64_t chunk = 64;
  if (s_.heldOut.envStep >= 0)
    return evaluateEpisodes(gen, lo, hi);
  for (int64_t c0 = lo; c0 < hi; c0 += chunk) {
    const int64_t c1 = std::min(hi, c0 + chunk);
    std::vector<std::vector<int64_t>> ps;
    int64_t P = 1;
    for (int64_t i = c0; i < c1; ++i) {
      const auto &ex = (*s_.heldOut.eval)[(size_t)i];
      ps.push_back(s_.text.promptOf(*s_.heldOut.eval, ex));
      P = std::max<int64_t>(P, (int64_t)ps.back().size());
    }
    const int64_t B = c1 - c0;
    at::Tensor toks = at::full({B, P}, s_.text.tok->padId(), at::TensorOptions().dtype(at::kLong));
    at::Tensor mask = at::zeros({B, P});
    for (int64_t b = 0; b < B; ++b)
      for (size_t j = 0; j < ps[b].size(); ++j) {
        toks[b][P - (int64_t)ps[b].size() + (int64_t)j] = ps[b][j];
        mask[b][P - (int64_t)ps[b].size() + (int64_t)j] = 1.0f;
      }
    models::SamplingOptions so;
    so.maxTokens = (int)s_.heldOut.evalR;
    so.greedy = true;
    so.stopToken = s_.text.tok->eosId();
    so.moreStopTokens.assign(s_.text.stops.begin() + 1, s_.text.stops.end());
    so.padToken = s_.text.tok->padId();
    at::Generator g = models::makeGenerator(1);
    models::Generation out = rr.model->generate(toks.to(models::engineDevice()),
                                                mask.to(models::engineDevice()), so, g);
    // The responses leave the engine to be scored as text.
    const at::Tensor outToks = out.tokens.cpu(), outMask = out.mask.cpu();
    auto acc = outToks.accessor<int64_t, 2>();
    auto m = outMask.accessor<float, 2>();
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> ids;
      for (int64_t t = 0; t < out.tokens.size(1); ++t)
        if (m[b][t] > 0 && !s_.text.isStop(acc[b][t]))
          ids.push_back(acc[b][t]);
      record_.sums->evalSum += s_.heldOut.evalRule->fn(s_.text.tok->decode(ids), (*s_.heldOut.eval)[(size_t)(c0 + b)]);
      record_.sums->evalN += 1;
    }
  }
}

void Evaluator::evaluateEpisodes(int gen, int64_t lo, int64_t hi) {
  if (lo >= hi)
    return;
  const int s = s_.heldOut.envStep;
  const PhaseRt *ph = nullptr;
  for (const PhaseRt &p : s_.phases)
    if (s >= p.first && s < p.first + p.count)
      ph = &p;
  if (!ph)
    throw RunError("--eval: the environment's generate step " + std::to_string(s) +
                   " is in no phase");
  const plan::CallArgs &a = *step(s).args();
  std::shared_ptr<const data::ChatTemplate> tmpl =
      s_.text.prompts ? s_.text.prompts->chatTemplate() : nullptr;
  if (!tmpl)
    throw RunError("--eval plays the held-out prompts as episodes, rendered with the "
                   "tokenizer's chat template, and the tokenizer '" + s_.text.tok->name() +
                   "' has none");
  env::EnvProcess &env = methods_.environment(*ph, s, a);
  const RoleRt &rr = roles_.at(gen);
  const data::Dataset &ds = *s_.heldOut.eval;
  models::SamplingOptions so =
      samplingOptions(a, *role(gen).options(), *s_.text.tok, s_.text.stops);
  so.greedy = true;
  so.paged = true;
  so.limits.blockSize = a.kv_block_size().value_or(16);
  so.limits.maxSeqs = a.max_num_seqs().value_or(0);
  so.stopWhen = stopStringMatcher(a, s_.text.tok.get());
  const int64_t R = std::min<int64_t>(a.max_tokens().value_or(16), ph->R);
  EpisodeRules rules;
  rules.maxTurns = a.max_turns().value_or(1);
  rules.turnTokens = a.turn_tokens().value_or(R);
  rules.responseTokens = R;
  rules.padId = s_.text.tok->padId();
  rules.heldOut = true;
  rules.where = "the held-out evaluation";
  at::Generator g = models::makeGenerator(1); // (greedy: unused)
  const int64_t chunk = 64;
  for (int64_t c0 = lo; c0 < hi; c0 += chunk) {
    const int64_t c1 = std::min(hi, c0 + chunk);
    EpisodeBatch eps;
    for (int64_t i = c0; i < c1; ++i) {
      const data::Example &ex = ds[(size_t)i];
      std::vector<int64_t> ids = s_.text.promptOf(ds, ex);
      nlohmann::ordered_json messages =
          ex.messages.empty()
              ? nlohmann::ordered_json::array({{{"role", "user"}, {"content", ex.prompt}}})
              : nlohmann::ordered_json::parse(ex.messages);
      const int64_t len = (int64_t)ids.size();
      eps.add(data::Conversation(*s_.text.tok, tmpl, std::move(messages), std::move(ids)), len,
              i, 0, i, ex.answer);
    }
    playEpisodes(
        eps, env,
        [&](const at::Tensor &tp, const at::Tensor &tm, models::SamplingOptions &o) {
          return rr.model->generate(tp, tm, o, g);
        },
        so, rules);
    for (size_t i = 0; i < eps.size(); ++i) {
      record_.sums->evalSum += eps.failed[i] ? 0.0 : eps.reward[i];
      record_.sums->evalN += 1;
      record_.sums->evalTurns += (double)eps.turns[i];
    }
    for (const std::string &f : eps.failures)
      std::fprintf(stderr, "[rank %d] --eval: %s (environment folder %s)\n", j_.rank, f.c_str(),
                   env.folder().c_str());
  }
}

/// At the start of a phase after the first, a reference model that shares
/// an actor's model and devices takes the actor's current weights (the
/// reference of RL after a warm-up is the warmed-up policy).
void Evaluator::syncReference(int phaseIndex) {
  if (phaseIndex == 0)
    return;
  refreshGenerationCopies(roles_);
  // A reference on ranks without its actor: the actor's first training rank
  // broadcasts the current weights (whole, once per phase) to the world,
  // and those ranks take them; every rank decides the same from the plan.
  std::map<int, std::unique_ptr<models::Llama>> received; // model index -> weights
  std::map<int, int> senderOf;                             // model index -> root rank
  for (int a = 0; p_.roles() && a < (int)p_.roles()->size(); ++a) {
    const Role &actor = role(a);
    if (actor.kind() != RoleKind::Actor || actor.model() < 0 || !actor.ranks() ||
        actor.ranks()->size() == 0)
      continue;
    const std::vector<int> ar = ints(actor.ranks());
    bool apartRef = false, mine = false;
    for (int r = 0; r < (int)p_.roles()->size(); ++r) {
      const Role &ref = role(r);
      if (ref.kind() != RoleKind::Reference || ref.model() != actor.model())
        continue;
      for (int rk : ints(ref.ranks()))
        if (std::find(ar.begin(), ar.end(), rk) == ar.end()) {
          apartRef = true;
          mine = mine || rk == j_.rank;
        }
    }
    // Decided from the plan alone, so every rank takes part in the same
    // broadcasts (one model's weights once, however many actors share it).
    if (!apartRef || senderOf.count(actor.model()))
      continue;
    const int root = ar[0];
    senderOf[actor.model()] = root;
    const models::Llama *src = nullptr;
    if (auto it = roles_.find(a); it != roles_.end() && it->second.holding != Holding::GenerationRank)
      src = it->second.model.get();
    if (j_.rank == root && !src)
      throw RunError("the reference's start of phase " + s_.phases[phaseIndex].name +
                     ": actor " + str(actor.name()) + " has no whole weights on rank " +
                     std::to_string(root));
    // The actor's weights travel in its own precision.
    const models::LlamaConfig actorCfg = builder_.roleConfig(a);
    std::unique_ptr<models::Llama> dst;
    if (mine && !src)
      dst = std::make_unique<models::Llama>(actorCfg,
                                            models::modelSeed(p_.seed(), actor.model()));
    // The parameters' shapes, the same on every rank.
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes =
        models::llamaParameterShapes(builder_.modelConfig(actor.model()));
    std::vector<std::pair<std::string, at::Tensor>> srcNamed, dstNamed;
    if (src)
      srcNamed = src->namedParameters();
    if (dst)
      dstNamed = dst->namedParameters();
    c10::NoGradGuard ng;
    for (size_t i = 0; i < shapes.size(); ++i) {
      at::Tensor buf = j_.rank == root ? srcNamed[i].second.detach().clone()
                                       : at::empty(shapes[i].second,
                                                   models::onEngine(actorCfg.dtype));
      comms_.world->broadcast(buf, root);
      if (dst)
        dstNamed[i].second.copy_(buf);
    }
    if (dst)
      received[actor.model()] = std::move(dst);
  }
  for (auto &[r, rr] : roles_) {
    if (role(r).kind() != RoleKind::Reference || (!rr.model && !rr.holdsShards()))
      continue;
    bool withActor = false;
    for (auto &[a, ar] : roles_)
      withActor = withActor || (role(a).kind() == RoleKind::Actor && ar.model &&
                                role(a).model() == role(r).model());
    if (auto got = received.find(role(r).model()); !withActor && got != received.end()) {
      if (rr.holdsShards())
        rr.lm->loadFrom(*got->second);
      else
        rr.model->copyFrom(*got->second);
      log_.clearBar();
      if (rr.pos == 0 && !o_.quiet)
        std::printf("[%s] %s starts from the actor's current weights (sent by rank %d)\n",
                    s_.phases[phaseIndex].name.c_str(), str(role(r).name()).c_str(),
                    senderOf.at(role(r).model()));
      continue;
    }
    for (auto &[a, ar] : roles_)
      if (role(a).kind() == RoleKind::Actor && ar.model &&
          role(a).model() == role(r).model()) {
        if (rr.holdsShards())
          rr.lm->loadFrom(*ar.model); // this rank's shards of them
        else
          rr.model->copyFrom(*ar.model);
        log_.clearBar();
        if (rr.pos == 0 && !o_.quiet)
          std::printf("[%s] %s starts from %s's current weights\n",
                      s_.phases[phaseIndex].name.c_str(), str(role(r).name()).c_str(),
                      str(role(a).name()).c_str());
      }
  }
  dropWholeCopies(roles_);
}

/// Every reward model's accuracy on the held-out preference pairs.
void Evaluator::evaluatePairs(const std::string &label) {
  if (!s_.heldOut.pairs)
    return;
  const int64_t N = o_.evalCount > 0 ? std::min<int64_t>(o_.evalCount, s_.heldOut.pairs->size())
                                     : (int64_t)s_.heldOut.pairs->size();
  for (auto &[r, rr] : roles_) {
    if (role(r).kind() != RoleKind::RewardModel || !rr.lm)
      continue;
    // Every replica scores every pair (collectives in step on each); the
    // role's first rank reports.
    std::vector<std::vector<int64_t>> seqs;
    for (int64_t i = 0; i < N; ++i) {
      const data::Example &ex = (*s_.heldOut.pairs)[(size_t)i];
      seqs.push_back(methods_.pairSequence(*s_.heldOut.pairs, ex, ex.chosen));
      seqs.push_back(methods_.pairSequence(*s_.heldOut.pairs, ex, ex.rejected));
    }
    at::Tensor sc = methods_.scoreSequences(rr, seqs, 64, {}, nullptr).view({-1, 2});
    if (rr.pos != 0)
      continue;
    record_.sums->pairAcc += (sc.select(1, 0) > sc.select(1, 1)).sum().item<double>();
    record_.sums->pairN += (double)N;
    if (!o_.dumpValues.empty()) {
      // Every pair's two scores and the token ids they were read from, to
      // check them against another forward (and the pairs' assembly).
      std::error_code ec;
      std::filesystem::create_directories(o_.dumpValues, ec);
      const std::string path =
          o_.dumpValues + "/pairs-" + label + "-" + str(role(r).name()) + ".jsonl";
      std::string body;
      char b[128];
      auto ids = [](const std::vector<int64_t> &q) {
        std::string out = "[";
        for (size_t k = 0; k < q.size(); ++k)
          out += (k ? ", " : "") + std::to_string(q[k]);
        return out + "]";
      };
      for (int64_t i = 0; i < N; ++i) {
        std::snprintf(b, sizeof b, "{\"row\": %lld, \"chosen\": %.9g, \"rejected\": %.9g",
                      (long long)i, sc[i][0].item<double>(), sc[i][1].item<double>());
        body += b;
        body += ", \"chosen_ids\": " + ids(seqs[(size_t)(2 * i)]) +
                ", \"rejected_ids\": " + ids(seqs[(size_t)(2 * i + 1)]) + "}\n";
      }
      try {
        models::writeFileAtomic(path, body);
      } catch (const std::exception &e) {
        throw RunError(std::string("--dump-values: ") + e.what());
      }
    }
  }
}

} // namespace hflow::exec
