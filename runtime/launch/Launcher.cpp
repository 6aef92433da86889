//===- Launcher.cpp - command line, join detection, local process launch ---===//
#include "runtime/launch/Launcher.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <netdb.h>
#include <netinet/in.h>
#include <random>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

namespace hflow::launch {

// --- command line --------------------------------------------------------

/// hflow-run --help: the text, as data (docs/runtime.md describes the options).
constexpr const char kUsage[] = R"(usage: hflow-run [options] PLAN.bin
       hflow-run --calibrate OUT.json PLAN.bin

Runs an execution plan compiled by hflowc. Without a launcher environment it
starts the plan's world size as local processes (one per rank) on this
machine; under torchrun, srun or mpirun it runs the one rank it is given.

options:
  --master-addr ADDR   address of rank 0's rendezvous store
                       (default: $MASTER_ADDR, or 127.0.0.1 in local mode)
  --master-port PORT   port of the rendezvous store (default: $MASTER_PORT;
                       in local mode a free port below the kernel's
                       ephemeral range is picked)
  --timeout SECONDS    bound on the rendezvous, on every collective and on
                       each phase of a rank's work before the rendezvous
                       (reading the tokenizer, rendering the prompts,
                       building a role) (default 60)
  --device cpu|cuda    where every tensor of a rank lives (default cpu; cuda:
                       the local rank's GPU, one per rank, CUDA_VISIBLE_DEVICES
                       honoured; needs hflow-run built against a CUDA LibTorch)
  --share-gpus         with --device cuda, let several ranks share a GPU
                       (rank r on GPU r mod the GPUs shown), NCCL carrying
                       their messages over sockets on loopback as if each
                       rank were a host of its own: for correctness tests on
                       a machine with fewer GPUs than ranks, never timings
  --comm gloo|nccl     communication backend (default: gloo on cpu, nccl on
                       cuda; Gloo moves CPU tensors, NCCL CUDA tensors)
  --data-dir DIR       read the program's relative data paths from DIR, and
                       only there (without it: the current directory, then
                       the program's own)
  --steps N            run at most N iterations of each train phase
  --eval FILE          held-out prompts (JSONL): greedy responses scored by the
                       program's RewardFn (a program with an environment:
                       greedy episodes scored by its rewards), before
                       training, every --eval-every iterations and at the
                       end of each phase
  --eval-every N       evaluate every N iterations (default: only at the start
                       and at the end of each phase)
  --eval-count N       use the first N held-out prompts (default: all)
  --eval-pairs FILE    held-out preference pairs (JSONL: prompt, chosen,
                       rejected): every reward model's accuracy (chosen
                       scored above rejected) at the same times as --eval
  --metrics FILE       write one JSON line of metrics per iteration (rank 0;
                       FILE.partial while the run goes, renamed to FILE at
                       the end or when it fails)
  --tensorboard DIR    write the same metrics as TensorBoard event files in
                       DIR (rank 0; tags phase/metric, step = iteration
                       counted over all phases); DIR must hold no event file
                       unless --resume continues the run that wrote them (or
                       --overwrite replaces them)
  --report FILE        at the end, the run's metrics as one self-contained
                       HTML page with charts (what hflow-report draws from
                       --metrics' file; rank 0; this run's iterations)
  --tokenizer SPEC     "byte" (one token per byte, newline ends a response),
                       a Hugging Face tokenizer.json, a SentencePiece .model
                       file, or a model directory holding either (default:
                       the actor's hf("dir") when it holds one, else "byte")
  --log-every N        print a progress line every N iterations (default:
                       about 20 lines per phase)
  --checkpoint-dir DIR where checkpoints go (default: the train block's
                       checkpoint_dir)
  --checkpoint-every N save the whole training state every N iterations
                       (default: the train block's checkpoint_every; 0: never)
  --resume             continue from the last complete checkpoint in the
                       checkpoint directory (the metrics file keeps the rows
                       before it)
  --overwrite          let this run replace what an earlier run wrote into
                       its output folders (--checkpoint-dir, --tensorboard,
                       --dump-values, --export-hf): only what hflow wrote
                       there, never other files. Without it such a folder is
                       refused before any work
  --reshard planned|naive
                       how the actor's weights switch layouts: the compiler's
                       transfers (default) or DeepSpeed-Chat's gather of the
                       whole model on every rank (a baseline)
  --serialize          a barrier of all ranks after every step: nothing
                       overlaps (the baseline of the overlap benchmark)
  --trace FILE         write a Chrome/Perfetto trace (one track per rank and
                       stream: compute, communication)
  --dump-values DIR    write every builtin's inputs, outputs, mask and groups
                       (rank 0) to DIR/<phase>-<iteration>/step-<s>-<name>
                       .safetensors, to check a flow's arithmetic, and each
                       generation's prompt and response ids (step-<s>-
                       generate-rows<first row>.safetensors)
  --export-hf [ROLE=]DIR
                       at the end, write a role's weights as a Hugging Face
                       checkpoint (config.json + model.safetensors): the
                       actor's (LlamaForCausalLM) or, named, a reward
                       model's (LlamaForSequenceClassification, with its
                       score head); a program can start from it with
                       model m = hf("DIR"). Repeatable, one per role
  --calibrate FILE     instead of running the plan, measure this machine and
                       write the compiler's cost-model constants to FILE (JSON)
                       for 'hflowc --calibration FILE': a small Llama's
                       training, forward, prefill and decode steps, and Gloo
                       messages between 2 local worker processes, as
                       efficiencies of the nominal figures of PLAN's mesh
                       (device FLOP/s and memory bandwidth, intra-node link);
                       prints what it measured (about 10 s)
  --calibrate-from METRICS  with --calibrate FILE: fit the constants from a
                       finished run of PLAN instead (its --metrics file): each
                       step's measured time against the time the plan predicts
                       (training, forward, generation efficiencies, link
                       efficiency), so the next plan is predicted with this
                       machine's figures; runs nothing
  --quiet              print nothing but errors
  --verbose            every rank prints its steps (not only rank 0 the summary)
  --dry-run            verify the plan and print what each rank would do, run nothing
  --version            print the hflow version and exit
  -h, --help           print this help and exit

