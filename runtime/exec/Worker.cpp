//===- Worker.cpp - one rank of a training job ----------------------------===//
//
// See Worker.h and docs/runtime.md. This file holds the rank's setup (what
// can fail without talking to anyone, then the rendezvous and communicators)
// and the phase loop: every train phase, iteration after iteration (each one
// IterationRunner's), then the run's totals; and the failure path.
// WorkerState.h says where the rest lives.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/WorkerState.h"
#include "runtime/models/Device.h"

#include "runtime/comm/NcclBackend.h"
#include "runtime/exec/Connect.h"
#include "runtime/exec/Worker.h"
#include "runtime/models/Checkpoint.h"
#include "runtime/models/AttentionPaths.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Packing.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/Safetensors.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace hflow::exec {

using namespace hflow::plan;
using comm::CommError;
using comm::RendezvousError;

namespace {

/// Where the rank was: the step, else what it was doing between steps (a
/// checkpoint, an evaluation, an export), in its phase and iteration.
std::string whereIs(const RankState &st) {
  if (st.progress.step >= 0)
    return describeStep(*st.setup.rows, st.progress, st.progress.step) + ": ";
  if (st.progress.activity.empty())
    return std::string();
  return (st.progress.iter >= 0 && !st.progress.phase.empty()
              ? st.progress.phase + " iteration " + std::to_string(st.progress.iter + 1) + ": "
              : std::string()) +
         st.progress.activity + ": ";
}

/// Where the rank was, then `what` after `also`: said once where `what`
/// begins with it already (a step's own errors name the step).
std::string located(const RankState &st, const std::string &what,
                    const std::string &also = std::string()) {
  const std::string where = whereIs(st);
  const bool said = what.compare(0, where.size(), where) == 0;
  return where + also + (said ? what.substr(where.size()) : what);
}

/// Which peer is gone when a collective broke: the ranks whose heartbeat
/// stopped (" [rank 3 stopped responding]"), or "".
std::string silentPeers(const Comms &comms) {
  std::string why;
  if (comms.rendezvous) {
    auto silent = comms.rendezvous->silentRanks(std::chrono::milliseconds(1200));
    for (size_t i = 0; i < silent.size(); ++i)
      why += (i ? ", " : "") + std::to_string(silent[i]);
    if (comms.rendezvous->storeUnresponsive())
      why = " [rank 0 stopped responding: the rendezvous store it hosts does not answer]";
    else if (!why.empty())
      why = " [rank" + std::string(silent.size() > 1 ? "s " : " ") + why +
            " stopped responding]";
  }
  return why;
}

} // namespace

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
  try { // the engine's settings from the environment, before any work
    models::decodeStepsFromEnvironment();
    models::checkAttentionEnvironment();
    models::checkPackingEnvironment();
    models::checkOptimizerEnvironment(o_.device == "cuda" ? c10::Device(c10::kCUDA)
                                                          : c10::Device(c10::kCPU));
  } catch (const std::exception &e) {
    throw RunError(e.what());
  }
  Preflight pre = preflight();
  pre.readTokenizer();
  pre.readRules();
  pre.readPhases();
  pre.readHeldOut();
  // Checkpoints: the command line wins over the train block.
  {
    std::vector<Checkpointer::BlockSettings> blocks;
    for (auto &ph : st_.setup.phases)
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
  parts_.builder.build();
}

Preflight Worker::preflight() {
  return Preflight({cx(), st_.setup, parts_.resharder, ck_, outputs_,
                    [this](std::string w) { preparing(std::move(w)); }});
}

