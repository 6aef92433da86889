//===- Trace.cpp - a Chrome/Perfetto trace of every rank's steps -----------===//
#include "runtime/exec/Trace.h"

#include "runtime/comm/Communicator.h"

#include <cstdio>
#include <fstream>

namespace hflow::exec {

void TraceRecorder::span(const std::string &name, Stream stream, Clock::time_point t0) {
  if (file_.empty())
    return;
  double ts = std::chrono::duration<double, std::micro>(t0 - origin_).count();
  double dur = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  events_.push_back({name, stream, ts, dur});
}

void TraceRecorder::write(comm::Communicator &world, int rank, int worldSize, bool quiet) const {
  const std::string part = file_ + ".rank" + std::to_string(rank);
  {
    std::ofstream out(part);
    if (!out)
      throw RunError("cannot write the trace part '" + part + "'");
    for (const Event &e : events_) {
      std::string name;
      for (char ch : e.name)
        name += (ch == '"' || ch == '\\') ? ' ' : ch;
      char buf[160];
      std::snprintf(buf, sizeof buf, "\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f",
                    rank, e.stream, e.ts, e.dur);
      out << "{\"name\": \"" << name << "\", " << buf << "},\n";
    }
  }
  world.barrier();
  if (rank == 0) {
    std::ofstream out(file_);
    if (!out)
      throw RunError("cannot write the trace file '" + file_ + "'");
    out << "{\"traceEvents\": [\n";
    for (int r = 0; r < worldSize; ++r) {
      for (int t = 0; t < 2; ++t)
        out << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << r
            << ", \"tid\": " << t << ", \"args\": {\"name\": \""
            << (t == 0 ? "compute" : "communication") << "\"}},\n";
      out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
          << ", \"args\": {\"name\": \"rank " << r << "\"}},\n";
      std::string pr = file_ + ".rank" + std::to_string(r);
      std::ifstream in(pr);
      if (!in)
        continue; // another node's part (a multi-node run): not on this file system
      out << in.rdbuf();
      std::remove(pr.c_str());
    }
    out << "{\"name\": \"end\", \"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"ts\": 0, \"s\": \"g\"}\n]}\n";
    if (!quiet)
      std::printf("trace: %s (chrome://tracing or ui.perfetto.dev)\n", file_.c_str());
  }
  world.barrier();
}

} // namespace hflow::exec
