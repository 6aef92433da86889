//===- hflow-run - run a compiled hflow plan ------------------------------===//
//
// Local mode (no launcher environment): verify the plan, choose the master
// port, start the plan's world size as child processes of this binary and
// supervise them. --calibrate: the same with 2 children that measure this
// machine instead (runtime/exec/Calibrate.h). Join mode (torchrun/srun/mpirun environment, or a local
// child): run one rank. Exit status: 0 success, 2 usage or invalid plan,
// 1 runtime failure.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Calibrate.h"
#include "runtime/launch/Blas.h"
#include "runtime/launch/Launcher.h"
#include "runtime/schema/OutputFiles.h"
#include "runtime/schema/PlanFormat.h"
#include "runtime/exec/DryRun.h"
#include "runtime/plan/PlanLoader.h"
#include "runtime/exec/Worker.h"

#include "runtime/comm/NcclBackend.h"

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <unistd.h>
#include <string>
#include <vector>

#ifndef HFLOW_VERSION
#define HFLOW_VERSION "unknown"
#endif

namespace {

/// glibc returns freed memory to the system at once (blocks above the
/// dynamic mmap threshold are unmapped, the heap's top is trimmed), so a
/// worker that allocates and frees the same activations every pass pays a
/// page fault per page each time: measured 3-8% of the demo's run time in
/// system time, and half of the chat demo's (a 151,936-word head). hflow-run
/// keeps blocks below 32 MiB in the heap and up to 256 MiB of free heap
/// (bench/malloc_bench.sh). HFLOW_MALLOC=default keeps glibc's behaviour;
/// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ in the environment win.
void tuneHeap() {
  const char *mode = std::getenv("HFLOW_MALLOC");
  if (mode && std::string(mode) == "default")
    return;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_"))
    return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

int error(int code, const std::string &msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "hflow-run: error: %s\n", msg.c_str());
  return code;
}

/// The local rendezvous port: --master-port if free, else a free one.
/// Returns why not, or "".
std::string rendezvousPort(const hflow::launch::Options &o, const std::string &addr,
                           int &port) {
  using namespace hflow;
  port = o.masterPort;
  if (port > 0) {
    if (launch::portInUse(addr, port))
      return "--master-port " + std::to_string(port) + " is in use on " + addr +
             " (choose another or omit it)";
    return "";
  }
  port = launch::pickFreePort(addr);
  if (port < 0)
    return "cannot find a free port on " + addr + " for the rendezvous (is the address local?)";
  return "";
}

/// --calibrate: 2 local worker processes measure this machine; rank 0
/// writes the calibration file (runtime/exec/Calibrate.h).
int calibrate(const hflow::plan::LoadedPlan &lp, const hflow::launch::Options &o,
              const std::vector<std::string> &args, const char *argv0) {
  using namespace hflow;
  if (std::string problem = exec::calibrationPlanProblem(lp); !problem.empty())
    return error(2, "--calibrate: " + o.planPath + ": " + problem);
  std::string err;
  launch::JoinInfo join;
  if (!launch::detectJoin(launch::processEnv(), o, join, err))
    return error(2, err);
  if (join.source == launch::JoinSource::LocalChild)
    return exec::runCalibrationWorker(lp, launch::joinOptions(join, o, HFLOW_VERSION), o.run,
                                      o.calibrateOut);
  if (join.source != launch::JoinSource::None)
    return error(2, std::string("--calibrate measures this machine with its own ") +
                        std::to_string(exec::kCalibrationRanks) +
                        " local processes; it does not join a " +
                        launch::joinSourceName(join.source) + " job");
  // The file is written by rank 0 at the end: refuse a directory that cannot
  // take it before measuring anything.
  std::string dir = o.calibrateOut;
  size_t slash = dir.find_last_of('/');
  dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return error(2, "--calibrate: cannot write '" + o.calibrateOut + "': " +
                        std::strerror(errno));
  const std::string addr = o.masterAddr.empty() ? "127.0.0.1" : o.masterAddr;
  int port = 0;
  if (std::string why = rendezvousPort(o, addr, port); !why.empty())
    return error(1, why);
  std::vector<std::string> childArgv;
  childArgv.push_back(argv0);
  childArgv.insert(childArgv.end(), args.begin(), args.end());
  return launch::runLocal(exec::kCalibrationRanks, addr, port, childArgv);
}

} // namespace

