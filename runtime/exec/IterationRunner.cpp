//===- IterationRunner.cpp - one iteration of a phase ---------------------===//
//
// See IterationRunner.h. Every rank walks the phase's steps in their global
// order: before a step it sends and receives the batch rows the step's
// ranks need (RowSchedule), then runs the step if it is in its own
// schedule.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/IterationRunner.h"
#include "runtime/models/Device.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace hflow::exec {

using namespace hflow::plan;

void IterationRunner::makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out) {
  const int64_t B = (int64_t)ids.size(), P = ph.P;
  out = makeVal(BatchKind::Prompts, B, ph.widths(), /*host=*/true); // filled here, then moved
  auto toks = out["ptoks"].accessor<int64_t, 2>();
  auto mask = out["pmask"].accessor<float, 2>();
  auto idv = out["ids"].accessor<int64_t, 1>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> t;
    if (ph.dataset) {
      const auto &ex = (*ph.dataset)[(size_t)ids[b]];
      t = setup_.text.promptOf(*ph.dataset, ex);
    } else {
      // Synthetic prompts of a plan without data: P random tokens.
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(mix(ph.seed, ids[b]));
      at::Tensor r = at::randint(1, setup_.text.synthVocab, {P}, g,
                                 at::TensorOptions().dtype(at::kLong));
      t.assign(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + P);
    }
    idv[b] = ids[b];
    const int64_t pad = P - (int64_t)t.size(); // left padding
    for (int64_t j = 0; j < P; ++j) {
      toks[b][j] = j < pad ? setup_.text.tok->padId() : t[j - pad];
      mask[b][j] = j < pad ? 0.0f : 1.0f;
    }
  }
  // The prompts enter the engine: one copy per field to its device.
  if (!models::engineDevice().is_cpu())
    for (auto &[name, t] : out.f)
      t = t.to(models::engineDevice());
}

/// Moves the batch rows step `s`'s ranks need, or with `early` the rows of
/// the rollout made one iteration ahead (when the iteration starts): one
/// grouped exchange of every block this rank sends or receives, listed in
/// the plan's order of transfers on both sides, so the blocks between two
/// ranks match one for one and ranks that send to each other cannot
/// deadlock (Communicator::exchange).
void IterationRunner::moveRows(PhaseRt &ph, int s, bool early) {
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  std::vector<const Xfer *> received;
  for (const Xfer &x : ph.xfers) {
    if (x.early != early || (!early && x.before != s) || x.streamed)
      continue;
    if (x.src == j_.rank) {
      auto it = vals_.find(x.value);
      if (it == vals_.end())
        throw RunError(early ? ph.name + ": this rank should send rows of the rollout made one "
                                         "iteration ahead, but has none"
                             : describe(s) + ": this rank should send rows of a value it does "
                                             "not have");
      sends.emplace_back(x.dst, packRows(it->second, ph.widths(), x.lo, x.hi));
    } else if (x.dst == j_.rank) {
      BatchKind k = p_.values()->Get(x.value)->kind();
      recvs.emplace_back(x.src, at::empty({packedBytes(k, ph.widths(), x.hi - x.lo)},
                                          models::onEngine(at::kByte)));
      received.push_back(&x);
    }
  }
  comms_.world->exchange(sends, recvs);
  for (size_t i = 0; i < received.size(); ++i) {
    const Xfer &x = *received[i];
    BatchKind k = p_.values()->Get(x.value)->kind();
    auto it = vals_.find(x.value);
    if (it == vals_.end())
      it = vals_.emplace(x.value, makeVal(k, setup_.rows->rowsOfValue(ph, x.value), ph.widths())).first;
    unpackRows(it->second, ph.widths(), x.lo, x.hi, recvs[i].second);
  }
}