environment (join mode; command-line flags take precedence):
  RANK, WORLD_SIZE, LOCAL_RANK    torchrun-style rank; WORLD_SIZE must equal
                                  the plan's world size
  MASTER_ADDR, MASTER_PORT        where rank 0 hosts the rendezvous store
  SLURM_PROCID, SLURM_NTASKS,     srun (used when SLURM_STEP_ID is set and a
  SLURM_LOCALID                   master address is known)
  OMPI_COMM_WORLD_RANK, _SIZE,    mpirun (used when a master address is known)
  OMPI_COMM_WORLD_LOCAL_RANK
  HFLOW_GLOO_HOST                 address Gloo binds to (default: 127.0.0.1
                                  for a loopback master, else the address of
                                  the interface that routes to the master)
  HFLOW_NUM_THREADS               intra-op threads per rank (default 1)
  HFLOW_LOCAL_CHILD               set by hflow-run for its local children
  HFLOW_JOB_ID                    a job's identity, which every rank must share
                                  (set for local children; else torchrun's
                                  TORCHELASTIC_RUN_ID, SLURM_JOB_ID or Open
                                  MPI's job id when present)

exit status: 0 success; 2 bad usage or an invalid plan; 1 any runtime
failure (rendezvous, a worker that died, a failed check, a port in use).
)";

std::string usage() { return kUsage; }

static bool parseInt(const std::string &s, long lo, long hi, long &out) {
  if (s.empty())
    return false;
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi)
    return false;
  out = v;
  return true;
}