void Worker::connect() {
  st_.comms.rendezvous = joinJob(j_, lp_.fileHash(), preflight().agreedFacts());
  st_.comms.rendezvous->startHeartbeat();
  st_.comms.world = createWorld(*st_.comms.rendezvous, j_, o_.comm);

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
        st_.comms.byGroup[(int)g] = st_.comms.world.get();
        continue;
      }
      std::string name = "g" + std::to_string(g) + "-" + str(grp->name());
      st_.comms.groups[(int)g] = st_.comms.world->makeSubgroup(name, rs);
      st_.comms.byGroup[(int)g] = st_.comms.groups[(int)g].get();
    }
  // The queue's two streams (Comms::queueRows), on every rank in this order.
  bool queued = false;
  for (size_t i = 0; p_.phases() && i < p_.phases()->size(); ++i)
    queued = queued || p_.phases()->Get(i)->off_policy() >= 2;
  if (queued) {
    std::vector<int> all;
    for (int r = 0; r < j_.worldSize; ++r)
      all.push_back(r);
    st_.comms.queueRows = st_.comms.world->makeSubgroup("queue-rows", all);
    st_.comms.lateRows = st_.comms.world->makeSubgroup("queue-metrics", all);
  }
  parts_.builder.connect();
}

void Worker::runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter) {
  st_.progress.phase = ph.name;
  log_.startPhase(firstIter);
  if (firstIter == 0)
    parts_.evaluator.syncReference(phaseIndex);
  // The schedule's staleness, as the plan states it (a declared bound, or
  // an asynchronous phase's).
  if (j_.rank == 0 && !o_.quiet && ph.stalenessBound >= 0 &&
      (ph.staleness >= 0 || ph.offPolicy > 0)) {
    log_.clearBar();
    const std::string partial =
        ph.partialHorizon > 0
            ? "; partial rollouts: a response may span " + std::to_string(ph.partialHorizon) +
                  " weight sync" + (ph.partialHorizon == 1 ? "" : "s")
            : std::string();
    std::printf("[%s] staleness bound %d: a token trains at most %d policy version%s after the "
                "weights that sampled it (%s; the rollout %s%s)\n",
                ph.name.c_str(), ph.stalenessBound, ph.stalenessBound,
                ph.stalenessBound == 1 ? "" : "s",
                ph.staleness >= 0 ? ("declared " + std::to_string(ph.staleness)).c_str()
                                  : "none declared",
                ph.offPolicy >= 2   ? "two iterations ahead"
                : ph.offPolicy > 0 ? "one iteration ahead"
                                   : "synchronous",
                partial.c_str());
  }
  if (ph.offPolicy > 0 && firstIter == 0)
    parts_.iteration.runAhead(ph);
  for (int64_t it = firstIter; it < ph.iterations; ++it)
    parts_.iteration.run(ph, it);
  parts_.iteration.endPhase(ph);
  // Partial rollouts: the sequences still in flight end with their phase
  // (nothing trains on them; later checkpoints need not hold them).
  if (ph.partialHorizon > 0)
    for (auto &[r, rr] : st_.roles)
      rr.sessions.erase(ph.genStep);
  st_.progress.iter = -1;
}

