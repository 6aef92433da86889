//===- DryRun.h - what each rank of a plan would do ------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_DRYRUN_H
#define HFLOW_RUNTIME_EXEC_DRYRUN_H

#include <cstdio>
#include <string>

namespace hflow::plan {
class LoadedPlan;
struct RankMemory;
struct RankHostMemory;
}

namespace hflow::exec {

/// Prints, for every rank of a verified plan, the steps it would run in
/// order: role calls with the rows of the batch it would take, builtins on
/// the controller, checks with their groups, weight reshards with the bytes
/// this rank would send and receive. Needs no LibTorch and starts nothing.
void printDryRun(const plan::LoadedPlan &lp, std::FILE *out);

/// "weights 694.6 KiB, gradients 694.6 KiB, optimizer 1.36 MiB": what the
/// plan counted one rank of a role holds (the categories above zero), and
/// "; in host memory: optimizer 1.02 MiB" where it offloads (`host`).
std::string memoryLine(const plan::RankMemory &m, const plan::RankHostMemory *host = nullptr);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_DRYRUN_H
