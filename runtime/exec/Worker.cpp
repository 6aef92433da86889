//===- Worker.cpp - one rank of a training job ----------------------------===//
//
// See Worker.h and docs/runtime.md. This file holds the rank's setup (what
// can fail without talking to anyone, then the rendezvous and communicators)
// and the phase loop: every rank walks the plan's steps in their global order,
// iteration after iteration of each train phase; before a step it sends and
// receives the batch rows the step's ranks need (RowSchedule), then runs the
// step if it is in its own schedule. WorkerState.h says where the rest lives.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/WorkerState.h"
#include "runtime/models/Device.h"

#include "runtime/comm/NcclBackend.h"
#include "runtime/exec/Connect.h"
#include "runtime/exec/Worker.h"
#include "runtime/models/Checkpoint.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Safetensors.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace hflow::exec {

using namespace hflow::plan;
using comm::CommError;
using comm::RendezvousError;

/// Everything that can fail without talking to anyone: data files,
/// tokenizer, reward rule, models. Runs before the rendezvous, so a bad
/// input stops the job before any work.
void Worker::prepare() {
  preparing("checking the command line");
  if (!o_.dataDir.empty()) {
    struct stat st;
    if (::stat(o_.dataDir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw RunError("--data-dir '" + o_.dataDir + "' is not a directory");
  }
  Preflight pre = preflight();
  pre.readTokenizer();
  pre.readRules();
  pre.readPhases();
  pre.readHeldOut();
  // Checkpoints: the command line wins over the train block.
  {
    std::vector<Checkpointer::BlockSettings> blocks;
    for (auto &ph : setup_.phases)
      if (ph.ph)
        blocks.push_back({ph.ph->checkpoint_dir() ? str(ph.ph->checkpoint_dir()) : std::string(),
                          ph.ph->checkpoint_every()});
    ck_.configure(o_, blocks, j_.rank);
  }
  pre.checkExports();
  if (j_.rank == 0) {
    // Every output checked, locked and its folder claimed before any work;
    // the other ranks write only inside what rank 0 claimed.
    preparing("checking and locking the outputs");
    pre.claimOutputs();
    log_.open();
    if (ck_.saves()) {
      try {
        models::checkWritable(ck_.rankDir());
      } catch (const std::exception &e) {
        throw RunError(e.what());
      }
    }
  }
  builder_.build();
}

Preflight Worker::preflight() {
  return Preflight({cx(), setup_, resharder_, ck_, outputs_,
                    [this](std::string w) { preparing(std::move(w)); }});
}

void Worker::connect() {
  comms_.rendezvous = joinJob(j_, lp_.fileHash(), preflight().agreedFacts());
  comms_.rendezvous->startHeartbeat();
  comms_.world = createWorld(*comms_.rendezvous, j_, o_.comm);

  // Every group this rank belongs to, in plan order (the same order on every
  // member, so group creation cannot deadlock). A group of the whole world
  // reuses the world communicator.
  if (p_.groups())
    for (size_t g = 0; g < p_.groups()->size(); ++g) {
      const Group *grp = p_.groups()->Get(g);
      auto rs = ints(grp->ranks());
      if (std::find(rs.begin(), rs.end(), j_.rank) == rs.end())
        continue;
      if ((int)rs.size() == j_.worldSize) {
        comms_.byGroup[(int)g] = comms_.world.get();
        continue;
      }
      std::string name = "g" + std::to_string(g) + "-" + str(grp->name());
      comms_.groups[(int)g] = comms_.world->makeSubgroup(name, rs);
      comms_.byGroup[(int)g] = comms_.groups[(int)g].get();
    }
  builder_.connect();
}


void Worker::makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out) {
  const int64_t B = (int64_t)ids.size(), P = ph.P;
  out = makeVal(BatchKind::Prompts, B, P, ph.R, /*host=*/true); // filled here, then moved
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
void Worker::moveRows(PhaseRt &ph, int s, bool early) {
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  std::vector<const Xfer *> received;
  for (const Xfer &x : ph.xfers) {
    if (x.early != early || (!early && x.before != s))
      continue;
    if (x.src == j_.rank) {
      auto it = vals_.find(x.value);
      if (it == vals_.end())
        throw RunError(early ? ph.name + ": this rank should send rows of the rollout made one "
                                         "iteration ahead, but has none"
                             : describe(s) + ": this rank should send rows of a value it does "
                                             "not have");
      sends.emplace_back(x.dst, packRows(it->second, ph.P, ph.R, x.lo, x.hi));
    } else if (x.dst == j_.rank) {
      BatchKind k = p_.values()->Get(x.value)->kind();
      recvs.emplace_back(x.src, at::empty({packedBytes(k, ph.P, ph.R, x.hi - x.lo)},
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
      it = vals_.emplace(x.value, makeVal(k, setup_.rows->rowsOfValue(ph, x.value), ph.P, ph.R)).first;
    unpackRows(it->second, ph.P, ph.R, x.lo, x.hi, recvs[i].second);
  }
}


void Worker::runIteration(PhaseRt &ph, int64_t it) {
  progress_.iter = it;
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
  // off_policy: the rollout this iteration trains on was made the
  // iteration before (or by runRolloutAhead); the generate step makes the
  // next iteration's from the next prompts, with the weights the reshard
  // brings now (one update behind), while the rest of the flow trains. The
  // last iteration makes none.
  const bool ahead = ph.offPolicy > 0;
  const bool makeNext = !ahead || it + 1 < ph.iterations;
  if (ahead) {
    progress_.activity = "sending the rollout made one iteration ahead";
    if (ph.carry) {
      vals_[ph.rolloutValue] = std::move(*ph.carry);
      ph.carry.reset();
    }
    // Its rows leave the generation ranks at once: the training ranks need
    // them while this rank generates the next rollout.
    moveRows(ph, -1, /*early=*/true);
    if (!makeNext)
      progress_.plannedSteps -= setup_.rows->plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep});
  }
  if (makeNext) {
    const std::vector<int64_t> ids = nextPrompts(ph);
    for (int s = ph.first; s < ph.first + ph.count; ++s)
      for (int v : ints(step(s).inputs()))
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts && !vals_.count(v))
          makePrompts(ph, ids, vals_[v]);
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
      record_.stepMs[ph.count + s - ph.first] = msSince(tm);
    auto ts = Clock::now();
    if (setup_.mySteps.count(s)) {
      if (ahead && s == ph.genStep) {
        // The next iteration's rollout; this one's stays in place.
        std::optional<Val> current;
        if (auto v = vals_.find(ph.rolloutValue); v != vals_.end()) {
          current = std::move(v->second);
          vals_.erase(v);
        }
        runStep(ph, s, it + 1, " (ahead)");
        ph.carry = std::move(vals_.at(ph.rolloutValue));
        vals_.erase(ph.rolloutValue);
        if (current)
          vals_[ph.rolloutValue] = std::move(*current);
      } else {
        runStep(ph, s, it, "");
      }
      log_.clearBar();
      if (o_.verbose)
        std::printf("[rank %d] %s: %.1f ms\n", j_.rank, describe(s).c_str(), msSince(ts));
    }
    if (o_.serialize)
      comms_.world->barrier();
    record_.stepMs[s - ph.first] = msSince(ts);
  }
  progress_.step = -1;
  const bool evals = setup_.heldOut.eval || setup_.heldOut.pairs;
  bool evalNow = evals && o_.evalEvery > 0 && (it + 1) % o_.evalEvery == 0;
  bool lastIt = it + 1 == ph.iterations;
  if (evals && lastIt)
    evalNow = true;
  progress_.activity = "evaluating on the held-out prompts";
  if (evalNow)
    evaluator_.evaluate(ph.name, it);
  progress_.activity = "gathering the iteration's metrics";
  report_.gather(ph, it, msSince(t0), evalNow);
  ++progress_.globalIter;
  if (j_.rank == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION_RANK", -1) &&
      progress_.globalIter == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION", -1))
    std::abort(); // fault injection for tests: a worker dies mid-run
  progress_.activity = "saving checkpoint " + std::to_string(progress_.globalIter) + " in '" + ck_.dir() + "'";
  if (ck_.due(progress_.globalIter))
    state_.save();
  progress_.activity.clear();
}

/// The next batch of prompt indices: the same on every rank (seeded sampler).
std::vector<int64_t> Worker::nextPrompts(PhaseRt &ph) {
  if (ph.sampler)
    return ph.sampler->next((size_t)ph.batch);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < ph.batch; ++i)
    ids.push_back(i);
  return ids;
}

/// Runs step `s` of this rank's schedule (its rows already moved), with
/// iteration `it`'s sampling seed, and traces it (`suffix` after the name).
void Worker::runStep(PhaseRt &ph, int s, int64_t it, const char *suffix) {
  const Step &st = step(s);
  auto tc = Clock::now();
  switch (st.kind()) {
  case StepKind::Compute:
    runCompute(ph, s, it);
    break;
  case StepKind::Builtin:
    controller_.runBuiltin(ph, s);
    break;
  case StepKind::Reshard:
    record_.digests[s] = resharder_.run(*p_.reshards()->Get(st.reshard()), roles_,
                                        record_.sums ? &*record_.sums : nullptr);
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
void Worker::runCompute(PhaseRt &ph, int s, int64_t it) {
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
               setup_.rows->isLeader(s, j_.rank)};
  methods_.run(fn, c);
}


/// off_policy: the first rollout of a phase, before its first iteration:
/// the reshard, the generate step and its check, on the first prompts.
void Worker::runRolloutAhead(PhaseRt &ph) {
  progress_.iter = 0;
  vals_.clear();
  record_.digests.clear();
  record_.sums.emplace();
  progress_.plannedSteps += setup_.rows->plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep});
  const std::vector<int64_t> ids = nextPrompts(ph);
  for (int v : ints(step(ph.genStep).inputs()))
    if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
      makePrompts(ph, ids, vals_[v]);
  auto t0 = Clock::now();
  for (int s : {ph.reshardStep, ph.genStep, ph.genCheckStep}) {
    if (s < 0 || !setup_.mySteps.count(s))
      continue;
    progress_.step = s;
    runStep(ph, s, 0, " (ahead)");
  }
  progress_.step = -1;
  if (auto v = vals_.find(ph.rolloutValue); v != vals_.end())
    ph.carry = std::move(v->second);
  vals_.clear();
  log_.clearBar();
  if (j_.rank == 0 && !o_.quiet)
    std::printf("[%s] off_policy %d: the first rollout made ahead in %.0f ms; from now on "
                "each rollout is generated while the iteration before trains\n",
                ph.name.c_str(), ph.offPolicy, msSince(t0));
}


void Worker::runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter) {
  progress_.phase = ph.name;
  log_.startPhase(firstIter);
  if (firstIter == 0)
    evaluator_.syncReference(phaseIndex);
  if (ph.offPolicy > 0 && firstIter == 0)
    runRolloutAhead(ph);
  for (int64_t it = firstIter; it < ph.iterations; ++it)
    runIteration(ph, it);
  progress_.iter = -1;
}


