//===- EventFileTest.cpp - TFRecord framing and CRC-32C ---------------------===//
#include "runtime/report/EventFile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

using namespace hflow::report;

TEST(EventFile, Crc32cKnownValues) {
  if (!eventFilesBuilt())
    GTEST_SKIP() << "built without protobuf/Boost";
  // The CRC-32C check value (RFC 3720's polynomial) and iSCSI's test
  // vector of 32 zero bytes.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(maskedCrc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EventFile, RecordsRoundTripAndDamageIsNamed) {
  if (!eventFilesBuilt())
    GTEST_SKIP() << "built without protobuf/Boost";
  const std::string path =
      (std::filesystem::temp_directory_path() / "hflow-eventfile-test.tfrecord").string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string a = tfRecord("first"), b = tfRecord(std::string(300, 'x'));
    out << a << b;
  }
  auto recs = readTfRecords(path);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0], "first");
  EXPECT_EQ(recs[1], std::string(300, 'x'));
  // A flipped payload byte of the second record: named by its offset.
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(16 + 5 + 12 + 7);
    f.put('y');
  }
  try {
    readTfRecords(path);
    FAIL() << "a damaged record was read";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("the record at byte 21 has a wrong payload checksum"),
              std::string::npos)
        << e.what();
  }
  // Cut short.
  std::filesystem::resize_file(path, 30);
  EXPECT_THROW(readTfRecords(path), std::runtime_error);
  std::remove(path.c_str());
}