void IterationRunner::run(PhaseRt &ph, int64_t it) {
  progress_.iter = it;
  ph.draw = 0;
  vals_.clear();
  record_.digests.clear();
  record_.sums.emplace();
  record_.stepMs.assign(2 * ph.count, 0.0);
  record_.faultsAt = pageFaults();
  auto t0 = Clock::now();
  for (int r = 0; r < p_.world_size(); ++r)
    for (int s : ints(p_.schedules()->Get(r)->steps()))
      if (s >= ph.first && s < ph.first + ph.count)
        ++progress_.plannedSteps;
  // off_policy L: the rollout this iteration trains on was made L
  // iterations before (or by runAhead); the generate step makes the one of
  // iteration it + L from the next prompts, with the weights the reshard
  // brings now (L updates behind), while the rest of the flow trains. The
  // last L iterations make none.
  const int L = ph.offPolicy;
  const bool ahead = L > 0, queued = L >= 2;
  const bool makeNext = !ahead || it + L < ph.iterations;
  if (ahead && queued) {
    // The queue: its rows left the generation ranks when it was made (a
    // resumed run posts them again); the training ranks take them now.
    progress_.activity = "receiving the rollout made two iterations ahead";
    postCarried(ph);
    receiveCarried(ph);
    if (!ph.carry.empty()) {
      ph.carry.pop_front();
      --ph.carryPosted;
    }
  } else if (ahead) {
    progress_.activity = "sending the rollout made one iteration ahead";
    if (!ph.carry.empty()) {
      vals_[ph.rolloutValue] = std::move(ph.carry.front());
      ph.carry.pop_front();
    }
    // Its rows leave the generation ranks at once: the training ranks need
    // them while this rank generates the next rollout.
    moveRows(ph, -1, /*early=*/true);
  }
  if (ahead && !makeNext)
    progress_.plannedSteps -= setup_.rows->plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep});
  if (makeNext) {
    const std::vector<int64_t> ids = nextPrompts(ph);
    for (int s = ph.first; s < ph.first + ph.count; ++s)
      for (int v : ints(step(s).inputs()))
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts && !vals_.count(v))
          makePrompts(ph, ids, vals_[v]);
    if (!ahead && it == 0)
      drawLeads(ph);
  }
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    progress_.step = s;
    if (ahead && (s == ph.reshardStep || s == ph.genStep || s == ph.genCheckStep) &&
        !makeNext) {
      record_.stepMs[s - ph.first] = 0;
      continue;
    }
    auto tm = Clock::now();
    moveRows(ph, s, /*early=*/false);
    trace_.span("rows for step " + std::to_string(s), TraceRecorder::kCommunication, tm);
    // Counted on the ranks that receive rows for the step.
    if (std::any_of(ph.xfers.begin(), ph.xfers.end(),
                    [&](const Xfer &x) { return x.before == s && x.dst == j_.rank; }))
      record_.stepMs[ph.count + s - ph.first] += msSince(tm);
    auto ts = Clock::now();
    const bool streamed =
        std::find(ph.streamSteps.begin(), ph.streamSteps.end(), s) != ph.streamSteps.end();
    if (streamed) {
      // Run on each group as it came (receiveStream), timed there; the
      // wait for the rows counts as the first stream step's moves.
      record_.stepMs[s - ph.first] = streamMs_[s];
      record_.stepMs[ph.count + s - ph.first] = streamWaitMs_[s];
      continue;
    }
    if (setup_.mySteps.count(s)) {
      if (!ph.streamSteps.empty() && s == ph.genStep) {
        generateStreaming(ph, s, it);
      } else if (ahead && s == ph.genStep) {
        // The rollout of iteration it + L; this one's stays in place.
        std::optional<Val> current;
        if (auto v = vals_.find(ph.rolloutValue); v != vals_.end()) {
          current = std::move(v->second);
          vals_.erase(v);
        }
        if (queued) // this iteration's rows: taken before the weights came
          settlePosted(ph, 1);
        runStep(ph, s, it + L, " (ahead)");
        ph.carry.push_back(std::move(vals_.at(ph.rolloutValue)));
        vals_.erase(ph.rolloutValue);
        if (current)
          vals_[ph.rolloutValue] = std::move(*current);
        if (queued)
          postCarried(ph);
      } else {
        runStep(ph, s, it, "");
      }
      log_.clearBar();
      if (o_.verbose)
        std::printf("[rank %d] %s: %.1f ms\n", j_.rank, describe(s).c_str(), msSince(ts));
    }
    double received = 0; // timed as the stream steps' (not the generate step's)
    if (!ph.streamSteps.empty() && s == ph.genStep && !setup_.mySteps.count(s)) {
      auto tr = Clock::now();
      receiveStream(ph, it);
      received = msSince(tr);
    }
    if (o_.serialize)
      comms_.world->barrier();
    // (+=: a step of a filter's span runs once per draw)
    record_.stepMs[s - ph.first] += msSince(ts) - received;
    if (s == ph.filterStep && !filterDone(ph))
      s = ph.genStep - 1; // the next draw
  }
  progress_.step = -1;
  ph.leads.reset(); // admitted by the phase's first generate call
  const bool evals = setup_.heldOut.eval || setup_.heldOut.pairs;
  bool evalNow = evals && o_.evalEvery > 0 && (it + 1) % o_.evalEvery == 0;
  bool lastIt = it + 1 == ph.iterations;
  if (evals && lastIt)
    evalNow = true;
  progress_.activity = "evaluating on the held-out prompts";
  if (evalNow)
    evaluator_.evaluate(ph.name, it);
  progress_.activity = "gathering the iteration's metrics";
  // The queue: no rank waits for the others' iteration; their rows reach
  // rank 0 two iterations later (every row, before a checkpoint).
  if (queued)
    report_.gatherLate(ph, it, msSince(t0), evalNow, /*lag=*/2);
  else
    report_.gather(ph, it, msSince(t0), evalNow);
  ++progress_.globalIter;
  if (j_.rank == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION_RANK", -1) &&
      progress_.globalIter == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION", -1))
    std::abort(); // fault injection for tests: a worker dies mid-run
  progress_.activity = "saving checkpoint " + std::to_string(progress_.globalIter) + " in '" + ck_.dir() + "'";
  if (ck_.due(progress_.globalIter)) {
    if (queued)
      report_.flushLate();
    state_.save();
  }
  progress_.activity.clear();
}

