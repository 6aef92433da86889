//===- Launcher.h - command line, join detection, local process launch ------===//
//
// `hflow-run plan.bin` either
//   - joins a job started by someone else (torchrun, Slurm srun, mpirun: the
//     rank and world size come from the environment) and runs that one rank,
//   - or, with no such environment, launches the plan's world size as local
//     child processes of the same binary (the embedded default), supervises
//     them and reports the first one that fails.
// The local children are ordinary joiners: the parent sets RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT and HFLOW_LOCAL_CHILD=1 for them.
//
// No LibTorch here: the parent of a local run never touches ATen.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_LAUNCH_LAUNCHER_H
#define HFLOW_RUNTIME_LAUNCH_LAUNCHER_H

#include "runtime/exec/RunOptions.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hflow::launch {

struct Options {
  std::string planPath;
  std::string masterAddr; ///< empty: not given on the command line
  int masterPort = -1;    ///< -1: not given on the command line
  double timeoutSeconds = 60.0;
  bool dryRun = false;     ///< print each rank's schedule, run nothing
  bool help = false;
  bool version = false;
  /// --calibrate FILE: measure this machine on 2 local processes and write
  /// the cost model's calibration file (runtime/exec/Calibrate.h) instead
  /// of running the plan.
  std::string calibrateOut;
  /// --calibrate-from: fit --calibrate's file from a finished run's metrics.
  std::string calibrateFrom;
  /// What the run does: the runtime's own options, bound to flags here
  /// (docs/runtime.md).
  exec::RunOptions run;
};

/// Parses argv[1..]. Returns false with a one-line `error` for usage errors
/// (unknown flag, missing or extra plan argument, bad number). --help and
/// --version set their flag and need no plan argument.
bool parseArgs(const std::vector<std::string> &args, Options &out,
               std::string &error);

/// The --help text (every flag and environment variable).
std::string usage();

/// Where this process's rank comes from.
enum class JoinSource { None, LocalChild, Torchrun, Slurm, OpenMPI };
const char *joinSourceName(JoinSource s);

struct JoinInfo {
  JoinSource source = JoinSource::None;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  /// Ranks of the job on this node (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE,
  /// OMPI_COMM_WORLD_LOCAL_SIZE); 0 when the launcher does not say.
  int localWorldSize = 0;
  /// --device cuda: this rank's CUDA device (placeOnGpu), else -1.
  int cudaDevice = -1;
  std::string masterAddr;
  int masterPort = 0;
};

using GetEnv = std::function<const char *(const char *)>;
/// The process environment (std::getenv).
GetEnv processEnv();

/// Detects join mode from the environment:
///   HFLOW_LOCAL_CHILD=1           a child of a local run (RANK, WORLD_SIZE, ...)
///   RANK + WORLD_SIZE             torchrun (LOCAL_RANK optional)
///   SLURM_PROCID + SLURM_NTASKS   srun, when SLURM_STEP_ID is set and a
///                                 master address is known (LOCAL_RANK from
///                                 SLURM_LOCALID)
///   OMPI_COMM_WORLD_RANK + _SIZE  mpirun, when a master address is known
/// --master-addr/--master-port override MASTER_ADDR/MASTER_PORT. Returns
/// false with a one-line error when the environment is inconsistent (e.g.
/// RANK without MASTER_ADDR, RANK >= WORLD_SIZE, non-numeric values);
/// `out.source` stays None when there is nothing to join (local mode).
bool detectJoin(const GetEnv &env, const Options &opts, JoinInfo &out,
                std::string &error);

/// The CUDA device of one rank and the NCCL settings it needs.
struct GpuPlacement {
  int ordinal = 0; ///< among the devices this process sees
  bool shared = false;
  /// --share-gpus: NCCL_HOSTID (this rank's own), then loopback sockets with
  /// P2P, SHM and InfiniBand off: (name, value, overwrite an existing value).
  struct Var {
    std::string name, value;
    bool overwrite;
  };
  std::vector<Var> ncclEnv;
};

/// Places global rank `rank`, local rank `localRank` of the `localRanks`
/// ranks on this node (0: unknown), on a node showing `gpus` CUDA devices
/// (`visible`: the value of CUDA_VISIBLE_DEVICES, nullptr when unset): one
/// device per rank, the local rank's. More ranks than devices is refused
/// with the counts, unless `share` (--share-gpus, for tests): local rank r
/// then uses device r mod gpus and NCCL treats every rank as its own host,
/// so ranks sharing a GPU talk over sockets on loopback. Returns false with
/// a one-line `error`.
bool placeOnGpu(int rank, int localRank, int localRanks, int gpus, bool share,
                const char *visible, GpuPlacement &out, std::string &error);

/// How this rank joins its job: the join detected, the --timeout, and hflow's
/// `version` (checked at rendezvous).
exec::JoinOptions joinOptions(const JoinInfo &join, const Options &opts,
                              const std::string &version);

/// True when `port` cannot be bound for listening on `addr` (checked with
/// SO_REUSEADDR, like c10d's TCPStore server).
bool portInUse(const std::string &addr, int port);
/// The kernel's ephemeral port range (net.ipv4.ip_local_port_range), or
/// {0, 0} when it cannot be read.
std::pair<int, int> ephemeralPortRange();
/// The lowest port pickFreePort chooses.
inline constexpr int kLowestPickedPort = 10000;
/// A port free on `addr` (and on the wildcard address), or -1: a random one
/// in the 8192 ports below the kernel's ephemeral range, which no socket's
/// connect() or bind(0) is given while the job starts; where that range
/// starts too low to leave room, one the kernel chooses (bind to port 0).
int pickFreePort(const std::string &addr);

/// Local mode: spawns `worldSize` children running /proc/self/exe with
/// `argv` (the full original command line) and the rank environment, waits
/// for them and returns the process exit code: 0 when all exit 0; 1 when one
/// fails (it is reported on stderr, the others get SIGTERM, then SIGKILL
/// after 5 s). The port must already be chosen.
int runLocal(int worldSize, const std::string &masterAddr, int masterPort,
             const std::vector<std::string> &argv);

} // namespace hflow::launch

#endif // HFLOW_RUNTIME_LAUNCH_LAUNCHER_H
