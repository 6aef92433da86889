//===- C10dCommunicator.cpp - Communicator over c10d (Gloo or NCCL) --------===//
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/comm/NcclBackend.h"
#include "runtime/comm/Rendezvous.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <cctype>
#include <arpa/inet.h>
#include <cstdlib>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace hflow::comm {

// --- choosing the address Gloo binds to --------------------------------------

static bool isLoopback(const std::string &addr) {
  if (addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1")
    return true;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  if (getaddrinfo(addr.c_str(), nullptr, &hints, &res) != 0 || !res)
    return false;
  bool lo = false;
  if (res->ai_family == AF_INET)
    lo = (ntohl(((sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
  else if (res->ai_family == AF_INET6)
    lo = IN6_IS_ADDR_LOOPBACK(&((sockaddr_in6 *)res->ai_addr)->sin6_addr);
  freeaddrinfo(res);
  return lo;
}

std::string glooHostFor(const std::string &masterAddr) {
  if (const char *h = std::getenv("HFLOW_GLOO_HOST"); h && *h)
    return h;
  if (masterAddr.empty() || isLoopback(masterAddr))
    return "127.0.0.1";
  // The local address of the interface that routes to the master: a UDP
  // connect() sends nothing but makes the kernel pick the source address.
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  std::string out = "127.0.0.1";
  if (getaddrinfo(masterAddr.c_str(), "9", &hints, &res) == 0 && res) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0) {
      if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        sockaddr_in local{};
        socklen_t len = sizeof local;
        if (getsockname(fd, (sockaddr *)&local, &len) == 0) {
          char buf[INET_ADDRSTRLEN];
          if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf))
            out = buf;
        }
      }
      close(fd);
    }
    freeaddrinfo(res);
  }
  return out;
}

// --- the communicator -----------------------------------------------------

/// What the argument checks need of a communicator.
struct BackendView {
  C10dBackendKind backend;
  const std::string *name;
};

struct C10dCommunicator::Impl {
  c10::intrusive_ptr<c10d::Store> rootStore; // the job's store (unprefixed)
  c10::intrusive_ptr<C10dBackend> pg;
  C10dOptions opts;
  std::string name;
  std::vector<int> globalRanks;
  int rank = 0, size = 1;
  int globalRank = 0;

  bool gloo() const { return opts.backend == C10dBackendKind::Gloo; }
  BackendView view() const { return {opts.backend, &name}; }

  [[noreturn]] void fail(const char *op, const std::exception &e) const {
    std::string m = oneLineError(e);
    std::string l = m;
    for (char &c : l)
      c = (char)std::tolower((unsigned char)c);
    if (l.find("timed out") != std::string::npos || l.find("timing out") != std::string::npos)
      m = "timed out after " + formatSeconds(opts.timeout) + " waiting for the " +
          std::to_string(size - 1) + " other rank" + (size == 2 ? "" : "s") +
          " of the group (" + m + ")";
    throw CommError(name + " " + op + ": " + m);
  }
  void wait(const c10::intrusive_ptr<c10d::Work> &w) const {
    // Send/recv works wait forever unless given a timeout.
    w->wait(opts.timeout);
  }
  /// NCCL: a one-element all-reduce on this process's GPU. It is the
  /// barrier (c10d's NCCL barrier guesses the device from the rank, which
  /// is wrong for a sub-group), and run once when the group is made it
  /// creates the group's communicator on every member together, the one
  /// grouped point-to-point messages then use (c10d makes it lazily,
  /// collectively, at the first operation that needs it).
  void deviceAllReduce() const {
    std::vector<at::Tensor> v{at::zeros(
        {1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, (c10::DeviceIndex)opts.cudaDevice))};
    c10d::AllreduceOptions ao;
    ao.reduceOp = c10d::ReduceOp::SUM;
    ao.timeout = opts.timeout;
    wait(pg->allreduce(v, ao));
  }
};