/// After the filter_groups step of draw ph.draw (dynamic sampling): the
/// controller tells every rank whether its batch is full (one broadcast).
/// Full: true, and the controller counts the draws. Not yet: the values
/// the span made are dropped, the next prompts drawn (the same on every
/// rank) and false returned, for the span to run again. Out of draws: every
/// rank stops with the same error.
bool IterationRunner::filterDone(PhaseRt &ph) {
  enum : int { kMore = 0, kFull = 1, kShort = 2 };
  const Step &fs = step(ph.filterStep);
  const int64_t maxDraws = fs.args()->max_draws().value_or(1);
  at::Tensor t = at::zeros({4}, at::TensorOptions().dtype(at::kDouble));
  if (j_.rank == 0) {
    const GroupFilter &f = controller_.filter();
    const int state = f.keptGroups() >= ph.batch ? kFull : f.draws() >= maxDraws ? kShort : kMore;
    t = at::tensor({(double)state, (double)f.draws(), (double)f.keptGroups(),
                    (double)f.droppedGroups()},
                   at::TensorOptions().dtype(at::kDouble));
  }
  t = t.to(models::engineDevice());
  comms_.world->broadcast(t, 0);
  t = t.cpu();
  const int state = (int)t[0].item<double>();
  const int64_t draws = (int64_t)t[1].item<double>(), kept = (int64_t)t[2].item<double>(),
                dropped = (int64_t)t[3].item<double>();
  if (state == kShort)
    throw RunError("after " + std::to_string(draws) + " draw" +
                   (draws == 1 ? "" : "s") + " of " + std::to_string(ph.batch) +
                   " prompts, only " + std::to_string(kept) + " of the " +
                   std::to_string(ph.batch) + " groups the batch needs have rewards that "
                   "differ (" + std::to_string(dropped) + " dropped as all equal): raise "
                   "max_draws, or train on prompts the model solves some of the time");
  if (state == kFull) {
    if (j_.rank == 0 && record_.sums) {
      record_.sums->filterDraws += (double)draws;
      record_.sums->filterDropped += (double)dropped;
    }
    return true;
  }
  ++ph.draw;
  // The span's values give way to the next draw's; the controller keeps
  // the groups it kept.
  std::set<int> span;
  for (int q = ph.genStep; q <= ph.filterStep; ++q) {
    span.insert(q);
    for (int v : ints(step(q).outputs()))
      vals_.erase(v);
  }
  const std::vector<int64_t> ids = nextPrompts(ph);
  for (auto it = vals_.begin(); it != vals_.end();)
    it = it->second.kind == BatchKind::Prompts ? vals_.erase(it) : std::next(it);
  for (int s = ph.first; s < ph.first + ph.count; ++s)
    for (int v : ints(step(s).inputs()))
      if (p_.values()->Get(v)->kind() == BatchKind::Prompts && !vals_.count(v))
        makePrompts(ph, ids, vals_[v]);
  progress_.plannedSteps += setup_.rows->plannedOf(span);
  return false;
}