namespace {

/// One option of hflow-run's command line: its names, whether it takes a
/// value, and what it does with it (false and `error` set to refuse it).
struct OptionSpec {
  std::vector<std::string> names;
  bool takesValue;
  std::function<bool(Options &, const std::string &name, const std::string &value,
                     std::string &error)>
      apply;
};

/// A flag: sets `*field(o)`.
OptionSpec flag(std::vector<std::string> names, bool *(*field)(Options &)) {
  return {std::move(names), false,
          [field](Options &o, const std::string &, const std::string &, std::string &) {
            *field(o) = true;
            return true;
          }};
}

/// A non-empty string into `*field(o)`; `emptyMsg` refuses an empty one.
OptionSpec text(std::vector<std::string> names, std::string *(*field)(Options &),
                std::string emptyMsg) {
  return {std::move(names), true,
          [field, emptyMsg](Options &o, const std::string &name, const std::string &v,
                            std::string &error) {
            if (v.empty()) {
              error = emptyMsg.empty() ? name + " needs a non-empty value" : emptyMsg;
              return false;
            }
            *field(o) = v;
            return true;
          }};
}

/// One of `choices` into `*field(o)`.
OptionSpec choice(std::vector<std::string> names, std::string *(*field)(Options &),
                  std::vector<std::string> choices) {
  return {std::move(names), true,
          [field, choices](Options &o, const std::string &name, const std::string &v,
                           std::string &error) {
            *field(o) = v;
            if (std::find(choices.begin(), choices.end(), v) != choices.end())
              return true;
            std::string list;
            for (const std::string &c : choices)
              list += (list.empty() ? "" : ", ") + c;
            error = name + " '" + v + "' is not one of: " + list;
            return false;
          }};
}

/// An integer in [lo, hi], clamped to `most`, into `*field(o)`.
template <class T>
OptionSpec integer(std::vector<std::string> names, T *(*field)(Options &), long lo, long hi,
                   const char *what, long most = 1L << 40) {
  return {std::move(names), true,
          [field, lo, hi, what, most](Options &o, const std::string &name,
                                      const std::string &v, std::string &error) {
            long n;
            if (!parseInt(v, lo, hi, n)) {
              error = name + " '" + v + "' is not " + what;
              return false;
            }
            *field(o) = (T)std::min(n, most);
            return true;
          }};
}

bool applyTimeout(Options &o, const std::string &, const std::string &v, std::string &error) {
  char *end = nullptr;
  double t = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(t > 0) || t > 86400 * 7) {
    error = "--timeout '" + v + "' is not a positive number of seconds";
    return false;
  }
  o.timeoutSeconds = t;
  return true;
}

/// --export-hf [ROLE=]DIR: ROLE=DIR when what precedes '=' is a role name;
/// otherwise a directory. Once per role.
bool applyExportHf(Options &o, const std::string &, const std::string &v, std::string &error) {
  std::string roleName, dir = v;
  const size_t eq = v.find('=');
  if (eq != std::string::npos && eq > 0 &&
      std::all_of(v.begin(), v.begin() + (long)eq,
                  [](char ch) { return std::isalnum((unsigned char)ch) || ch == '_'; }) &&
      !std::isdigit((unsigned char)v[0])) {
    roleName = v.substr(0, eq);
    dir = v.substr(eq + 1);
  }
  if (dir.empty()) {
    error = "--export-hf needs a directory";
    return false;
  }
  for (const auto &[r, d] : o.run.exportHf)
    if (r == roleName) {
      error = "--export-hf is given twice for " +
              (roleName.empty() ? std::string("the actor") : "role " + roleName);
      return false;
    }
  o.run.exportHf.emplace_back(roleName, dir);
  return true;
}

