//===- CalibrationFile.h - the cost model's constants, as a file ----------===//
//
// The calibration file is a contract between the runtime, which measures a
// machine and writes it (`hflow-run --calibrate`), and the compiler's cost
// model, which reads it (`hflowc --calibration`). It lives in the leaf layer
// both include, so the runtime never includes or links compiler code.
// Plain C++17; never throws (the compiler's side is built without
// exceptions).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_CALIBRATIONFILE_H
#define HFLOW_RUNTIME_SCHEMA_CALIBRATIONFILE_H

#include <cstddef>
#include <string>

namespace hflow::placement {

/// The calibratable constants (docs/placement.md, "Calibration").
struct Calibration {
  double trainFlopsPerParamToken = 8;  // 6 (fwd+bwd) + 2 (recomputation)
  double forwardFlopsPerParamToken = 2;
  double trainEfficiency = 0.5;        // achieved / peak FLOP/s, training
  double forwardEfficiency = 0.5;      // logprob / values / score passes
  double prefillEfficiency = 0.5;      // generation's prompt pass
  double decodeComputeEfficiency = 0.5;
  double decodeBandwidthEfficiency = 0.7; // achieved / peak HBM bandwidth
  double decodeStepOverhead = 0;       // seconds per decode step (launches)
  double linkEfficiency = 1.0;         // achieved / nominal link bandwidth
  double alphaIntra = 5e-6;            // seconds per message, same node
  double alphaInter = 20e-6;           // seconds per message, across nodes
  double memoryFraction = 1.0;         // usable share of device memory
  double epochs = 1;                   // PPO epochs over the batch
};

/// Parses a flat JSON object {"key": number, ...} whose keys are the field
/// names above (e.g. {"trainEfficiency": 0.42, "alphaInter": 1.5e-5}).
/// Keys it does not name keep their value in `out`. One more key is
/// allowed: "measured", an object of any keys with number values (the raw
/// figures `hflow-run --calibrate` derived the constants from); it is
/// checked for syntax and otherwise ignored. Returns false with a message
/// (and leaves `out` untouched) on malformed text, an unknown key, a
/// duplicate key, a non-number or a value out of range. Never throws.
bool loadCalibration(const std::string &jsonText, Calibration &out,
                     std::string &error);

/// loadCalibration on the contents of the file `path`. Every message
/// starts "calibration PATH: " (e.g. "calibration cal.json: unknown key
/// \"nope\" at offset 2", "calibration x.json: cannot read: No such file or
/// directory"). Never throws.
bool loadCalibrationFile(const std::string &path, Calibration &out,
                         std::string &error);

/// One key of the calibration file: its Calibration field and the range
/// loadCalibration accepts (inclusive).
struct CalibrationKey {
  const char *name;
  double Calibration::*field;
  double min, max;
};
/// Every key loadCalibration accepts (besides "measured"), in the order of
/// the struct; `count` receives how many.
const CalibrationKey *calibrationKeys(size_t &count);
/// The key named `name`, or null.
const CalibrationKey *findCalibrationKey(const std::string &name);

} // namespace hflow::placement

#endif // HFLOW_RUNTIME_SCHEMA_CALIBRATIONFILE_H