/// Partial rollouts: the prompts of the partialHorizon batches after the
/// first, drawn on every rank (the sampler stays the same everywhere) and
/// admitted by the phase's first generate call, so that its calls have
/// groups in flight from then on.
void IterationRunner::drawLeads(PhaseRt &ph) {
  if (ph.partialHorizon <= 0)
    return;
  std::vector<int64_t> ids;
  for (int k = 0; k < ph.partialHorizon; ++k)
    for (int64_t id : nextPrompts(ph))
      ids.push_back(id);
  makePrompts(ph, ids, ph.leads.emplace());
}

/// The next batch of prompt indices: the same on every rank (seeded sampler).
std::vector<int64_t> IterationRunner::nextPrompts(PhaseRt &ph) {
  if (ph.sampler)
    return ph.sampler->next((size_t)ph.batch);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < ph.batch; ++i)
    ids.push_back(i);
  return ids;
}

/// Runs step `s` of this rank's schedule (its rows already moved), with
/// iteration `it`'s sampling seed, and traces it (`suffix` after the name).
void IterationRunner::runStep(PhaseRt &ph, int s, int64_t it, const char *suffix,
                              StreamOut *stream) {
  const Step &st = step(s);
  auto tc = Clock::now();
  switch (st.kind()) {
  case StepKind::Compute:
    runCompute(ph, s, it, stream);
    break;
  case StepKind::Builtin:
    controller_.runBuiltin(ph, s);
    break;
  case StepKind::Reshard:
    // The queue (off_policy 2): the training ranks post the weights and go
    // on; the generation ranks take them when they start the rollout.
    record_.digests[s] = resharder_.run(*p_.reshards()->Get(st.reshard()), roles_,
                                        record_.sums ? &*record_.sums : nullptr,
                                        ph.offPolicy >= 2 && s == ph.reshardStep && !inAhead_);
    break;
  case StepKind::CheckAllGather:
    controller_.runCheck(s);
    break;
  }
  ++progress_.stepsRun;
  std::string label = st.kind() == StepKind::Compute ? setup_.rows->callName(s)
                      : st.kind() == StepKind::Builtin ? str(st.method(), "builtin")
                      : st.kind() == StepKind::Reshard ? "reshard " + str(role(st.role()).name())
                                                       : "check " + setup_.rows->callName(st.checks());
  trace_.span(label + suffix,
              st.kind() == StepKind::Reshard || st.kind() == StepKind::CheckAllGather
                  ? TraceRecorder::kCommunication
                  : TraceRecorder::kCompute,
              tc);
}

/// A Compute step: its call, run by the method runner.
void IterationRunner::runCompute(PhaseRt &ph, int s, int64_t it, StreamOut *stream,
                                 std::optional<Span> chunk) {
  const Step &st = step(s);
  const std::string method = str(st.method());
  auto rit = roles_.find(st.role());
  if (rit == roles_.end())
    throw RunError("this rank is scheduled for the step but is not one of role " +
                   str(role(st.role()).name()) + "'s ranks");
  MethodRunner::Fn fn = MethodRunner::find(method);
  if (!fn) // the plan loader refuses such a plan; a defence in depth
    throw RunError("method '" + method + "' is not supported by this runtime");
  MethodCall c{ph,
               s,
               it,
               rit->second,
               role(st.role()),
               *st.args(),
               *role(st.role()).options(),
               ints(st.inputs()),
               ints(st.outputs()),
               setup_.rows->isLeader(s, j_.rank),
               chunk,
               stream};
  methods_.run(fn, c);
}


