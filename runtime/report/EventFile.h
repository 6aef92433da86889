//===- EventFile.h - TensorBoard event files --------------------------------===//
//
// `hflow-run --tensorboard DIR`: the run's scalars as TensorBoard event
// files. A file is a sequence of TFRecords (a little-endian uint64 length,
// the masked CRC-32C of those 8 bytes, the payload, the masked CRC-32C of
// the payload), each payload an Event message (tensorboard_event.proto,
// encoded by the protobuf library): first the file version, then one
// Event per step with a Summary of simple values.
//
// Resuming continues the same curves: the first step a resumed run writes
// drops every record at that step or later from the files already in DIR
// (what the crashed run wrote after its last checkpoint), so no step is
// written twice. Whether a fresh run may use a DIR that holds another run's
// event files is hflow-run's claim on the folder (runtime/exec/RunOutputs.h:
// refused unless --resume or --overwrite); a new file never replaces one.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_REPORT_EVENTFILE_H
#define HFLOW_RUNTIME_REPORT_EVENTFILE_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hflow::report {

/// Whether this build writes event files (protobuf, protoc and Boost's
/// headers were found); without them every function below throws
/// std::runtime_error saying what to install.
bool eventFilesBuilt();

/// CRC-32C (Castagnoli) of `n` bytes, and TFRecord's masking of it.
uint32_t crc32c(const void *data, size_t n);
uint32_t maskedCrc32c(const void *data, size_t n);

/// One record's frame around `payload`.
std::string tfRecord(const std::string &payload);

/// The payloads of a TFRecord file's records, each frame's CRCs checked;
/// throws std::runtime_error naming the file and the record's offset.
std::vector<std::string> readTfRecords(const std::string &path);

class EventWriter {
public:
  /// Opens DIR (created if missing). `resume`: DIR may hold this run's
  /// earlier files; otherwise it must hold no event file. Throws
  /// std::runtime_error with the path and what is wrong.
  EventWriter(const std::string &dir, bool resume);
  ~EventWriter();
  EventWriter(const EventWriter &) = delete;
  EventWriter &operator=(const EventWriter &) = delete;

  /// One Event at `step` with a simple value per (tag, value), flushed.
  void scalars(int64_t step, double wallTime,
               const std::vector<std::pair<std::string, double>> &values);

  const std::string &path() const { return path_; }

private:
  void open(int64_t firstStep);
  void write(const std::string &payload);

  std::string dir_, path_;
  bool resume_ = false;
  int fd_ = -1;       ///< the open event file
  uint64_t size_ = 0; ///< its bytes: whole records only
};

} // namespace hflow::report

#endif // HFLOW_RUNTIME_REPORT_EVENTFILE_H
