//===- Trace.h - a Chrome/Perfetto trace of every rank's steps -------------===//
//
// `hflow-run --trace FILE`: each rank records complete events (microseconds
// since one origin, which the ranks agree on by a barrier) on two streams,
// compute and communication; at the end every rank writes its part next to
// FILE and rank 0 merges them into one trace (pid = rank, tid = stream).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_TRACE_H
#define HFLOW_RUNTIME_EXEC_TRACE_H

#include "runtime/exec/EngineSupport.h"

#include <string>
#include <vector>

namespace hflow::comm {
class Communicator;
}

namespace hflow::exec {

class TraceRecorder {
public:
  enum Stream { kCompute = 0, kCommunication = 1 };

  /// Records nothing when `file` is empty.
  explicit TraceRecorder(std::string file = "") : file_(std::move(file)) {}
  bool enabled() const { return !file_.empty(); }
  /// Event times count from here.
  void setOrigin(Clock::time_point t) { origin_ = t; }
  /// One event from `t0` to now.
  void span(const std::string &name, Stream stream, Clock::time_point t0);
  /// Writes this rank's part, then (rank 0) merges every part into the
  /// trace file and removes the parts. Collective over `world`. Throws
  /// RunError when a file cannot be written.
  void write(comm::Communicator &world, int rank, int worldSize, bool quiet) const;

private:
  struct Event {
    std::string name;
    int stream;
    double ts, dur;
  };
  std::string file_;
  Clock::time_point origin_ = Clock::now();
  std::vector<Event> events_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_TRACE_H