const std::vector<OptionSpec> &optionTable() {
  static const std::vector<OptionSpec> table = {
      flag({"-h", "--help"}, [](Options &o) { return &o.help; }),
      flag({"--version"}, [](Options &o) { return &o.version; }),
      flag({"--quiet", "-q"}, [](Options &o) { return &o.run.quiet; }),
      flag({"--verbose", "-v"}, [](Options &o) { return &o.run.verbose; }),
      flag({"--dry-run"}, [](Options &o) { return &o.dryRun; }),
      flag({"--share-gpus"}, [](Options &o) { return &o.run.shareGpus; }),
      flag({"--serialize"}, [](Options &o) { return &o.run.serialize; }),
      flag({"--resume"}, [](Options &o) { return &o.run.resume; }),
      flag({"--overwrite"}, [](Options &o) { return &o.run.overwrite; }),
      text({"--master-addr"}, [](Options &o) { return &o.masterAddr; },
           "--master-addr needs a non-empty address"),
      integer<int>({"--master-port"}, [](Options &o) { return &o.masterPort; }, 1, 65535,
                   "a port number (1-65535)"),
      {{"--timeout"}, true, applyTimeout},
      choice({"--device"}, [](Options &o) { return &o.run.device; }, {"cpu", "cuda"}),
      choice({"--comm"}, [](Options &o) { return &o.run.comm; }, {"gloo", "nccl"}),
      choice({"--reshard"}, [](Options &o) { return &o.run.reshard; }, {"planned", "naive"}),
      {{"--export-hf"}, true, applyExportHf},
      text({"--calibrate-from"}, [](Options &o) { return &o.calibrateFrom; },
           "--calibrate-from needs a metrics file"),
      text({"--calibrate"}, [](Options &o) { return &o.calibrateOut; },
           "--calibrate needs a file name"),
      text({"--trace"}, [](Options &o) { return &o.run.traceFile; }, "--trace needs a file name"),
      text({"--dump-values"}, [](Options &o) { return &o.run.dumpValues; },
           "--dump-values needs a directory"),
      text({"--checkpoint-dir"}, [](Options &o) { return &o.run.checkpointDir; }, ""),
      integer<long>({"--checkpoint-every"}, [](Options &o) { return &o.run.checkpointEvery; },
                       0, 1L << 40, "a non-negative integer"),
      text({"--data-dir"}, [](Options &o) { return &o.run.dataDir; }, ""),
      text({"--eval"}, [](Options &o) { return &o.run.evalFile; }, ""),
      text({"--eval-pairs"}, [](Options &o) { return &o.run.evalPairsFile; }, ""),
      text({"--metrics"}, [](Options &o) { return &o.run.metricsFile; }, ""),
      text({"--tensorboard"}, [](Options &o) { return &o.run.tensorboardDir; }, ""),
      text({"--report"}, [](Options &o) { return &o.run.reportFile; }, ""),
      text({"--tokenizer"}, [](Options &o) { return &o.run.tokenizer; }, ""),
      integer<long>({"--steps"}, [](Options &o) { return &o.run.steps; }, 0, 1L << 40,
                       "a non-negative integer"),
      integer<int>({"--eval-every"}, [](Options &o) { return &o.run.evalEvery; }, 1, 1L << 40,
                   "a positive integer", 1L << 30),
      integer<int>({"--eval-count"}, [](Options &o) { return &o.run.evalCount; }, 1, 1L << 40,
                   "a positive integer", 1L << 30),
      integer<int>({"--log-every"}, [](Options &o) { return &o.run.logEvery; }, 1, 1L << 40,
                   "a positive integer", 1L << 30),
  };
  return table;
}

/// The options' combinations, once every option is read.
bool checkCombinations(Options &o, const std::vector<std::string> &positional, bool commGiven,
                       std::string &error) {
  if (!commGiven)
    o.run.comm = o.run.device == "cuda" ? "nccl" : "gloo";
  if (o.run.device == "cuda" && o.run.comm != "nccl") {
    error = "--device cuda needs --comm nccl: Gloo moves CPU tensors";
    return false;
  }
  if (o.run.shareGpus && o.run.device != "cuda") {
    error = "--share-gpus needs --device cuda";
    return false;
  }
  if (o.run.device == "cpu" && o.run.comm == "nccl") {
    error = "--comm nccl needs --device cuda: NCCL moves CUDA tensors";
    return false;
  }
  if (positional.empty()) {
    error = o.calibrateOut.empty()
                ? "missing the plan file argument"
                : "--calibrate needs a plan file: its mesh gives the nominal "
                  "device and link figures the measurements are compared with";
    return false;
  }
  if (!o.calibrateFrom.empty() && o.calibrateOut.empty()) {
    error = "--calibrate-from needs --calibrate OUT.json (where the fitted constants go)";
    return false;
  }
  if (!o.calibrateOut.empty() && o.dryRun) {
    error = "--calibrate and --dry-run exclude each other";
    return false;
  }
  if (positional.size() > 1) {
    error = "expected one plan file, got " + std::to_string(positional.size()) +
            " arguments ('" + positional[0] + "', '" + positional[1] + "', ...)";
    return false;
  }
  o.planPath = positional[0];
  o.run.planPath = o.planPath;
  return true;
}

} // namespace

