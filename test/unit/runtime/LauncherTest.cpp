//===- LauncherTest.cpp - command line and join-environment parsing --------===//
#include "runtime/launch/Blas.h"
#include "runtime/launch/Launcher.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace hflow::launch;

namespace {

bool parse(std::vector<std::string> args, Options &o, std::string &err) {
  o = Options();
  err.clear();
  return parseArgs(args, o, err);
}

GetEnv envOf(std::map<std::string, std::string> m) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(m));
  return [shared](const char *k) -> const char * {
    auto it = shared->find(k);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

} // namespace

TEST(LauncherArgs, PlanAndFlags) {
  Options o;
  std::string err;
  ASSERT_TRUE(parse({"plan.bin"}, o, err)) << err;
  EXPECT_EQ(o.planPath, "plan.bin");
  EXPECT_EQ(o.masterPort, -1);
  EXPECT_DOUBLE_EQ(o.timeoutSeconds, 60);
  ASSERT_TRUE(parse({"--master-port", "29501", "--timeout=2.5", "--quiet",
                     "--master-addr=10.0.0.1", "--comm", "gloo", "p.bin"},
                    o, err))
      << err;
  EXPECT_EQ(o.masterPort, 29501);
  EXPECT_DOUBLE_EQ(o.timeoutSeconds, 2.5);
  EXPECT_TRUE(o.run.quiet);
  EXPECT_EQ(o.masterAddr, "10.0.0.1");
  EXPECT_EQ(o.planPath, "p.bin");
  ASSERT_TRUE(parse({"--verbose", "--", "-odd-name.bin"}, o, err)) << err;
  EXPECT_EQ(o.planPath, "-odd-name.bin");
  EXPECT_TRUE(o.run.verbose);
}

TEST(LauncherArgs, Calibrate) {
  Options o;
  std::string err;
  ASSERT_TRUE(parse({"--calibrate", "cal.json", "p.bin"}, o, err)) << err;
  EXPECT_EQ(o.calibrateOut, "cal.json");
  EXPECT_EQ(o.planPath, "p.bin");
  ASSERT_TRUE(parse({"--calibrate=out/c.json", "p.bin"}, o, err)) << err;
  EXPECT_EQ(o.calibrateOut, "out/c.json");
  EXPECT_FALSE(parse({"--calibrate", "cal.json"}, o, err));
  EXPECT_EQ(err, "--calibrate needs a plan file: its mesh gives the nominal device "
                 "and link figures the measurements are compared with");
  EXPECT_FALSE(parse({"--calibrate=", "p.bin"}, o, err));
  EXPECT_EQ(err, "--calibrate needs a file name");
  EXPECT_FALSE(parse({"--calibrate"}, o, err));
  EXPECT_EQ(err, "option --calibrate needs a value");
  EXPECT_FALSE(parse({"--calibrate", "c.json", "--dry-run", "p.bin"}, o, err));
  EXPECT_EQ(err, "--calibrate and --dry-run exclude each other");
  EXPECT_NE(usage().find("--calibrate FILE"), std::string::npos);
}

TEST(LauncherArgs, HelpAndVersionNeedNoPlan) {
  Options o;
  std::string err;
  ASSERT_TRUE(parse({"--help"}, o, err));
  EXPECT_TRUE(o.help);
  ASSERT_TRUE(parse({"-h"}, o, err));
  EXPECT_TRUE(o.help);
  ASSERT_TRUE(parse({"--version"}, o, err));
  EXPECT_TRUE(o.version);
  std::string u = usage();
  for (const char *flag : {"--master-addr", "--master-port", "--timeout", "--quiet",
                           "--verbose", "--version", "--help", "--comm", "RANK",
                           "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                           "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "HFLOW_GLOO_HOST"})
    EXPECT_NE(u.find(flag), std::string::npos) << flag;
}

TEST(LauncherArgs, UsageErrors) {
  Options o;
  std::string err;
  EXPECT_FALSE(parse({}, o, err));
  EXPECT_NE(err.find("missing the plan"), std::string::npos) << err;
  EXPECT_FALSE(parse({"--frobnicate", "p.bin"}, o, err));
  EXPECT_NE(err.find("unknown option '--frobnicate'"), std::string::npos) << err;
  EXPECT_FALSE(parse({"a.bin", "b.bin"}, o, err));
  EXPECT_FALSE(parse({"--master-port", "70000", "p.bin"}, o, err));
  EXPECT_NE(err.find("not a port"), std::string::npos) << err;
  EXPECT_FALSE(parse({"--master-port", "x", "p.bin"}, o, err));
  EXPECT_FALSE(parse({"--timeout", "0", "p.bin"}, o, err));
  EXPECT_FALSE(parse({"--timeout", "-3", "p.bin"}, o, err));
  EXPECT_FALSE(parse({"p.bin", "--timeout"}, o, err));
  EXPECT_NE(err.find("needs a value"), std::string::npos) << err;
  EXPECT_FALSE(parse({"--comm", "mpi", "p.bin"}, o, err));
  EXPECT_FALSE(parse({"--quiet=1", "p.bin"}, o, err));
}