int main(int argc, char **argv) {
  using namespace hflow;
  launch::chooseBlasKernels(argv); // may re-execute with OPENBLAS_CORETYPE set
  tuneHeap();
  // A peer that died closes its sockets; a send to it must fail as an error
  // naming the step and the dead rank (EPIPE), not kill this process with
  // SIGPIPE. Inherited by the workers the launcher starts.
  std::signal(SIGPIPE, SIG_IGN);
  // Past a file-size limit a write fails (EFBIG) and is reported, like a
  // full disk, instead of killing the process.
  outputs::ignoreFileSizeSignal();
  std::vector<std::string> args(argv + 1, argv + argc);
  launch::Options o;
  std::string err;
  if (!launch::parseArgs(args, o, err))
    return error(2, err + " (see 'hflow-run --help')");
  if (o.help) {
    std::fputs(launch::usage().c_str(), stdout);
    return 0;
  }
  if (o.version) {
    std::printf("hflow-run %s (plan format %u.%u", HFLOW_VERSION,
                plan::kFormatMajor, plan::kFormatMinor);
    if (comm::cudaLibTorch())
      std::printf("; gloo; %s, %d CUDA device%s", comm::ncclVersion().c_str(),
                  comm::cudaDevices(), comm::cudaDevices() == 1 ? "" : "s");
    else
      std::printf("; gloo; CPU-only LibTorch");
    const std::string core = launch::blasCoreName();
    if (!core.empty())
      std::printf("; OpenBLAS %s kernels%s", core.c_str(),
                  std::getenv("HFLOW_BLAS_CHOSEN")    ? ", chosen for this CPU"
                  : std::getenv("OPENBLAS_CORETYPE") ? ", from OPENBLAS_CORETYPE"
                                                      : "");
    std::printf(")\n");
    return 0;
  }

  plan::LoadedPlan lp;
  if (!plan::loadPlanFile(o.planPath, lp, err))
    return error(2, err);
  const int world = lp.plan()->world_size();
  if (!o.calibrateOut.empty()) {
    outputs::IoSet io;
    io.input("the plan", o.planPath);
    io.input("--calibrate-from's metrics file", o.calibrateFrom);
    io.outputFile("--calibrate", o.calibrateOut);
    if (std::string clash = io.check(); !clash.empty())
      return error(2, clash);
  }
  if (!o.calibrateFrom.empty())
    return exec::calibrateFromMetrics(lp, o.calibrateFrom, o.calibrateOut, o.run.quiet);
  if (!o.calibrateOut.empty())
    return calibrate(lp, o, args, argv[0]);
  if (o.dryRun) {
    exec::printDryRun(lp, stdout); // what the loader accepted executes
    return 0;
  }

  launch::JoinInfo join;
  if (!launch::detectJoin(launch::processEnv(), o, join, err))
    return error(2, err);

  if (o.run.device == "cuda") {
    if (!comm::cudaLibTorch())
      return error(2, "--device cuda: this hflow-run is built against a LibTorch without "
                      "CUDA (Debian's, CPU-only); build it against a PyTorch wheel's "
                      "(docs/building.md, 'A GPU node')");
    // One GPU per rank, the local rank's (CUDA_VISIBLE_DEVICES honoured);
    // --share-gpus lets ranks share them, for tests (launch::placeOnGpu).
    const int gpus = comm::cudaDevices();
    const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
    launch::GpuPlacement place;
    if (join.source == launch::JoinSource::None) {
      // Local mode: every rank of the plan on this machine.
      if (!launch::placeOnGpu(0, 0, world, gpus, o.run.shareGpus, visible, place, err))
        return error(1, "plan " + o.planPath + ": " + err);
      if (o.run.shareGpus && world > gpus && !o.run.quiet)
        std::fprintf(stderr,
                     "hflow-run: --share-gpus: %d ranks share %d GPU%s, NCCL carrying their "
                     "messages over sockets on loopback: a correctness test, not a speed\n",
                     world, gpus, gpus == 1 ? "" : "s");
    } else {
      if (!launch::placeOnGpu(join.rank, join.localRank, join.localWorldSize, gpus,
                              o.run.shareGpus, visible, place, err))
        return error(1, "rank " + std::to_string(join.rank) + ": " + err);
      for (const auto &v : place.ncclEnv)
        setenv(v.name.c_str(), v.value.c_str(), v.overwrite ? 1 : 0);
      join.cudaDevice = place.ordinal;
    }
  }

  if (join.source != launch::JoinSource::None) {
    if (join.worldSize != world)
      return error(2, std::string(launch::joinSourceName(join.source)) +
                          " join: WORLD_SIZE is " +
                          std::to_string(join.worldSize) + " but plan " +
                          o.planPath + " needs a world size of " +
                          std::to_string(world));
    return exec::runWorker(lp, launch::joinOptions(join, o, HFLOW_VERSION), o.run);
  }

  // Local mode.
  const std::string addr = o.masterAddr.empty() ? "127.0.0.1" : o.masterAddr;
  int port = 0;
  if (std::string why = rendezvousPort(o, addr, port); !why.empty())
    return error(1, why);
  std::vector<std::string> childArgv;
  childArgv.push_back(argv[0]);
  childArgv.insert(childArgv.end(), args.begin(), args.end());
  return launch::runLocal(world, addr, port, childArgv);
}