void Worker::finish() {
  // Every rank ran its whole schedule, every iteration: the world sum must
  // match the plan.
  const int64_t planned = st_.progress.plannedSteps;
  // What each rank holds per role, measured before an export builds whole
  // copies: four figures per plan role (zeros for roles not on this rank).
  const int nRoles = p_.roles() ? (int)p_.roles()->size() : 0;
  constexpr int F = kMemoryFigures;
  std::vector<double> held(F * (size_t)nRoles, 0.0);
  for (int r = 0; r < nRoles; ++r) // a role not on this rank ran nothing here
    held[F * (size_t)r + 4] = held[F * (size_t)r + 5] = -1;
  for (auto &[r, rr] : st_.roles) {
    const std::array<double, F> m = heldMemory(rr);
    for (int k = 0; k < F; ++k)
      held[F * (size_t)r + k] = m[k];
  }
  st_.progress.activity = "exporting (--export-hf)";
  if (!st_.setup.exports.empty())
    parts_.state.exportRoles();
  st_.progress.activity = "writing the trace (--trace)";
  if (trace_.enabled())
    trace_.write(*st_.comms.world, j_.rank, p_.world_size(), o_.quiet);
  st_.progress.activity = "checking the run's totals";
  at::Tensor n = at::full({1}, (int64_t)st_.progress.stepsRun, models::onEngine(at::kLong));
  st_.comms.world->allReduceSum(n);
  n = n.cpu();
  if (n.item<int64_t>() != planned)
    throw RunError("the ranks ran " + std::to_string(n.item<int64_t>()) +
                   " steps in total but the plan schedules " + std::to_string(planned));
  const comm::CommStats cs = st_.comms.stats();
  std::vector<double> mineV = {(double)st_.progress.stepsRun, (double)cs.bytesSent,
                               (double)cs.bytesReceived};
  mineV.insert(mineV.end(), held.begin(), held.end());
  at::Tensor mine = at::tensor(mineV, at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = st_.comms.world->allGatherFlat(mine.to(models::engineDevice())).cpu();
  st_.comms.world->barrier();
  log_.clearBar();
  if (j_.rank == 0 && !o_.quiet)
    parts_.report.printSummary(all);
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
    return fail(who + located(st_, e.what()), false);
  } catch (const CommError &e) {
    const std::string why = silentPeers(st_.comms);
    const int code = fail(who + located(st_, e.what()) + why, true);
    if (st_.comms.rendezvous && st_.comms.rendezvous->storeUnresponsive())
      std::_Exit(code); // threads blocked on the frozen store would never join
    return code;
  } catch (const std::bad_alloc &) {
    return fail(who + whereIs(st_) + "ran out of memory (the allocator refused a request)", false);
  } catch (const std::exception &e) {
    const std::string what = comm::oneLineError(e);
    return fail(who + located(st_, what, isOutOfMemory(what) ? "ran out of memory: " : ""),
                false);
  }
  if (std::string err = outputs_.publishMetrics(); !err.empty())
    return fail(who + "--metrics: " + err, false);
  return 0;
}

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

void Worker::work() {
  if (j_.rank == envInt("HFLOW_TEST_CRASH_RANK", -1))
    std::abort(); // fault injection for tests: a worker that dies
  if (j_.rank == envInt("HFLOW_TEST_HANG_RANK", -1))
    std::this_thread::sleep_for(std::chrono::hours(1)); // ... or hangs
  if (!o_.traceFile.empty())
    st_.comms.world->barrier(); // one time origin for every rank's trace
  st_.progress.start = Clock::now();
  trace_.setOrigin(st_.progress.start);
  if (o_.resume)
    parts_.state.load();
  if (j_.rank == 0) {
    // A resumed run keeps the earlier run's rows before its resume point.
    ResumePoint at;
    for (const PhaseRt &ph : st_.setup.phases)
      at.phases.push_back(ph.name);
    at.phase = ck_.resumePhase();
    at.iteration = ck_.resumeIteration();
    log_.openMetrics(o_.resume ? &at : nullptr);
  }
  if ((st_.setup.heldOut.eval || st_.setup.heldOut.pairs) && !o_.resume) {
    // Before any training: the starting point of the curve.
    st_.record.sums.emplace();
    st_.record.stepMs.assign(2 * st_.setup.phases[0].count, 0.0);
    parts_.evaluator.evaluate("start", -1);
    PhaseRt &ph0 = st_.setup.phases[0];
    std::string keep = ph0.name;
    ph0.name = "start";
    parts_.report.gather(ph0, -1, 0, true);
    ph0.name = keep;
  }
  const size_t from = o_.resume ? ck_.resumePhase() : 0;
  for (size_t i = from; i < st_.setup.phases.size(); ++i)
    runPhase(st_.setup.phases[i], (int)i, o_.resume && i == from ? ck_.resumeIteration() : 0);
  finish();
  st_.progress.activity = "writing the report (--report)";
  if (j_.rank == 0)
    log_.writeReport("hflow run: " + str(p_.program(), "?"),
                     "hflow-run, plan " + comm::hashHex(lp_.fileHash()) +
                         (o_.metricsFile.empty() ? std::string() : ", " + o_.metricsFile));
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
