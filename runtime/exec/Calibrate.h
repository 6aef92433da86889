//===- Calibrate.h - hflow-run --calibrate: measure the cost model's constants ===//
//
// `hflow-run --calibrate OUT.json PLAN.bin` starts two local worker
// processes (the launcher's local mode) that measure this machine with the
// runtime's own code: a small Llama's forward + backward, forward, prefill
// and KV-cache decode steps (runtime/models/Llama.h) on every rank at once,
// then ping-pongs of small and large messages between the two ranks over
// Gloo (runtime/comm). Rank 0 turns the figures into the efficiencies and
// latencies of the compiler's cost model (compiler/planner/CostModel.h,
// Calibration) relative to the nominal figures of the plan's mesh (its
// device and links, recorded by hflowc since plan format 2.3), prints a
// table and writes a calibration file `hflowc --calibration` reads
// (docs/placement.md, "Calibration").
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_CALIBRATE_H
#define HFLOW_RUNTIME_EXEC_CALIBRATE_H

#include "runtime/exec/RunOptions.h"
#include "runtime/plan/PlanLoader.h"

#include <chrono>
#include <string>
#include <vector>

namespace hflow::exec {

/// The ranks calibration runs on: two local processes (one link to measure).
inline constexpr int kCalibrationRanks = 2;

/// Empty when `plan` records the nominal figures calibration measures
/// against (its first mesh's device FLOP/s and bandwidth, format 2.3);
/// otherwise one line saying why not.
std::string calibrationPlanProblem(const plan::LoadedPlan &plan);

/// One rank of a calibration run. Rank 0 prints the table (unless quiet)
/// and writes `outPath` through a temporary file and a rename. Returns the
/// process exit code: 0, or 1 after printing one error line.
int runCalibrationWorker(const plan::LoadedPlan &plan, const JoinOptions &join,
                         const RunOptions &run, const std::string &outPath);

/// The figures a calibration run measured (per rank, averaged over ranks)
/// and what they make of the cost model's constants: exposed for tests.
struct CalibrationMeasurement {
  // Nominal figures (the plan's mesh).
  double nominalFlops = 0;     ///< fp32 FLOP/s of the device
  double nominalBandwidth = 0; ///< device memory bytes/s
  double nominalIntra = 0;     ///< intra-node link bytes/s
  // The model measured.
  double params = 0;           ///< parameter count (the cost model's P)
  double trainFlopsPerParamToken = 8, forwardFlopsPerParamToken = 2;
  double trainTokens = 0, trainSeconds = 0;     ///< one forward + backward
  double forwardTokens = 0, forwardSeconds = 0; ///< one forward
  double prefillTokens = 0, prefillSeconds = 0; ///< one prefill (KV cache)
  double decodeBytes = 0, decodeSeconds = 0;    ///< one decode step: bytes read
  double decodeNullSeconds = 0;  ///< a decode step of a model of ~no bytes
  double decodeComputeFlops = 0, decodeComputeSeconds = 0; ///< a wide step
  // Communication between the two ranks.
  double pingPongSeconds = 0; ///< one round trip of a 4-byte message
  double bigBytes = 0, bigSeconds = 0; ///< one way, one large message
};

/// One derived constant: its value (clamped into loadCalibration's range)
/// and, when it had to be clamped, the raw value.
struct DerivedConstant {
  const char *key;
  double value;
  bool clamped;
  double raw;
};
std::vector<DerivedConstant> deriveCalibration(const CalibrationMeasurement &m);

/// The calibration file: every derived key, then "measured" with the raw
/// figures. loadCalibration accepts it.
std::string calibrationJson(const CalibrationMeasurement &m,
                            const std::vector<DerivedConstant> &derived);

/// --calibrate-from: the constants fitted from a finished run of `plan`
/// (its --metrics file `metricsPath`): per kind of step (training, forward,
/// generation, weight reshard), the median over the plan's modelled steps of
/// predicted / measured time (each step's median over iterations of the
/// metrics' ms_step_N) scales the efficiencies the plan was predicted with
/// (hflowc's defaults; time goes as 1 / efficiency), clamped to the file's
/// ranges. Writes the calibration file to `outPath` and prints, per step,
/// predicted and measured. Returns the exit status (1 with a message on
/// stderr for a bad input).
int calibrateFromMetrics(const plan::LoadedPlan &plan, const std::string &metricsPath,
                         const std::string &outPath, bool quiet);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_CALIBRATE_H
