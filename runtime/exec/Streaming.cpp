//===- Streaming.cpp - a rollout's groups into the steps that read them ---===//
//
// Phase.stream_steps (`stream: true`, the synchronous schedule, the actor
// generating on ranks of its own): a generation rank sends each group's
// rows to the ranks of the stream steps that take them as soon as every
// row of the group ended, while its engine goes on with the longest
// responses; a consumer runs the stream steps on each group's rows as they
// come, so the reference's log-probs, the critic's values and the scores
// are computed under the generation instead of after it. The rows, and
// the groups' order within one rank's share, are RowSchedule's transfers
// (streamed ones), cut at group boundaries; each piece travels as a header
// (its first row and end) and its packed rows, under its own message tag.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/IterationRunner.h"
#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace hflow::exec {

using namespace hflow::plan;

namespace {
// A piece's header (its first row and end), then its rows (exchange's is 1).
constexpr int kHeadTag = 3, kBodyTag = 4;
} // namespace

void IterationRunner::generateStreaming(PhaseRt &ph, int s, int64_t it) {
  StreamOut out;
  std::vector<int> dsts;
  for (const Xfer &x : ph.xfers) {
    if (!x.streamed || x.src != j_.rank)
      continue;
    for (int64_t r = x.lo; r < x.hi;) {
      const int64_t e = std::min(x.hi, (r / ph.n + 1) * ph.n); // the group's end
      out.pieces.push_back({r, e});
      dsts.push_back(x.dst);
      r = e;
    }
  }
  std::vector<std::unique_ptr<comm::PendingOp>> sent; // (each holds its buffer)
  out.send = [&](Val &ro, size_t k) {
    const Span q = out.pieces[k];
    at::Tensor head = at::tensor({q.lo, q.hi}, at::TensorOptions().dtype(at::kLong))
                          .to(models::engineDevice());
    at::Tensor body = packRows(ro, ph.widths(), q.lo, q.hi);
    sent.push_back(comms_.world->isend(head, dsts[k], kHeadTag));
    sent.push_back(comms_.world->isend(body, dsts[k], kBodyTag));
  };
  try {
    runStep(ph, s, it, "", out.pieces.empty() ? nullptr : &out);
  } catch (...) {
    // The run ends; the sends posted may still read their buffers, which
    // stay alive until the process exits.
    static std::vector<std::unique_ptr<comm::PendingOp>> abandoned;
    for (auto &op : sent)
      abandoned.push_back(std::move(op));
    throw;
  }
  auto tw = Clock::now();
  for (auto &op : sent)
    op->wait();
  if (!sent.empty())
    trace_.span("rows streamed", TraceRecorder::kCommunication, tw);
  const size_t expected = 2 * out.pieces.size();
  if (sent.size() != expected)
    throw RunError(describe(s) + ": streamed " + std::to_string(sent.size() / 2) + " of " +
                   std::to_string(out.pieces.size()) + " groups' rows");
}

void IterationRunner::receiveStream(PhaseRt &ph, int64_t it) {
  streamMs_.clear();
  streamWaitMs_.clear();
  double waited = 0;
  std::map<int, int64_t> left; // rows still to come, by generation rank
  for (const Xfer &x : ph.xfers)
    if (x.streamed && x.dst == j_.rank)
      left[x.src] += x.hi - x.lo;
  if (left.empty())
    return;
  const int64_t total = setup_.rows->rowsOfValue(ph, ph.rolloutValue);
  std::vector<char> got((size_t)total, 0);
  if (!vals_.count(ph.rolloutValue))
    vals_.emplace(ph.rolloutValue, makeVal(BatchKind::Rollout, total, ph.widths()));
  while (!left.empty()) {
    // The next piece from whichever generation rank sent one first.
    std::vector<int> peers;
    for (auto &[q, n] : left)
      peers.push_back(q);
    progress_.step = ph.genStep;
    progress_.activity = "receiving the rollout's groups as they finish";
    auto tw = Clock::now();
    at::Tensor head = at::empty({2}, models::onEngine(at::kLong));
    const int q = comms_.world->recvAny(head, peers, kHeadTag);
    at::Tensor h = head.cpu();
    const int64_t lo = h[0].item<int64_t>(), hi = h[1].item<int64_t>();
    // Rows this rank waits for from that rank, not received yet.
    bool ok = lo >= 0 && hi <= total && lo < hi && hi - lo <= left[q];
    bool inXfer = false;
    for (const Xfer &x : ph.xfers)
      inXfer = inXfer ||
               (x.streamed && x.src == q && x.dst == j_.rank && x.lo <= lo && hi <= x.hi);
    for (int64_t r = lo; ok && r < hi; ++r)
      ok = !got[(size_t)r];
    if (!ok || !inXfer)
      throw RunError(ph.name + " iteration " + std::to_string(it + 1) + ": rank " +
                     std::to_string(q) + " streamed rows " + std::to_string(lo) + "-" +
                     std::to_string(hi - 1) + " of the rollout, which this rank does not "
                     "wait for from it");
    at::Tensor body = at::empty({packedBytes(BatchKind::Rollout, ph.widths(), hi - lo)},
                                models::onEngine(at::kByte));
    comms_.world->recvAny(body, {q}, kBodyTag);
    unpackRows(vals_.at(ph.rolloutValue), ph.widths(), lo, hi, body);
    waited += msSince(tw);
    progress_.activity.clear();
    for (int64_t r = lo; r < hi; ++r)
      got[(size_t)r] = 1;
    if ((left[q] -= hi - lo) == 0)
      left.erase(q);
    runChunk(ph, it, {lo, hi});
  }
  for (int s : ph.streamSteps)
    if (setup_.mySteps.count(s)) {
      streamWaitMs_[s] = waited;
      break;
    }
  // Each stream step's check compares what the whole step computed.
  for (int s : ph.streamSteps) {
    if (!setup_.mySteps.count(s))
      continue;
    const Span mine = setup_.rows->rowsFor(ph, s, ph.rolloutValue, j_.rank);
    const int out = step(s).outputs()->Get(0);
    auto v = vals_.find(out);
    if (v == vals_.end())
      throw RunError(describe(s) + ": no streamed rows reached it");
    record_.digests[s] =
        v->second.x().narrow(0, mine.lo, mine.hi - mine.lo).to(at::kDouble).sum().item<double>();
    ++progress_.stepsRun;
  }
}

/// The stream steps of this rank on rows `rows` (those of each step's
/// share), in plan order.
void IterationRunner::runChunk(PhaseRt &ph, int64_t it, Span rows) {
  for (int s : ph.streamSteps) {
    if (!setup_.mySteps.count(s))
      continue;
    const Span mine = setup_.rows->rowsFor(ph, s, ph.rolloutValue, j_.rank);
    const Span part{std::max(rows.lo, mine.lo), std::min(rows.hi, mine.hi)};
    if (part.lo >= part.hi)
      continue;
    progress_.step = s;
    auto tc = Clock::now();
    runCompute(ph, s, it, nullptr, part);
    streamMs_[s] += msSince(tc);
    trace_.span(setup_.rows->callName(s) + " (rows " + std::to_string(part.lo) + "-" +
                    std::to_string(part.hi - 1) + ")",
                TraceRecorder::kCompute, tc);
  }
  progress_.step = ph.genStep; // (still receiving the generate step's rows)
}

} // namespace hflow::exec
