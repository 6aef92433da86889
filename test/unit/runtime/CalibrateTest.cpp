//===- CalibrateTest.cpp - hflow-run --calibrate: derived constants, the file ===//
#include "runtime/exec/Calibrate.h"
#include "runtime/schema/CalibrationFile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

using namespace hflow::exec;
namespace pl = hflow::placement;

namespace {

/// Round figures: a 1 GFLOP/s, 1 GB/s device with a 10 GB/s link and a
/// model of 1,000 parameters.
CalibrationMeasurement figures() {
  CalibrationMeasurement m;
  m.nominalFlops = 1e9;
  m.nominalBandwidth = 1e9;
  m.nominalIntra = 10e9;
  m.params = 1000;
  m.trainTokens = m.forwardTokens = m.prefillTokens = 512;
  m.trainSeconds = 8 * 1000 * 512 / 1e9 / 0.25;  // 25% of peak
  m.forwardSeconds = 2 * 1000 * 512 / 1e9 / 0.5; // 50%
  m.prefillSeconds = 2 * 1000 * 512 / 1e9 / 0.4; // 40%
  m.decodeNullSeconds = 1e-4;
  m.decodeBytes = 2e5;
  m.decodeSeconds = 1e-4 + 2e5 / (1e9 * 0.2); // 20% of the bandwidth
  m.decodeComputeFlops = 2 * 1000 * 64;
  m.decodeComputeSeconds = 1e-4 + 128000 / (1e9 * 0.1); // 10%
  m.pingPongSeconds = 6e-5;
  m.bigBytes = 16 << 20;
  m.bigSeconds = 3e-5 + double(16 << 20) / (10e9 * 0.05); // 5% of the link
  return m;
}

double valueOf(const std::vector<DerivedConstant> &d, const std::string &key) {
  for (const DerivedConstant &c : d)
    if (key == c.key)
      return c.value;
  ADD_FAILURE() << "no " << key;
  return NAN;
}

} // namespace

TEST(Calibrate, DerivesEveryMeasuredConstant) {
  auto d = deriveCalibration(figures());
  EXPECT_EQ(d.size(), 10u);
  EXPECT_NEAR(valueOf(d, "trainEfficiency"), 0.25, 1e-12);
  EXPECT_NEAR(valueOf(d, "forwardEfficiency"), 0.5, 1e-12);
  EXPECT_NEAR(valueOf(d, "prefillEfficiency"), 0.4, 1e-12);
  EXPECT_NEAR(valueOf(d, "decodeBandwidthEfficiency"), 0.2, 1e-12);
  EXPECT_NEAR(valueOf(d, "decodeComputeEfficiency"), 0.1, 1e-12);
  EXPECT_NEAR(valueOf(d, "decodeStepOverhead"), 1e-4, 1e-18);
  EXPECT_NEAR(valueOf(d, "linkEfficiency"), 0.05, 1e-12);
  EXPECT_NEAR(valueOf(d, "alphaIntra"), 3e-5, 1e-18);
  EXPECT_EQ(valueOf(d, "trainFlopsPerParamToken"), 8);
  EXPECT_EQ(valueOf(d, "forwardFlopsPerParamToken"), 2);
  for (const DerivedConstant &c : d)
    EXPECT_FALSE(c.clamped) << c.key;
}

TEST(Calibrate, ClampsIntoTheAcceptedRange) {
  CalibrationMeasurement m = figures();
  m.forwardSeconds /= 4;                 // 200% of peak: clamped to 1
  m.decodeSeconds = m.decodeNullSeconds; // all overhead: bandwidth "infinite"
  m.bigSeconds = 1e-6;                   // faster than the latency: noise
  auto d = deriveCalibration(m);
  for (const DerivedConstant &c : d) {
    const std::string k = c.key;
    if (k == "forwardEfficiency") {
      EXPECT_TRUE(c.clamped);
      EXPECT_EQ(c.value, 1);
      EXPECT_NEAR(c.raw, 2, 1e-12);
    } else if (k == "decodeBandwidthEfficiency" || k == "linkEfficiency") {
      EXPECT_TRUE(c.clamped) << k;
      EXPECT_EQ(c.value, 1) << k;
    } else {
      EXPECT_FALSE(c.clamped) << k;
    }
  }
}

TEST(Calibrate, TheFileLoads) {
  CalibrationMeasurement m = figures();
  auto d = deriveCalibration(m);
  std::string json = calibrationJson(m, d);
  pl::Calibration c;
  std::string err;
  ASSERT_TRUE(pl::loadCalibration(json, c, err)) << err << "\n" << json;
  EXPECT_NEAR(c.trainEfficiency, 0.25, 1e-6);
  EXPECT_NEAR(c.linkEfficiency, 0.05, 1e-6);
  EXPECT_NEAR(c.alphaIntra, 3e-5, 1e-11);
  EXPECT_DOUBLE_EQ(c.alphaInter, pl::Calibration().alphaInter); // not measured
  EXPECT_NE(json.find("\"measured\": {"), std::string::npos);
  EXPECT_NE(json.find("\"train_seconds\": "), std::string::npos);
}