bool parseArgs(const std::vector<std::string> &args, Options &o, std::string &error) {
  std::vector<std::string> positional;
  bool commGiven = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    bool hasInline = false;
    if (a.rfind("--", 0) == 0) {
      if (auto eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        hasInline = true;
      }
    }
    if (a == "--") {
      positional.insert(positional.end(), args.begin() + (long)i + 1, args.end());
      break;
    }
    const OptionSpec *spec = nullptr;
    for (const OptionSpec &s : optionTable())
      if (std::find(s.names.begin(), s.names.end(), a) != s.names.end())
        spec = &s;
    if (!spec) {
      if (a.size() > 1 && a[0] == '-') {
        error = "unknown option '" + args[i] + "'";
        return false;
      }
      positional.push_back(a);
      continue;
    }
    if (!spec->takesValue && hasInline) {
      error = "option " + a + " takes no value";
      return false;
    }
    if (spec->takesValue && !hasInline) {
      if (i + 1 >= args.size()) {
        error = "option " + a + " needs a value";
        return false;
      }
      value = args[++i];
    }
    commGiven = commGiven || a == "--comm";
    if (!spec->apply(o, a, value, error))
      return false;
  }
  if (o.help || o.version)
    return true;
  return checkCombinations(o, positional, commGiven, error);
}

// --- join detection ------------------------------------------------------

const char *joinSourceName(JoinSource s) {
  switch (s) {
  case JoinSource::None: return "local";
  case JoinSource::LocalChild: return "local child";
  case JoinSource::Torchrun: return "torchrun";
  case JoinSource::Slurm: return "slurm";
  case JoinSource::OpenMPI: return "openmpi";
  }
  return "?";
}

GetEnv processEnv() {
  return [](const char *k) -> const char * { return std::getenv(k); };
}

bool detectJoin(const GetEnv &env, const Options &opts, JoinInfo &out,
                std::string &error) {
  auto get = [&](const char *k) -> std::string {
    const char *v = env(k);
    return v ? std::string(v) : std::string();
  };
  auto has = [&](const char *k) { return env(k) != nullptr; };

  std::string addr = !opts.masterAddr.empty() ? opts.masterAddr : get("MASTER_ADDR");
  std::string portStr = opts.masterPort > 0 ? std::to_string(opts.masterPort)
                                            : get("MASTER_PORT");
  const char *rankVar = nullptr, *sizeVar = nullptr, *localVar = nullptr,
             *localSizeVar = nullptr;
  JoinSource src = JoinSource::None;
  if (get("HFLOW_LOCAL_CHILD") == "1") {
    src = JoinSource::LocalChild;
    rankVar = "RANK", sizeVar = "WORLD_SIZE", localVar = "LOCAL_RANK";
    localSizeVar = "LOCAL_WORLD_SIZE";
  } else if (has("RANK") || has("WORLD_SIZE")) {
    src = JoinSource::Torchrun;
    rankVar = "RANK", sizeVar = "WORLD_SIZE", localVar = "LOCAL_RANK";
    localSizeVar = "LOCAL_WORLD_SIZE";
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS") &&
             has("SLURM_STEP_ID") && !addr.empty()) {
    src = JoinSource::Slurm;
    rankVar = "SLURM_PROCID", sizeVar = "SLURM_NTASKS", localVar = "SLURM_LOCALID";
    localSizeVar = "SLURM_NTASKS_PER_NODE";
  } else if (has("OMPI_COMM_WORLD_RANK") && has("OMPI_COMM_WORLD_SIZE") &&
             !addr.empty()) {
    src = JoinSource::OpenMPI;
    rankVar = "OMPI_COMM_WORLD_RANK", sizeVar = "OMPI_COMM_WORLD_SIZE";
    localVar = "OMPI_COMM_WORLD_LOCAL_RANK";
    localSizeVar = "OMPI_COMM_WORLD_LOCAL_SIZE";
  }
  out = JoinInfo();
  if (src == JoinSource::None)
    return true;

  const std::string who = std::string(joinSourceName(src)) + " join: ";
  if (!has(rankVar) || !has(sizeVar)) {
    error = who + std::string(has(rankVar) ? sizeVar : rankVar) +
            " is not set (" + rankVar + " and " + sizeVar +
            " must be set together)";
    return false;
  }
  long rank, size, local = 0, port;
  if (!parseInt(get(sizeVar), 1, 1 << 20, size)) {
    error = who + sizeVar + "='" + get(sizeVar) + "' is not a positive integer";
    return false;
  }
  if (!parseInt(get(rankVar), 0, size - 1, rank)) {
    error = who + rankVar + "='" + get(rankVar) + "' is not a rank in [0, " +
            std::to_string(size) + ")";
    return false;
  }
  if (localVar && has(localVar) && !parseInt(get(localVar), 0, 1 << 20, local)) {
    error = who + localVar + "='" + get(localVar) + "' is not a non-negative integer";
    return false;
  }
  // Ranks per node: informative (the GPU check), so a value that is not a
  // plain count (Slurm writes "4(x2)" in some variables) counts as unknown.
  long localSize = 0;
  if (localSizeVar && has(localSizeVar) &&
      !parseInt(get(localSizeVar), 1, 1 << 20, localSize))
    localSize = 0;
  if (addr.empty()) {
    error = who + "MASTER_ADDR is not set (nor --master-addr)";
    return false;
  }
  if (portStr.empty()) {
    if (src == JoinSource::Torchrun || src == JoinSource::LocalChild) {
      error = who + "MASTER_PORT is not set (nor --master-port)";
      return false;
    }
    portStr = "29500";
  }
  if (!parseInt(portStr, 1, 65535, port)) {
    error = who + "MASTER_PORT='" + portStr + "' is not a port number (1-65535)";
    return false;
  }
  out.source = src;
  out.rank = (int)rank;
  out.worldSize = (int)size;
  out.localRank = (int)local;
  out.localWorldSize = (int)localSize;
  out.masterAddr = addr;
  out.masterPort = (int)port;
  return true;
}

