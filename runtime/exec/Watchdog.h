//===- Watchdog.h - what a rank does before the rendezvous is bounded too ----===//
//
// --timeout bounds the rendezvous and every collective; before them a rank
// reads its tokenizer, renders its prompts and loads its weights alone, where
// a hostile file (a chat template that loops) or a stuck file system would
// hang it with nothing to notice. The watchdog gives each phase of that work
// --timeout: a phase that does not finish in time stops the process with the
// phase named (a new phase starts the clock again). It also names what was
// being done when a rank runs out of memory there.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WATCHDOG_H
#define HFLOW_RUNTIME_EXEC_WATCHDOG_H

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace hflow::exec {

class Watchdog {
public:
  /// `who`: "rank 1" (the error's prefix). Not armed until the first phase.
  Watchdog(std::chrono::milliseconds limit, std::string who);
  ~Watchdog(); ///< stops watching
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

  /// A new phase ("reading the tokenizer 'q/'"): its own --timeout.
  void phase(std::string what);
  /// The phase now ("" before the first).
  std::string current() const;
  /// Stops watching (the rendezvous has a timeout of its own).
  void stop();

private:
  void watch();
  std::chrono::milliseconds limit_;
  std::string who_, what_;
  std::chrono::steady_clock::time_point deadline_;
  bool armed_ = false, stop_ = false;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::thread t_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WATCHDOG_H
