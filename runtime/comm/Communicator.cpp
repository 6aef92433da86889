//===- Communicator.cpp - byte conventions and error cleanup ---------------===//
#include "runtime/comm/Communicator.h"

#include <ATen/core/Tensor.h>

#include <c10/util/Exception.h>
#include <c10/macros/Macros.h> // C10_USE_GLOG: whether c10 logs through glog
#include <c10/util/Logging.h>
#if defined(C10_USE_GLOG)
#include <glog/logging.h>
#endif

namespace hflow::comm {

namespace {
/// A gather that already ran.
class DoneGather : public PendingGather {
public:
  explicit DoneGather(at::Tensor t) : t_(std::move(t)) {}
  at::Tensor wait() override { return t_; }

private:
  at::Tensor t_;
};
} // namespace

std::unique_ptr<PendingOp> Communicator::isend(const at::Tensor &, int, int) {
  throw CommError(name() + ": this backend has no non-blocking point-to-point messages");
}

int Communicator::recvAny(at::Tensor &, const std::vector<int> &, int) {
  throw CommError(name() + ": this backend has no tagged receive from any of several ranks");
}

std::unique_ptr<PendingGather> Communicator::allGatherFlatAsync(const at::Tensor &in) {
  return std::make_unique<DoneGather>(allGatherFlat(in));
}


OpBytes allReduceBytes(uint64_t payload, int p) {
  if (p <= 1)
    return {};
  uint64_t b = 2 * (uint64_t)(p - 1) * payload / (uint64_t)p;
  return {b, b};
}

OpBytes allGatherBytes(uint64_t perRank, int p) {
  if (p <= 1)
    return {};
  uint64_t b = (uint64_t)(p - 1) * perRank;
  return {b, b};
}

OpBytes broadcastBytes(uint64_t payload, int p, bool isRoot) {
  if (p <= 1)
    return {};
  return isRoot ? OpBytes{payload, 0} : OpBytes{0, payload};
}

std::string oneLine(const std::string &msg) {
  std::string s = msg;
  // c10::Error::what() appends "Exception raised from ..." and frames.
  for (const char *cut : {"\nException raised from", "Exception raised from"}) {
    auto p = s.find(cut);
    if (p != std::string::npos)
      s.resize(p);
  }
  // Several lines: keep the first non-empty one.
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return "unknown error";
  s = s.substr(b);
  auto nl = s.find('\n');
  if (nl != std::string::npos)
    s.resize(nl);
  // gloo: "[/path/to/pair.cc:589] Connection closed by peer ..."
  if (!s.empty() && s[0] == '[') {
    auto close = s.find("] ");
    if (close != std::string::npos && s.find(':') < close)
      s = s.substr(close + 2);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '.' ||
                        s.back() == '!'))
    s.pop_back();
  return s;
}

std::string oneLineError(const std::exception &e) {
  if (auto *ce = dynamic_cast<const c10::Error *>(&e))
    return oneLine(ce->what_without_backtrace());
  return oneLine(e.what());
}

void setLibraryLogging(bool verbose) {
#if defined(C10_USE_GLOG)
  // Debian's LibTorch logs through glog.
  FLAGS_minloglevel = verbose ? google::GLOG_INFO : google::GLOG_FATAL;
#else
  // A PyTorch wheel's LibTorch logs through c10's own logger.
  FLAGS_caffe2_log_level = verbose ? 0 : 3;
#endif
}

} // namespace hflow::comm