// --- ports ---------------------------------------------------------------

static int bindSocket(const std::string &addr, int port, int &boundPort) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 ||
      !res)
    return -1;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 || listen(fd, 1) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  getsockname(fd, (sockaddr *)&sa, &len);
  boundPort = ntohs(sa.sin_port);
  return fd;
}

bool placeOnGpu(int rank, int localRank, int localRanks, int gpus, bool share,
                const char *visible, GpuPlacement &out, std::string &error) {
  out = GpuPlacement();
  const std::string seen =
      visible ? std::string("CUDA_VISIBLE_DEVICES=") + visible : "CUDA_VISIBLE_DEVICES unset";
  auto plural = [](int n, const char *one, const char *many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  if (gpus <= 0) {
    error = "--device cuda: no CUDA device is visible (" +
            (visible ? seen : std::string("no driver or no GPU")) + ")";
    return false;
  }
  if (!share) {
    if (localRanks > gpus) {
      error = "--device cuda: " + plural(localRanks, "rank runs", "ranks run") +
              " on this node, one GPU each, and it shows " + plural(gpus, "GPU", "GPUs") + " (" +
              seen + "): give the job more GPUs or nodes, or place the program on " +
              plural(gpus, "device", "devices") + " (--share-gpus runs several ranks on one GPU, "
              "for correctness tests only)";
      return false;
    }
    if (localRank >= gpus) {
      error = "--device cuda: local rank " + std::to_string(localRank) +
              " needs GPU " + std::to_string(localRank) + " (one per rank) and this node shows " +
              plural(gpus, "GPU", "GPUs") + " (" + seen + ")";
      return false;
    }
    out.ordinal = localRank;
    return true;
  }
  out.ordinal = localRank % gpus;
  out.shared = localRanks == 0 || localRanks > gpus;
  // NCCL refuses two ranks of one host on one GPU ("Duplicate GPU
  // detected"); a host id of its own makes each rank a host of its own, and
  // NCCL then carries their messages over its socket transport, here on
  // loopback. The user's own NCCL settings stand, except the host id.
  out.ncclEnv = {{"NCCL_HOSTID", "hflow-shared-gpu-rank-" + std::to_string(rank), true},
                 {"NCCL_SOCKET_IFNAME", "lo", false},
                 {"NCCL_NET", "Socket", false}, // not an image's network plugin
                 {"NCCL_P2P_DISABLE", "1", false},
                 {"NCCL_SHM_DISABLE", "1", false},
                 {"NCCL_IB_DISABLE", "1", false}};
  return true;
}

exec::JoinOptions joinOptions(const JoinInfo &join, const Options &opts,
                              const std::string &version) {
  exec::JoinOptions j;
  j.rank = join.rank;
  j.worldSize = join.worldSize;
  j.localRank = join.localRank;
  j.localWorldSize = join.localWorldSize;
  j.cudaDevice = join.cudaDevice >= 0 ? join.cudaDevice : join.localRank;
  j.masterAddr = join.masterAddr;
  j.masterPort = join.masterPort;
  j.timeout = std::chrono::milliseconds((long long)std::llround(opts.timeoutSeconds * 1000.0));
  j.localChild = join.source == JoinSource::LocalChild;
  j.version = version;
  return j;
}

bool portInUse(const std::string &addr, int port) {
  int bound = 0;
  int fd = bindSocket(addr, port, bound);
  if (fd < 0)
    return true;
  close(fd);
  // TCPStore listens on every address: also check the wildcard.
  if (addr != "0.0.0.0") {
    fd = bindSocket("0.0.0.0", port, bound);
    if (fd < 0)
      return true;
    close(fd);
  }
  return false;
}

std::pair<int, int> ephemeralPortRange() {
  std::FILE *f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (!f)
    return {0, 0};
  int lo = 0, hi = 0;
  const bool read = std::fscanf(f, "%d %d", &lo, &hi) == 2;
  std::fclose(f);
  if (!read || lo < 1 || hi > 65535 || lo > hi)
    return {0, 0};
  return {lo, hi};
}

int pickFreePort(const std::string &addr) {
  // Below the kernel's ephemeral range when it leaves room: a port there is
  // never handed out for another socket's connect() or bind(0) between the
  // pick and rank 0's bind (the window spans the workers' start and
  // preparation), so only an explicit bind can still take it.
  const auto [lo, hi] = ephemeralPortRange();
  (void)hi;
  if (lo > kLowestPickedPort + 1024) {
    const int first = std::max(kLowestPickedPort, lo - 8192), span = lo - first;
    std::mt19937 rng((uint32_t)std::random_device{}() ^ (uint32_t)::getpid());
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = first + (int)(rng() % (uint32_t)span);
      if (!portInUse(addr, port))
        return port;
    }
  }
  for (int attempt = 0; attempt < 20; ++attempt) {
    int port = 0;
    int fd = bindSocket(addr, 0, port);
    if (fd < 0)
      return -1;
    close(fd);
    if (!portInUse(addr, port))
      return port;
  }
  return -1;
}