void Worker::finish() {
  // Every rank ran its whole schedule, every iteration: the world sum must
  // match the plan.
  const int64_t planned = progress_.plannedSteps;
  // What each rank holds per role, measured before an export builds whole
  // copies: four figures per plan role (zeros for roles not on this rank).
  const int nRoles = p_.roles() ? (int)p_.roles()->size() : 0;
  constexpr int F = kMemoryFigures;
  std::vector<double> held(F * (size_t)nRoles, 0.0);
  for (int r = 0; r < nRoles; ++r) // a role not on this rank ran nothing here
    held[F * (size_t)r + 4] = held[F * (size_t)r + 5] = -1;
  for (auto &[r, rr] : roles_) {
    const std::array<double, F> m = heldMemory(rr);
    for (int k = 0; k < F; ++k)
      held[F * (size_t)r + k] = m[k];
  }
  progress_.activity = "exporting (--export-hf)";
  if (!setup_.exports.empty())
    state_.exportRoles();
  progress_.activity = "writing the trace (--trace)";
  if (trace_.enabled())
    trace_.write(*comms_.world, j_.rank, p_.world_size(), o_.quiet);
  progress_.activity = "checking the run's totals";
  at::Tensor n = at::full({1}, (int64_t)progress_.stepsRun, models::onEngine(at::kLong));
  comms_.world->allReduceSum(n);
  n = n.cpu();
  if (n.item<int64_t>() != planned)
    throw RunError("the ranks ran " + std::to_string(n.item<int64_t>()) +
                   " steps in total but the plan schedules " + std::to_string(planned));
  comm::CommStats cs = comms_.world->stats();
  for (auto &[g, c] : comms_.groups)
    cs += c->stats();
  std::vector<double> mineV = {(double)progress_.stepsRun, (double)cs.bytesSent,
                               (double)cs.bytesReceived};
  mineV.insert(mineV.end(), held.begin(), held.end());
  at::Tensor mine = at::tensor(mineV, at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = comms_.world->allGatherFlat(mine.to(models::engineDevice())).cpu();
  comms_.world->barrier();
  log_.clearBar();
  if (j_.rank == 0 && !o_.quiet)
    report_.printSummary(all);
}


int Worker::run() {
  const std::string who = "rank " + std::to_string(j_.rank) + ": ";
  watchdog_ = std::make_unique<Watchdog>(j_.timeout, "rank " + std::to_string(j_.rank));
  try {
    prepare();
  } catch (const std::bad_alloc &) {
    return fail(who + "before starting: ran out of memory while " + watchdog_->current(),
                j_.rank != 0);
  } catch (const std::exception &e) {
    // Every rank finds the same problem: in a local run, let rank 0 say it.
    const std::string what = comm::oneLineError(e);
    if (isOutOfMemory(what))
      return fail(who + "before starting: ran out of memory while " + watchdog_->current() +
                      ": " + what,
                  j_.rank != 0);
    return fail(who + "before starting: " + e.what(), j_.rank != 0);
  }
  watchdog_->stop(); // the rendezvous and the collectives have --timeout
  try {
    connect();
  } catch (const RendezvousError &e) {
    return fail(e.what(), e.kind() != RendezvousError::Kind::Mismatch);
  } catch (const CommError &e) {
    return fail(who + "connecting: " + e.what(), true);
  } catch (const std::exception &e) {
    return fail(who + "connecting: " + comm::oneLineError(e), true);
  }
  try {
    work();
  } catch (const RunError &e) {
    return fail(who + where() + e.what(), false);
  } catch (const CommError &e) {
    const std::string why = silentPeers();
    const int code = fail(who + where() + e.what() + why, true);
    if (comms_.rendezvous && comms_.rendezvous->storeUnresponsive())
      std::_Exit(code); // threads blocked on the frozen store would never join
    return code;
  } catch (const std::bad_alloc &) {
    return fail(who + where() + "ran out of memory (the allocator refused a request)", false);
  } catch (const std::exception &e) {
    const std::string what = comm::oneLineError(e);
    return fail(who + where() + (isOutOfMemory(what) ? "ran out of memory: " : "") + what,
                false);
  }
  if (std::string err = outputs_.publishMetrics(); !err.empty())
    return fail(who + "--metrics: " + err, false);
  return 0;
}

/// Prints a rank's failure and publishes the metrics rows so far (the
/// failed run's record, and what --resume keeps); the exit code.
int Worker::fail(const std::string &msg, bool commFailure) {
  // A local child whose collective broke most likely lost a peer that
  // failed first: give the parent a moment to stop us, so the first
  // failure is the one the user reads.
  if (commFailure && j_.localChild)
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  std::fflush(stdout);
  std::fprintf(stderr, "hflow-run: error: %s\n", msg.c_str());
  // The rows so far are the failed run's record (and what --resume keeps).
  if (std::string err = outputs_.publishMetrics(); !err.empty())
    std::fprintf(stderr, "hflow-run: error: rank 0: --metrics: %s\n", err.c_str());
  std::fflush(stderr);
  return 1;
}

/// Where the rank was: the step, else what it was doing between steps (a
/// checkpoint, an evaluation, an export), in its phase and iteration.
std::string Worker::where() const {
  if (progress_.step >= 0)
    return describe(progress_.step) + ": ";
  if (progress_.activity.empty())
    return std::string();
  return (progress_.iter >= 0 && !progress_.phase.empty()
              ? progress_.phase + " iteration " + std::to_string(progress_.iter + 1) + ": "
              : std::string()) +
         progress_.activity + ": ";
}

/// The run itself, after the rendezvous: every phase, then the totals,
/// the summary and the report.
void Worker::work() {
  if (j_.rank == envInt("HFLOW_TEST_CRASH_RANK", -1))
    std::abort(); // fault injection for tests: a worker that dies
  if (j_.rank == envInt("HFLOW_TEST_HANG_RANK", -1))
    std::this_thread::sleep_for(std::chrono::hours(1)); // ... or hangs
  if (!o_.traceFile.empty())
    comms_.world->barrier(); // one time origin for every rank's trace
  progress_.start = Clock::now();
  trace_.setOrigin(progress_.start);
  if (o_.resume)
    state_.load();
  if (j_.rank == 0) {
    // A resumed run keeps the earlier run's rows before its resume point.
    ResumePoint at;
    for (const PhaseRt &ph : setup_.phases)
      at.phases.push_back(ph.name);
    at.phase = ck_.resumePhase();
    at.iteration = ck_.resumeIteration();
    log_.openMetrics(o_.resume ? &at : nullptr);
  }
  if ((setup_.heldOut.eval || setup_.heldOut.pairs) && !o_.resume) {
    // Before any training: the starting point of the curve.
    record_.sums.emplace();
    record_.stepMs.assign(2 * setup_.phases[0].count, 0.0);
    evaluator_.evaluate("start", -1);
    PhaseRt &ph0 = setup_.phases[0];
    std::string keep = ph0.name;
    ph0.name = "start";
    report_.gather(ph0, -1, 0, true);
    ph0.name = keep;
  }
  const size_t from = o_.resume ? ck_.resumePhase() : 0;
  for (size_t i = from; i < setup_.phases.size(); ++i)
    runPhase(setup_.phases[i], (int)i, o_.resume && i == from ? ck_.resumeIteration() : 0);
  finish();
  progress_.activity = "writing the report (--report)";
  if (j_.rank == 0)
    log_.writeReport("hflow run: " + str(p_.program(), "?"),
                     "hflow-run, plan " + comm::hashHex(lp_.fileHash()) +
                         (o_.metricsFile.empty() ? std::string() : ", " + o_.metricsFile));
}

/// Which peer is gone when a collective broke: the ranks whose heartbeat
/// stopped (" [rank 3 stopped responding]"), or "".
std::string Worker::silentPeers() const {
  std::string why;
  if (comms_.rendezvous) {
    auto silent = comms_.rendezvous->silentRanks(std::chrono::milliseconds(1200));
    for (size_t i = 0; i < silent.size(); ++i)
      why += (i ? ", " : "") + std::to_string(silent[i]);
    if (comms_.rendezvous->storeUnresponsive())
      why = " [rank 0 stopped responding: the rendezvous store it hosts does not answer]";
    else if (!why.empty())
      why = " [rank" + std::string(silent.size() > 1 ? "s " : " ") + why +
            " stopped responding]";
  }
  return why;
}

int runWorker(const LoadedPlan &plan, const JoinOptions &join, const RunOptions &run) {
  comm::setLibraryLogging(run.verbose);
  at::set_num_threads(threadCount());
  if (run.device == "cuda") {
    // The rank's GPU (launch::placeOnGpu: the local rank's, or shared).
    try {
      comm::bindCudaDevice(join.cudaDevice);
      models::setEngineDevice(c10::Device(c10::kCUDA, (c10::DeviceIndex)join.cudaDevice));
    } catch (const std::exception &e) {
      std::fprintf(stderr, "hflow-run: error: rank %d: %s\n", join.rank, e.what());
      return 1;
    }
  }
  models::MemoryMeter::install(); // before any weights: what each pass needs is measured
  Worker w(plan, join, run);
  return w.run();
}

} // namespace hflow::exec