static std::unique_ptr<C10dCommunicator::Impl>
makeImpl(c10::intrusive_ptr<c10d::Store> root, const C10dOptions &o,
         const std::string &name, std::vector<int> globalRanks, int globalRank) {
  auto impl = std::make_unique<C10dCommunicator::Impl>();
  impl->rootStore = root;
  impl->opts = o;
  impl->name = name;
  impl->globalRanks = std::move(globalRanks);
  impl->globalRank = globalRank;
  auto it = std::find(impl->globalRanks.begin(), impl->globalRanks.end(),
                      globalRank);
  if (it == impl->globalRanks.end())
    throw CommError("group " + name + ": rank " + std::to_string(globalRank) +
                    " is not a member");
  impl->rank = (int)(it - impl->globalRanks.begin());
  impl->size = (int)impl->globalRanks.size();
  try {
    auto store = c10::make_intrusive<c10d::PrefixStore>("hflow/pg/" + name, root);
    if (o.backend == C10dBackendKind::Nccl) {
      impl->pg = makeNcclBackend(store, impl->rank, impl->size, o.cudaDevice, o.timeout);
      impl->deviceAllReduce();
    } else {
      auto po = c10d::ProcessGroupGloo::Options::create(o.timeout);
      po->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.host));
      po->threads = 1;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, impl->rank,
                                                             impl->size, po);
    }
  } catch (const CommError &) {
    throw;
  } catch (const std::exception &e) {
    throw CommError("group " + name + ": cannot connect its " +
                    std::to_string(impl->size) + " ranks (" +
                    (o.backend == C10dBackendKind::Nccl
                         ? "nccl on CUDA device " + std::to_string(o.cudaDevice)
                         : "gloo on " + o.host) +
                    "): " + oneLineError(e));
  }
  return impl;
}

