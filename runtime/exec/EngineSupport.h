//===- EngineSupport.h - small helpers every part of the engine uses -------===//
//
// The error type of messages already phrased for the user, the clock, byte
// formatting, and the plan's FlatBuffers accessors. A step's keyword
// arguments are typed plan fields (plan::CallArgs), read where they are used.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ENGINESUPPORT_H
#define HFLOW_RUNTIME_EXEC_ENGINESUPPORT_H

#include "runtime/schema/plan_generated.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::exec {

/// A failure that is already phrased for the user (without the "rank R: ").
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t);
/// The page faults (minor and major) of this process so far (getrusage).
double pageFaults();

/// A plan string, or `dflt` when absent.
std::string str(const flatbuffers::String *s, const char *dflt = "");
/// A plan int vector (empty when absent).
std::vector<int> ints(const flatbuffers::Vector<int32_t> *v);
/// "0-3", "0,2,5-7" ("-" when empty).
std::string rankList(const std::vector<int> &rs);
/// A plan step by role and method: "actor.generate", "reshard actor", or
/// the builtin's name.
std::string stepLabel(const hflow::plan::Plan &p, int step);
/// "512 B", "1.5 KiB", "3.2 MiB".
std::string fmtBytes(double b);
/// A 64-bit mix of two seeds (splitmix64 finaliser).
uint64_t mix(uint64_t a, uint64_t b);
/// Whether an error's text is LibTorch's or the C++ library's way of saying
/// an allocation failed ("can't allocate memory", "out of memory",
/// std::bad_alloc).
bool isOutOfMemory(const std::string &what);
/// An integer environment variable, or `dflt` when unset or malformed.
int envInt(const char *name, int dflt);
/// The environment variables that change what a rank computes or which
/// collectives it runs: every rank of a job must have the same values
/// (agreed at the rendezvous, Preflight.cpp's agreedFacts), or a job would
/// compute different numbers on its ranks or stop inside a collective.
/// hflow's other variables are the process's own (HFLOW_GLOO_HOST, the
/// library paths, HFLOW_MALLOC's heap settings) or set by hflow-run itself.
inline constexpr const char *kAgreedEnvironment[] = {
    "HFLOW_NUM_THREADS",      "HFLOW_WHOLE_WEIGHTS", "HFLOW_LENGTH_BUCKETS",
    "HFLOW_BUCKET_MIN_PADDING", "HFLOW_PADDED_PASSES", "HFLOW_FSDP_PREFETCH",
    "HFLOW_PACKED_PASSES",    "HFLOW_FUSED_OPTIMIZER"};
/// The intra-op threads of a worker: HFLOW_NUM_THREADS in [1, 4096], else 1
/// (one process per rank: threads would compete for the same cores).
int threadCount();
/// FNV-1a 64 of a file's bytes, as 16 hex digits. Throws RunError when it
/// cannot be read.
std::string fileHash(const std::string &path);
/// A regular file exists at `p`.
bool fileExists(const std::string &p);
/// The directory part of `p` ("." when none).
std::string dirOf(const std::string &p);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ENGINESUPPORT_H
