//===- Trace.cpp - a Chrome/Perfetto trace of every rank's steps -----------===//
#include "runtime/exec/Trace.h"

#include "runtime/comm/Communicator.h"
#include "runtime/exec/EngineSupport.h"
#include "runtime/schema/OutputFiles.h"

#include <cstdio>
#include <fstream>
#include <iterator>

namespace hflow::exec {

void TraceRecorder::span(const std::string &name, Stream stream, Clock::time_point t0) {
  if (file_.empty())
    return;
  double ts = std::chrono::duration<double, std::micro>(t0 - origin_).count();
  double dur = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  events_.push_back({name, stream, ts, dur});
}

/// Where rank `rank` leaves its part for rank 0 to merge: hidden, beside the
/// trace file.
static std::string partPath(const std::string &file, int rank) {
  const size_t slash = file.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : file.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? file : file.substr(slash + 1);
  return dir + "." + name + ".rank" + std::to_string(rank) + ".hflow-part";
}

void TraceRecorder::write(comm::Communicator &world, int rank, int worldSize, bool quiet) const {
  const std::string part = partPath(file_, rank);
  {
    std::string text;
    for (const Event &e : events_) {
      std::string name;
      for (char ch : e.name)
        name += (ch == '"' || ch == '\\') ? ' ' : ch;
      char buf[160];
      std::snprintf(buf, sizeof buf, "\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f",
                    rank, e.stream, e.ts, e.dur);
      text += "{\"name\": \"" + name + "\", " + buf + "},\n";
    }
    if (std::string err = outputs::writeWholeFile(part, text); !err.empty())
      throw RunError("rank " + std::to_string(rank) + "'s part: " + err);
  }
  world.barrier();
  if (rank == 0) {
    std::string out = "{\"traceEvents\": [\n";
    for (int r = 0; r < worldSize; ++r) {
      for (int t = 0; t < 2; ++t)
        out += "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
               ", \"tid\": " + std::to_string(t) + ", \"args\": {\"name\": \"" +
               (t == 0 ? "compute" : "communication") + "\"}},\n";
      out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(r) +
             ", \"args\": {\"name\": \"rank " + std::to_string(r) + "\"}},\n";
      std::string pr = partPath(file_, r);
      std::ifstream in(pr, std::ios::binary);
      if (!in)
        continue; // another node's part (a multi-node run): not on this file system
      out.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (in.bad())
        throw RunError("cannot read rank " + std::to_string(r) + "'s part '" + pr + "'");
    }
    out += "{\"name\": \"end\", \"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"ts\": 0, \"s\": \"g\"}\n]}\n";
    if (std::string err = outputs::writeWholeFile(file_, out); !err.empty())
      throw RunError(err);
    for (int r = 0; r < worldSize; ++r)
      std::remove(partPath(file_, r).c_str());
    if (!quiet)
      std::printf("trace: %s (chrome://tracing or ui.perfetto.dev)\n", file_.c_str());
  }
  world.barrier();
}

} // namespace hflow::exec