TEST(LauncherJoin, LocalWhenNothingSet) {
  JoinInfo j;
  std::string err;
  Options o;
  ASSERT_TRUE(detectJoin(envOf({}), o, j, err)) << err;
  EXPECT_EQ(j.source, JoinSource::None);
  // A bare MASTER_ADDR or a Slurm batch step (no SLURM_STEP_ID) stays local.
  ASSERT_TRUE(detectJoin(envOf({{"MASTER_ADDR", "h"}, {"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "4"}}),
                         o, j, err));
  EXPECT_EQ(j.source, JoinSource::None);
  // Open MPI without a master address stays local.
  ASSERT_TRUE(detectJoin(envOf({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"}}),
                         o, j, err));
  EXPECT_EQ(j.source, JoinSource::None);
}

TEST(LauncherJoin, Torchrun) {
  JoinInfo j;
  std::string err;
  Options o;
  ASSERT_TRUE(detectJoin(envOf({{"RANK", "3"}, {"WORLD_SIZE", "4"},
                                {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"},
                                {"MASTER_PORT", "29511"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.source, JoinSource::Torchrun);
  EXPECT_EQ(j.rank, 3);
  EXPECT_EQ(j.worldSize, 4);
  EXPECT_EQ(j.localRank, 1);
  EXPECT_EQ(j.masterAddr, "10.1.2.3");
  EXPECT_EQ(j.masterPort, 29511);
  // Flags take precedence over the environment.
  o.masterAddr = "127.0.0.1";
  o.masterPort = 1234;
  ASSERT_TRUE(detectJoin(envOf({{"RANK", "0"}, {"WORLD_SIZE", "1"},
                                {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}}),
                         o, j, err));
  EXPECT_EQ(j.masterAddr, "127.0.0.1");
  EXPECT_EQ(j.masterPort, 1234);
}

TEST(LauncherJoin, TorchrunErrors) {
  JoinInfo j;
  std::string err;
  Options o;
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "0"}}), o, j, err));
  EXPECT_NE(err.find("WORLD_SIZE is not set"), std::string::npos) << err;
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "2"}, {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
                          o, j, err));
  EXPECT_NE(err.find("RANK='2' is not a rank in [0, 2)"), std::string::npos) << err;
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "0"}, {"WORLD_SIZE", "two"}}), o, j, err));
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                 {"MASTER_PORT", "1"}}),
                          o, j, err));
  EXPECT_NE(err.find("MASTER_ADDR is not set"), std::string::npos) << err;
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "h"}}),
                          o, j, err));
  EXPECT_NE(err.find("MASTER_PORT is not set"), std::string::npos) << err;
  EXPECT_FALSE(detectJoin(envOf({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}}),
                          o, j, err));
}