C10dCommunicator::C10dCommunicator(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
C10dCommunicator::~C10dCommunicator() = default;

std::unique_ptr<C10dCommunicator>
C10dCommunicator::createWorld(const Rendezvous &rv, const C10dOptions &o) {
  std::vector<int> all(rv.worldSize());
  for (int r = 0; r < rv.worldSize(); ++r)
    all[r] = r;
  return std::unique_ptr<C10dCommunicator>(new C10dCommunicator(
      makeImpl(rv.store(), o, "world", std::move(all), rv.rank())));
}

std::unique_ptr<Communicator>
C10dCommunicator::makeSubgroup(const std::string &name,
                               const std::vector<int> &globalRanks) {
  for (size_t i = 1; i < globalRanks.size(); ++i)
    if (globalRanks[i] <= globalRanks[i - 1])
      throw CommError("group " + name + ": ranks must be ascending and distinct");
  return std::unique_ptr<Communicator>(new C10dCommunicator(makeImpl(
      impl_->rootStore, impl_->opts, name, globalRanks, impl_->globalRank)));
}

int C10dCommunicator::rank() const { return impl_->rank; }
int C10dCommunicator::size() const { return impl_->size; }
const std::vector<int> &C10dCommunicator::globalRanks() const {
  return impl_->globalRanks;
}
const std::string &C10dCommunicator::name() const { return impl_->name; }

static uint64_t nbytes(const at::Tensor &t) {
  return (uint64_t)t.numel() * (uint64_t)t.element_size();
}

// Gloo takes CPU tensors, NCCL CUDA tensors of this process's device: a
// tensor elsewhere is an error, never a hidden copy.
static void requireOnBackend(const char *op, const BackendView &g, const at::Tensor &t) {
  const bool nccl = g.backend == C10dBackendKind::Nccl;
  if (!t.defined() || !t.is_contiguous())
    throw CommError(*g.name + " " + op + ": tensor must be defined and contiguous");
  if (nccl ? !t.device().is_cuda() : !t.device().is_cpu())
    throw CommError(*g.name + " " + op + ": a tensor on " + t.device().str() + " given to " +
                    (nccl ? "NCCL, which takes CUDA tensors" : "Gloo, which takes CPU tensors"));
}

// Gloo (LibTorch 1.13) reduces and gathers no bfloat16 and no int16
// ("Invalid scalar type"); its gathers and broadcasts take float16, whose
// bytes they copy untouched. So gathers and broadcasts move bits: a
// bfloat16 tensor travels as float16 of the same bytes. A sum widens to
// float32 for the reduction and rounds back once (what NCCL's bfloat16
// all-reduce approximates with its own accumulation).
static bool is16BitFloat(const at::Tensor &t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}
static at::Tensor bitsOf(const at::Tensor &t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

void C10dCommunicator::allReduceSum(at::Tensor &t) {
  requireOnBackend("allReduceSum", impl_->view(), t);
  if (impl_->gloo() && is16BitFloat(t)) {
    at::Tensor wide = t.to(at::kFloat);
    const CommStats before = stats_;
    allReduceSum(wide);
    t.copy_(wide);
    // Counted at the payload's own width, as NCCL moves it: the widening is
    // Gloo's workaround, not traffic the plan should see.
    stats_ = before;
    count(allReduceBytes(nbytes(t), impl_->size));
    return;
  }
  try {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions ao;
    ao.reduceOp = c10d::ReduceOp::SUM;
    ao.timeout = impl_->opts.timeout;
    impl_->wait(impl_->pg->allreduce(v, ao));
  } catch (const std::exception &e) {
    impl_->fail("allReduceSum", e);
  }
  count(allReduceBytes(nbytes(t), impl_->size));
}

void C10dCommunicator::allGather(const at::Tensor &in,
                                 std::vector<at::Tensor> &out) {
  requireOnBackend("allGather", impl_->view(), in);
  if (impl_->gloo() && in.scalar_type() == at::kBFloat16) {
    allGather(bitsOf(in), out);
    for (at::Tensor &o : out)
      o = o.view(in.scalar_type());
    return;
  }
  try {
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int i = 0; i < impl_->size; ++i)
      outs[0].push_back(at::empty_like(in));
    std::vector<at::Tensor> ins{in};
    c10d::AllgatherOptions ao;
    ao.timeout = impl_->opts.timeout;
    impl_->wait(impl_->pg->allgather(outs, ins, ao));
    out = std::move(outs[0]);
  } catch (const std::exception &e) {
    impl_->fail("allGather", e);
  }
  count(allGatherBytes(nbytes(in), impl_->size));
}

at::Tensor C10dCommunicator::allGatherFlat(const at::Tensor &in) {
  std::vector<at::Tensor> parts;
  allGather(in.reshape({-1}), parts);
  auto flat = at::empty({(int64_t)parts.size(), in.numel()}, in.options());
  for (size_t i = 0; i < parts.size(); ++i)
    flat.select(0, (int64_t)i).copy_(parts[i]);
  return flat;
}

std::unique_ptr<PendingGather> C10dCommunicator::allGatherFlatAsync(const at::Tensor &inRaw) {
  at::Tensor in = inRaw.reshape({-1});
  requireOnBackend("allGather", impl_->view(), in);
  const at::ScalarType type = in.scalar_type();
  if (impl_->gloo())
    in = bitsOf(in);
  // The work runs on c10d's Gloo threads; wait() joins it.
  class GlooGather : public PendingGather {
  public:
    const Impl *impl = nullptr;
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<std::vector<at::Tensor>> outs;
    std::vector<at::Tensor> ins;
    at::Tensor wait() override {
      try {
        impl->wait(work);
      } catch (const std::exception &e) {
        impl->fail("allGather", e);
      }
      const int64_t n = ins[0].numel();
      at::Tensor flat = at::empty({(int64_t)outs[0].size(), n}, ins[0].options());
      for (size_t i = 0; i < outs[0].size(); ++i)
        flat.select(0, (int64_t)i).copy_(outs[0][i]);
      return flat.view(type);
    }
    at::ScalarType type = at::kFloat;
  };
  auto g = std::make_unique<GlooGather>();
  g->impl = impl_.get();
  g->type = type;
  g->ins = {in};
  g->outs.resize(1);
  for (int i = 0; i < impl_->size; ++i)
    g->outs[0].push_back(at::empty_like(in));
  try {
    c10d::AllgatherOptions ao;
    ao.timeout = impl_->opts.timeout;
    g->work = impl_->pg->allgather(g->outs, g->ins, ao);
  } catch (const std::exception &e) {
    impl_->fail("allGather", e);
  }
  count(allGatherBytes(nbytes(in), impl_->size));
  return g;
}

void C10dCommunicator::broadcast(at::Tensor &t, int root) {
  requireOnBackend("broadcast", impl_->view(), t);
  if (root < 0 || root >= impl_->size)
    throw CommError(impl_->name + " broadcast: root " + std::to_string(root) +
                    " is not a rank of the group");
  try {
    std::vector<at::Tensor> v{impl_->gloo() ? bitsOf(t) : t};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    bo.timeout = impl_->opts.timeout;
    impl_->wait(impl_->pg->broadcast(v, bo));
  } catch (const std::exception &e) {
    impl_->fail("broadcast", e);
  }
  count(broadcastBytes(nbytes(t), impl_->size, root == impl_->rank));
}

void C10dCommunicator::send(at::Tensor &t, int peer) {
  requireOnBackend("send", impl_->view(), t);
  if (peer < 0 || peer >= impl_->size || peer == impl_->rank)
    throw CommError(impl_->name + " send: invalid peer " + std::to_string(peer));
  try {
    std::vector<at::Tensor> v{t};
    impl_->wait(impl_->pg->send(v, peer, 0));
  } catch (const std::exception &e) {
    impl_->fail(("send to " + std::to_string(peer)).c_str(), e);
  }
  count({nbytes(t), 0});
}

void C10dCommunicator::recv(at::Tensor &t, int peer) {
  requireOnBackend("recv", impl_->view(), t);
  if (peer < 0 || peer >= impl_->size || peer == impl_->rank)
    throw CommError(impl_->name + " recv: invalid peer " + std::to_string(peer));
  try {
    std::vector<at::Tensor> v{t};
    impl_->wait(impl_->pg->recv(v, peer, 0));
  } catch (const std::exception &e) {
    impl_->fail(("recv from " + std::to_string(peer)).c_str(), e);
  }
  count({0, nbytes(t)});
}

namespace {
/// A send in flight, joined by wait().
class C10dPending : public PendingOp {
public:
  const C10dCommunicator::Impl *impl = nullptr;
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> holder; // alive until the send completed
  std::string what;
  bool done = false;
  void wait() override {
    if (done)
      return;
    try {
      impl->wait(work);
    } catch (const std::exception &e) {
      impl->fail(what.c_str(), e);
    }
    done = true;
  }
};
} // namespace

std::unique_ptr<PendingOp> C10dCommunicator::isend(const at::Tensor &t, int peer, int tag) {
  requireOnBackend("isend", impl_->view(), t);
  if (peer < 0 || peer >= impl_->size || peer == impl_->rank || tag < 2)
    throw CommError(impl_->name + " isend: invalid peer " + std::to_string(peer) + " or tag " +
                    std::to_string(tag));
  auto op = std::make_unique<C10dPending>();
  op->impl = impl_.get();
  op->holder = {t};
  op->what = "send to " + std::to_string(peer);
  try {
    op->work = impl_->pg->send(op->holder, peer, tag);
  } catch (const std::exception &e) {
    impl_->fail(op->what.c_str(), e);
  }
  count({nbytes(t), 0});
  return op;
}

int C10dCommunicator::recvAny(at::Tensor &t, const std::vector<int> &peers, int tag) {
  requireOnBackend("recvAny", impl_->view(), t);
  if (peers.empty() || tag < 2)
    throw CommError(impl_->name + " recvAny: no peer, or tag " + std::to_string(tag));
  for (int q : peers)
    if (q < 0 || q >= impl_->size || q == impl_->rank)
      throw CommError(impl_->name + " recvAny: invalid peer " + std::to_string(q));
  if (peers.size() > 1 && !impl_->gloo())
    throw CommError(impl_->name + ": NCCL receives from one peer at a time, not from any of " +
                    std::to_string(peers.size()));
  int src = peers[0];
  try {
    std::vector<at::Tensor> v{t};
    c10::intrusive_ptr<c10d::Work> w = peers.size() == 1 ? impl_->pg->recv(v, src, tag)
                                                         : impl_->pg->recvAnysource(v, tag);
    impl_->wait(w);
    if (peers.size() > 1)
      src = w->sourceRank();
  } catch (const std::exception &e) {
    impl_->fail("recv", e);
  }
  if (std::find(peers.begin(), peers.end(), src) == peers.end())
    throw CommError(impl_->name + " recv: a message under tag " + std::to_string(tag) +
                    " came from rank " + std::to_string(src) + ", which this rank does not "
                    "expect one from");
  count({0, nbytes(t)});
  return src;
}

void C10dCommunicator::exchange(std::vector<std::pair<int, at::Tensor>> &sends,
                                std::vector<std::pair<int, at::Tensor>> &recvs) {
  OpBytes b;
  auto check = [&](const char *what, std::pair<int, at::Tensor> &m) {
    requireOnBackend(what, impl_->view(), m.second);
    if (m.first < 0 || m.first >= impl_->size || m.first == impl_->rank)
      throw CommError(impl_->name + " " + what + ": invalid peer " +
                      std::to_string(m.first));
  };
  for (auto &m : recvs) {
    check("exchange (receive)", m);
    b.received += nbytes(m.second);
  }
  for (auto &m : sends) {
    check("exchange (send)", m);
    b.sent += nbytes(m.second);
  }
  if (sends.empty() && recvs.empty())
    return;
  // One tag for every message: messages to or from one peer match in the
  // order they are posted (Gloo keeps a pair's messages of one tag in
  // order), which is NCCL's rule, so the two backends agree.
  constexpr int kTag = 1;
  std::vector<std::vector<at::Tensor>> holders; // kept alive until waited
  holders.reserve(sends.size() + recvs.size());
  // Every receive, then every send, posted; their works in that order (in
  // an NCCL group c10d may return none per operation: the group's is the
  // one to wait for).
  auto postAll = [&] {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto &m : recvs) {
      holders.push_back({m.second});
      works.push_back(impl_->pg->recv(holders.back(), m.first, kTag));
    }
    for (auto &m : sends) {
      holders.push_back({m.second});
      works.push_back(impl_->pg->send(holders.back(), m.first, kTag));
    }
    return works;
  };
  try {
    if (impl_->gloo()) {
      for (auto &w : postAll())
        impl_->wait(w);
    } else {
      // NCCL: one group (ncclGroupStart/End through c10d's coalescing), so
      // no order of posting can deadlock.
      impl_->pg->startCoalescing();
#if TORCH_VERSION_MAJOR >= 2
      (void)postAll();
      if (c10::intrusive_ptr<c10d::Work> group = impl_->pg->endCoalescing())
        impl_->wait(group);
#else
      std::vector<c10::intrusive_ptr<c10d::Work>> works = postAll();
      impl_->pg->endCoalescing(works);
      for (auto &w : works)
        impl_->wait(w);
#endif
    }
  } catch (const CommError &) {
    throw;
  } catch (const std::exception &e) {
    impl_->fail("exchange", e);
  }
  count(b);
}

void C10dCommunicator::barrier() {
  try {
    if (impl_->gloo()) {
      c10d::BarrierOptions bo;
      bo.timeout = impl_->opts.timeout;
      impl_->wait(impl_->pg->barrier(bo));
    } else {
      impl_->deviceAllReduce();
    }
  } catch (const std::exception &e) {
    impl_->fail("barrier", e);
  }
  count({});
}

} // namespace hflow::comm