// --- local launch --------------------------------------------------------

static const char *signalName(int sig) {
  switch (sig) {
  case SIGKILL: return "SIGKILL";
  case SIGTERM: return "SIGTERM";
  case SIGSEGV: return "SIGSEGV";
  case SIGABRT: return "SIGABRT";
  case SIGBUS: return "SIGBUS";
  case SIGFPE: return "SIGFPE";
  case SIGILL: return "SIGILL";
  case SIGINT: return "SIGINT";
  case SIGHUP: return "SIGHUP";
  case SIGPIPE: return "SIGPIPE";
  default: return "signal";
  }
}

namespace {

/// Each child's environment: this process's, less what hflow-run sets,
/// plus its rank, the world, the master and the job's identity.
std::vector<std::vector<std::string>> childEnvironments(int worldSize,
                                                        const std::string &masterAddr,
                                                        int masterPort) {
  static const char *const kOwned[] = {
      "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
      "MASTER_PORT=", "HFLOW_LOCAL_CHILD=", "GROUP_RANK=", "ROLE_RANK=", "HFLOW_JOB_ID="};
  // The job's identity, which every child must share at the rendezvous: a
  // process of another job on the same port is refused.
  char jobId[64];
  std::snprintf(jobId, sizeof jobId, "HFLOW_JOB_ID=%d-%lld", (int)::getpid(),
                (long long)std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<std::string> baseEnv;
  for (char **e = environ; e && *e; ++e) {
    bool owned = false;
    for (const char *k : kOwned)
      owned |= std::strncmp(*e, k, std::strlen(k)) == 0;
    if (!owned)
      baseEnv.push_back(*e);
  }
  std::vector<std::vector<std::string>> envs(worldSize);
  for (int r = 0; r < worldSize; ++r) {
    envs[r] = baseEnv;
    envs[r].push_back("RANK=" + std::to_string(r));
    envs[r].push_back("WORLD_SIZE=" + std::to_string(worldSize));
    envs[r].push_back("LOCAL_RANK=" + std::to_string(r));
    envs[r].push_back("LOCAL_WORLD_SIZE=" + std::to_string(worldSize));
    envs[r].push_back("MASTER_ADDR=" + masterAddr);
    envs[r].push_back("MASTER_PORT=" + std::to_string(masterPort));
    envs[r].push_back("HFLOW_LOCAL_CHILD=1");
    envs[r].push_back(jobId);
  }
  return envs;
}

void signalRunning(const std::vector<pid_t> &pids, const std::vector<bool> &running, int sig) {
  for (size_t r = 0; r < pids.size(); ++r)
    if (running[r])
      kill(pids[r], sig);
}

/// Waits for the children: the first that fails is reported, the rest are
/// stopped (SIGTERM, then SIGKILL after 5 s). The exit status.
int superviseChildren(const std::vector<pid_t> &pids, std::vector<bool> &running) {
  const int worldSize = (int)pids.size();
  auto killAll = [&](int sig) { signalRunning(pids, running, sig); };
  using Clock = std::chrono::steady_clock;
  int alive = worldSize;
  int failedRank = -1;
  std::string failure;
  Clock::time_point termSent;
  bool killed = false;
  while (alive > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR)
        continue;
      break; // no children left
    }
    if (pid == 0) {
      if (failedRank >= 0 && !killed && Clock::now() - termSent > std::chrono::seconds(5)) {
        killAll(SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    int r = -1;
    for (int q = 0; q < worldSize; ++q)
      if (pids[q] == pid)
        r = q;
    if (r < 0)
      continue;
    running[r] = false;
    --alive;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failedRank < 0) {
      failedRank = r;
      if (WIFEXITED(status))
        failure = "worker rank " + std::to_string(r) + " exited with code " +
                  std::to_string(WEXITSTATUS(status));
      else if (WIFSIGNALED(status))
        failure = "worker rank " + std::to_string(r) + " was killed by signal " +
                  std::to_string(WTERMSIG(status)) + " (" +
                  signalName(WTERMSIG(status)) + ")";
      else
        failure = "worker rank " + std::to_string(r) + " stopped abnormally";
      killAll(SIGTERM);
      termSent = Clock::now();
    }
  }
  if (failedRank >= 0) {
    std::fprintf(stderr, "hflow-run: error: %s\n", failure.c_str());
    return 1;
  }
  return 0;
}

} // namespace

int runLocal(int worldSize, const std::string &masterAddr, int masterPort,
             const std::vector<std::string> &argv) {
  // Everything the children need is prepared before fork(): after it only
  // async-signal-safe calls are made.
  const std::vector<std::vector<std::string>> envs =
      childEnvironments(worldSize, masterAddr, masterPort);
  std::vector<std::vector<char *>> envps(worldSize);
  for (int r = 0; r < worldSize; ++r) {
    for (auto &s : envs[r])
      envps[r].push_back(const_cast<char *>(s.c_str()));
    envps[r].push_back(nullptr);
  }
  std::vector<char *> args;
  for (auto &s : argv)
    args.push_back(const_cast<char *>(s.c_str()));
  args.push_back(nullptr);
  const char *exe = "/proc/self/exe";
  static const char kExecFailed[] = "hflow-run: error: cannot execute /proc/self/exe\n";

  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids(worldSize, -1);
  std::vector<bool> running(worldSize, false);

  auto killAll = [&](int sig) { signalRunning(pids, running, sig); };

  for (int r = 0; r < worldSize; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "hflow-run: error: cannot start worker rank %d: %s\n",
                   r, std::strerror(errno));
      killAll(SIGKILL);
      for (int q = 0; q < r; ++q)
        waitpid(pids[q], nullptr, 0);
      return 1;
    }
    if (pid == 0) {
      // Die with the parent; and if it already died, do not run at all.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(1);
      execve(exe, args.data(), envps[r].data());
      (void)!write(2, kExecFailed, sizeof kExecFailed - 1);
      _exit(127);
    }
    pids[r] = pid;
    running[r] = true;
  }

  return superviseChildren(pids, running);
}

} // namespace hflow::launch