void IterationRunner::runAhead(PhaseRt &ph) {
  progress_.iter = 0;
  vals_.clear();
  record_.digests.clear();
  record_.sums.emplace();
  // The first L rollouts (as many as the phase has iterations): one
  // reshard, then each from the next prompts with its iteration's seed.
  const int64_t made = std::min<int64_t>(ph.offPolicy, ph.iterations);
  progress_.plannedSteps += setup_.rows->plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep}) +
                            (made - 1) * setup_.rows->plannedOf({ph.genStep, ph.genCheckStep});
  auto t0 = Clock::now();
  inAhead_ = true;
  for (int64_t k = 0; k < made; ++k) {
    const std::vector<int64_t> ids = nextPrompts(ph);
    for (int v : ints(step(ph.genStep).inputs()))
      if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
        makePrompts(ph, ids, vals_[v]);
    if (k == 0)
      drawLeads(ph);
    for (int s : {ph.reshardStep, ph.genStep, ph.genCheckStep}) {
      if (s < 0 || !setup_.mySteps.count(s) || (k > 0 && s == ph.reshardStep))
        continue;
      progress_.step = s;
      runStep(ph, s, k, " (ahead)");
    }
    progress_.step = -1;
    ph.leads.reset();
    if (auto v = vals_.find(ph.rolloutValue); v != vals_.end()) {
      ph.carry.push_back(std::move(v->second));
      vals_.erase(v);
    }
  }
  inAhead_ = false;
  vals_.clear();
  if (ph.offPolicy >= 2)
    postCarried(ph);
  log_.clearBar();
  if (j_.rank == 0 && !o_.quiet) {
    if (ph.offPolicy >= 2)
      std::printf("[%s] off_policy %d: the first %s made ahead in %.0f ms; from now on each "
                  "rollout is generated two iterations before the one that trains on it, one "
                  "queued between them\n",
                  ph.name.c_str(), ph.offPolicy,
                  made == 1 ? "rollout (the phase's only one)"
                            : (std::to_string(made) + " rollouts").c_str(),
                  msSince(t0));
    else
      std::printf("[%s] off_policy %d: the first rollout made ahead in %.0f ms; from now on "
                  "each rollout is generated while the iteration before trains\n",
                  ph.name.c_str(), ph.offPolicy, msSince(t0));
  }
}

/// The queue (off_policy 2), on a generation rank: posts the rows of the
/// rollouts in `carry` not yet posted to the ranks that train on them, in
/// the plan's order of early transfers (the training ranks take them in
/// that order, rollout after rollout).
void IterationRunner::postCarried(PhaseRt &ph) {
  for (; ph.carryPosted < ph.carry.size(); ++ph.carryPosted) {
    PhaseRt::PostedRows out;
    for (const Xfer &x : ph.xfers)
      if (x.early && x.src == j_.rank) {
        at::Tensor buf = packRows(ph.carry[ph.carryPosted], ph.widths(), x.lo, x.hi);
        out.ops.push_back(comms_.queueRows->isend(buf, x.dst, kQueuedRowsTag));
        out.bufs.push_back(std::move(buf));
      }
    if (!out.ops.empty())
      ph.posted.push_back(std::move(out));
  }
}

/// The queue, on a training rank: this iteration's rollout rows, as the
/// generation ranks posted them when they made it (waiting only when its
/// generation has not ended yet).
void IterationRunner::receiveCarried(PhaseRt &ph) {
  for (const Xfer &x : ph.xfers) {
    if (!x.early || x.dst != j_.rank)
      continue;
    const BatchKind k = p_.values()->Get(x.value)->kind();
    at::Tensor buf =
        at::empty({packedBytes(k, ph.widths(), x.hi - x.lo)}, models::onEngine(at::kByte));
    auto tw = Clock::now();
    comms_.queueRows->recvAny(buf, {x.src}, kQueuedRowsTag);
    trace_.span("rows of the queued rollout", TraceRecorder::kCommunication, tw);
    auto it = vals_.find(x.value);
    if (it == vals_.end())
      it = vals_.emplace(x.value, makeVal(k, setup_.rows->rowsOfValue(ph, x.value), ph.widths()))
               .first;
    unpackRows(it->second, ph.widths(), x.lo, x.hi, buf);
  }
}

/// The queue: waits for the oldest posted rows until at most `keep` are
/// in flight (their receivers took them; their buffers go).
void IterationRunner::settlePosted(PhaseRt &ph, size_t keep) {
  while (ph.posted.size() > keep) {
    for (auto &op : ph.posted.front().ops)
      op->wait();
    ph.posted.pop_front();
  }
}

void IterationRunner::endPhase(PhaseRt &ph) {
  if (ph.offPolicy < 2)
    return;
  progress_.activity = "settling the queue's last messages";
  settlePosted(ph, 0);
  resharder_.settle();
  report_.flushLate();
  progress_.activity.clear();
}

} // namespace hflow::exec
