//===- Watchdog.cpp - what a rank does before the rendezvous is bounded too ---===//
#include "runtime/exec/Watchdog.h"

#include <cstdio>
#include <unistd.h>

namespace hflow::exec {

Watchdog::Watchdog(std::chrono::milliseconds limit, std::string who)
    : limit_(limit), who_(std::move(who)) {
  t_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::phase(std::string what) {
  std::lock_guard<std::mutex> g(m_);
  what_ = std::move(what);
  deadline_ = std::chrono::steady_clock::now() + limit_;
  armed_ = true;
  cv_.notify_all();
}

std::string Watchdog::current() const {
  std::lock_guard<std::mutex> g(m_);
  return what_;
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
    cv_.notify_all();
  }
  if (t_.joinable())
    t_.join();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> g(m_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(g);
      continue;
    }
    const auto deadline = deadline_;
    if (cv_.wait_until(g, deadline) == std::cv_status::timeout && !stop_ &&
        deadline_ == deadline) {
      // The phase is stuck: nothing it holds can be trusted to unwind, so
      // the process ends here, saying what it was doing.
      std::fflush(stdout);
      std::fprintf(stderr,
                   "hflow-run: error: %s: before starting: %s did not finish within "
                   "--timeout %.0f s; stopped\n",
                   who_.c_str(), what_.c_str(), limit_.count() / 1000.0);
      std::fflush(stderr);
      ::_exit(1);
    }
  }
}

} // namespace hflow::exec