TEST(LauncherJoin, SlurmAndOpenMPI) {
  JoinInfo j;
  std::string err;
  Options o;
  ASSERT_TRUE(detectJoin(envOf({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                                {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"},
                                {"MASTER_ADDR", "node0"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.source, JoinSource::Slurm);
  EXPECT_EQ(j.rank, 5);
  EXPECT_EQ(j.worldSize, 8);
  EXPECT_EQ(j.localRank, 1);
  EXPECT_EQ(j.masterPort, 29500);
  o.masterAddr = "node1";
  ASSERT_TRUE(detectJoin(envOf({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"MASTER_PORT", "4000"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.source, JoinSource::OpenMPI);
  EXPECT_EQ(j.rank, 1);
  EXPECT_EQ(j.masterAddr, "node1");
  EXPECT_EQ(j.masterPort, 4000);
}

TEST(LauncherJoin, LocalChild) {
  JoinInfo j;
  std::string err;
  Options o;
  ASSERT_TRUE(detectJoin(envOf({{"HFLOW_LOCAL_CHILD", "1"}, {"RANK", "1"},
                                {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "5"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.source, JoinSource::LocalChild);
  EXPECT_EQ(j.rank, 1);
}

TEST(LauncherPorts, InUseAndFree) {
  int port = pickFreePort("127.0.0.1");
  ASSERT_GT(port, 0);
  EXPECT_FALSE(portInUse("127.0.0.1", port));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons((uint16_t)port);
  ASSERT_EQ(bind(fd, (sockaddr *)&sa, sizeof sa), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  EXPECT_TRUE(portInUse("127.0.0.1", port));
  close(fd);
  EXPECT_FALSE(portInUse("127.0.0.1", port));
}

// The picked port lies below the kernel's ephemeral range (when it leaves
// room), where no connect() or bind(0) elsewhere can take it before rank 0
// binds it; picks differ.
TEST(LauncherPorts, PickedBelowTheEphemeralRange) {
  const auto [lo, hi] = ephemeralPortRange();
  if (lo <= kLowestPickedPort + 1024)
    GTEST_SKIP() << "ephemeral range starts at " << lo;
  EXPECT_GE(hi, lo);
  std::set<int> seen;
  for (int i = 0; i < 16; ++i) {
    const int port = pickFreePort("127.0.0.1");
    ASSERT_GE(port, std::max(kLowestPickedPort, lo - 8192));
    ASSERT_LT(port, lo);
    seen.insert(port);
  }
  EXPECT_GT(seen.size(), 8u);
}

TEST(LauncherBlas, BetterCoreOnlyForPrescottWithWiderVectors) {
  using hflow::launch::betterBlasCore;
  EXPECT_EQ(betterBlasCore("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(betterBlasCore("prescott", false, true), "Haswell");
  EXPECT_EQ(betterBlasCore("Prescott", false, false), "");
  EXPECT_EQ(betterBlasCore("SkylakeX", true, true), "");
  EXPECT_EQ(betterBlasCore("Haswell", true, true), ""); // OpenBLAS knew the CPU
  EXPECT_EQ(betterBlasCore("", true, true), "");        // not OpenBLAS
}

// Ranks per node come from each launcher's own variable; a value that is
// not a plain count (Slurm's "4(x2)" form) is unknown, not an error.
TEST(LauncherJoin, RanksPerNode) {
  JoinInfo j;
  std::string err;
  Options o;
  ASSERT_TRUE(detectJoin(envOf({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"},
                                {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"},
                                {"MASTER_PORT", "1"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.localWorldSize, 4);
  ASSERT_TRUE(detectJoin(envOf({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                                {"SLURM_LOCALID", "1"}, {"SLURM_STEP_ID", "0"},
                                {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"MASTER_ADDR", "n"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.localWorldSize, 0);
  ASSERT_TRUE(detectJoin(envOf({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "n"}}),
                         o, j, err))
      << err;
  EXPECT_EQ(j.localWorldSize, 2);
  EXPECT_EQ(joinOptions(j, o, "v").cudaDevice, 0); // the local rank's until placed
}

TEST(LauncherGpus, OneGpuPerRankAndTheRefusals) {
  GpuPlacement g;
  std::string err;
  // Local mode checks the whole node; a joined rank checks itself.
  ASSERT_TRUE(placeOnGpu(5, 3, 4, 4, false, "4,5,6,7", g, err)) << err;
  EXPECT_EQ(g.ordinal, 3); // among the visible devices
  EXPECT_FALSE(g.shared);
  EXPECT_TRUE(g.ncclEnv.empty());
  EXPECT_FALSE(placeOnGpu(0, 0, 4, 1, false, "3", g, err));
  EXPECT_EQ(err, "--device cuda: 4 ranks run on this node, one GPU each, and it shows 1 GPU "
                 "(CUDA_VISIBLE_DEVICES=3): give the job more GPUs or nodes, or place the "
                 "program on 1 device (--share-gpus runs several ranks on one GPU, for "
                 "correctness tests only)");
  EXPECT_FALSE(placeOnGpu(2, 2, 0, 2, false, nullptr, g, err));
  EXPECT_EQ(err, "--device cuda: local rank 2 needs GPU 2 (one per rank) and this node shows "
                 "2 GPUs (CUDA_VISIBLE_DEVICES unset)");
  EXPECT_FALSE(placeOnGpu(0, 0, 1, 0, false, "", g, err));
  EXPECT_EQ(err, "--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES=)");
  EXPECT_FALSE(placeOnGpu(0, 0, 1, 0, true, nullptr, g, err));
  EXPECT_EQ(err, "--device cuda: no CUDA device is visible (no driver or no GPU)");
}

TEST(LauncherGpus, SharedForTests) {
  GpuPlacement g;
  std::string err;
  ASSERT_TRUE(placeOnGpu(3, 3, 4, 1, true, nullptr, g, err)) << err;
  EXPECT_EQ(g.ordinal, 0);
  EXPECT_TRUE(g.shared);
  ASSERT_EQ(g.ncclEnv.size(), 6u);
  EXPECT_EQ(g.ncclEnv[0].name, "NCCL_HOSTID");
  EXPECT_EQ(g.ncclEnv[0].value, "hflow-shared-gpu-rank-3"); // every rank its own host
  EXPECT_TRUE(g.ncclEnv[0].overwrite);
  EXPECT_EQ(g.ncclEnv[1].name, "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(g.ncclEnv[1].value, "lo");
  EXPECT_FALSE(g.ncclEnv[1].overwrite); // the user's own settings stand
  EXPECT_EQ(g.ncclEnv[2].name, "NCCL_NET"); // NCCL's own sockets, not a plugin's network
  EXPECT_EQ(g.ncclEnv[2].value, "Socket");
  EXPECT_FALSE(g.ncclEnv[2].overwrite);
  ASSERT_TRUE(placeOnGpu(6, 6, 8, 4, true, nullptr, g, err)) << err;
  EXPECT_EQ(g.ordinal, 2); // round robin over the devices
  Options o;
  EXPECT_FALSE(parse({"--share-gpus", "p.bin"}, o, err));
  EXPECT_EQ(err, "--share-gpus needs --device cuda");
  EXPECT_TRUE(parse({"--device", "cuda", "--share-gpus", "p.bin"}, o, err)) << err;
  EXPECT_TRUE(o.run.shareGpus);
}
