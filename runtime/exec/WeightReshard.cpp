//===- WeightReshard.cpp - the planned weight reshard ---------------------===//
//
// The hybrid engine's transition of an actor from its training layout to its
// generation layout, exactly as the plan lists it (docs/reshard.md): every
// rank sends and receives the planned element ranges (one message per peer),
// cut from its whole weights or its shards, into its generation copy or its
// generation shards; the bytes the communicator counted must equal the
// plan's (WeightReshard.h). Also the whole copies a sharded actor builds
// for a moment (RoleRuntime.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/WeightReshard.h"
#include "runtime/models/Device.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

namespace hflow::exec {

using namespace hflow::plan;

namespace {

/// One reshard's planned transfers as this rank takes part in them: the
/// pieces it sends (cut by `piece`, as bfloat16 on a bf16 wire) and
/// receives, exchanged with every peer at once. `recvs` holds, per source,
/// the received numbers (widened to float32) in the order of `in[source]`.
struct PieceExchange {
  std::map<int, std::vector<const WeightTransfer *>> in;
  std::vector<std::pair<int, at::Tensor>> recvs;
  int64_t plannedIn = 0, measured = 0;
  int64_t plannedOut = 0, measuredOut = 0; ///< posted: the bytes this rank sent
  double ms = 0;
};

/// A posted exchange (off_policy 2, WeightResharder::run): each sender
/// posts, per receiver, its policy version (one int64) and then its
/// pieces under `tag`, and keeps them in flight in `ops`/`bufs`; each
/// receiver takes both from every sender in turn (`versions`).
struct Posting {
  int tag = 0;
  int64_t version = 0;
  std::vector<std::unique_ptr<comm::PendingOp>> *ops = nullptr;
  std::vector<at::Tensor> *bufs = nullptr;
  std::vector<int64_t> versions;
};


/// The dtype a role's weights are held in (what arrives is stored as it).
at::ScalarType heldType(const RoleRt &rr) {
  return rr.lm ? rr.lm->config().dtype : rr.model ? rr.model->config().dtype : at::kFloat;
}

/// Sends and receives the plan's pieces. They travel in `held`, the
/// weights' dtype, or as bfloat16 with a bf16 wire (rounded to nearest
/// even), and arrive as `held`.
PieceExchange exchangePieces(const Reshard &rs, Communicator &c, int me, bool bf16Wire,
                             int64_t wireBytes, at::ScalarType held,
                             const std::function<at::Tensor(const WeightTransfer *)> &piece,
                             const std::function<int(int)> &peerOf = nullptr,
                             Posting *post = nullptr) {
  PieceExchange x;
  std::map<int, std::vector<const WeightTransfer *>> out;
  if (rs.transfers())
    for (const WeightTransfer *t : *rs.transfers()) {
      if (t->src() == me) {
        out[t->dst()].push_back(t);
        x.plannedOut += (t->row1() - t->row0()) * (t->col1() - t->col0()) * wireBytes;
      }
      if (t->dst() == me) {
        x.in[t->src()].push_back(t);
        x.plannedIn += (t->row1() - t->row0()) * (t->col1() - t->col0()) * wireBytes;
      }
    }
  const at::ScalarType wire = bf16Wire ? at::kBFloat16 : held;
  std::vector<std::pair<int, at::Tensor>> sends;
  for (auto &[peer, ts] : out) {
    std::vector<at::Tensor> parts;
    for (const WeightTransfer *t : ts)
      parts.push_back(piece(t).reshape({-1}));
    at::Tensor buf = at::cat(parts);
    sends.push_back({peerOf ? peerOf(peer) : peer, buf.to(wire).contiguous()});
  }
  for (auto &[peer, ts] : x.in) {
    int64_t n = 0;
    for (const WeightTransfer *t : ts)
      n += (t->row1() - t->row0()) * (t->col1() - t->col0());
    x.recvs.push_back(
        {peer, at::empty({n}, models::onEngine(wire))});
  }
  const uint64_t before = c.bytesReceived(), sentBefore = c.bytesSent();
  auto t0 = Clock::now();
  if (post) {
    const auto peer = [&](int i) { return peerOf ? peerOf(i) : i; };
    const int64_t versionBytes = (int64_t)sizeof(int64_t);
    for (auto &[to, buf] : sends) {
      at::Tensor v = at::full({1}, post->version, models::onEngine(at::kLong));
      post->ops->push_back(c.isend(v, to, post->tag));
      post->ops->push_back(c.isend(buf, to, post->tag));
      post->bufs->push_back(std::move(v));
      post->bufs->push_back(buf);
    }
    for (auto &[from, buf] : x.recvs) {
      at::Tensor v = at::empty({1}, models::onEngine(at::kLong));
      c.recvAny(v, {peer(from)}, post->tag);
      post->versions.push_back(v.cpu().item<int64_t>());
      c.recvAny(buf, {peer(from)}, post->tag);
    }
    x.ms = msSince(t0);
    x.measured = (int64_t)(c.bytesReceived() - before) - versionBytes * (int64_t)x.recvs.size();
    x.measuredOut = (int64_t)(c.bytesSent() - sentBefore) - versionBytes * (int64_t)sends.size();
    for (auto &[from, buf] : x.recvs)
      buf = buf.to(held);
    return x;
  }
  if (peerOf) {
    // The plan's rank indices are not the communicator's: exchange under
    // the communicator's, keep the plan's for the caller.
    std::vector<std::pair<int, at::Tensor>> recvs;
    for (auto &[peer, buf] : x.recvs)
      recvs.push_back({peerOf(peer), buf});
    c.exchange(sends, recvs);
  } else {
    c.exchange(sends, x.recvs);
  }
  x.ms = msSince(t0);
  x.measured = (int64_t)(c.bytesReceived() - before);
  for (auto &[peer, buf] : x.recvs)
    buf = buf.to(held);
  return x;
}

} // namespace

namespace {

/// The plan's parameters of a reshard against the model's: names, shapes
/// and element size.
void checkReshardParams(const Reshard &rs,
                        const std::vector<std::pair<std::string, at::Tensor>> &named,
                        const std::string &what) {
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs.params()->Get(k);
    const at::Tensor &t = named[k].second;
    if (named[k].first != str(wp->name()) || t.size(0) != wp->rows() ||
        t.size(1) != wp->cols())
      throw RunError("reshard of " + what + ": plan parameter " + str(wp->name()) + " [" +
                     std::to_string(wp->rows()) + ", " + std::to_string(wp->cols()) +
                     "] does not match the model's " + named[k].first + " [" +
                     std::to_string(t.size(0)) + ", " + std::to_string(t.size(1)) + "]");
    if ((int64_t)t.element_size() != rs.bytes_per_element())
      throw RunError("reshard of " + what + ": the plan counts " +
                     std::to_string(rs.bytes_per_element()) +
                     " bytes per element, the model's weights have " +
                     std::to_string(t.element_size()));
  }
}

/// Training on TP or FSDP shards: this rank's boxes go into its generation
/// copy first (they are what the plan says it holds and sends); the boxes
/// it receives complete the copy. (A pipeline stage lists only the
/// parameters it holds.)
void placeOwnShards(RoleRt &rr, std::vector<std::pair<std::string, at::Tensor>> &named,
                    const std::string &what) {
  auto shards = rr.lm->namedWeights();
  auto boxes = rr.lm->namedBoxes();
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < named.size(); ++k)
    index[named[k].first] = k;
  if (shards.size() != boxes.size())
    throw RunError("reshard of " + what + ": the training form lists " +
                   std::to_string(shards.size()) + " weights but " +
                   std::to_string(boxes.size()) + " boxes");
  for (size_t i = 0; i < shards.size(); ++i) {
    auto k = index.find(shards[i].first);
    if (k == index.end())
      throw RunError("reshard of " + what + ": the training form holds " +
                     shards[i].first + ", which the model has not");
    const models::Box &b = boxes[i].second;
    if (b.empty())
      continue;
    named[k->second].second.detach().narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols())
        .copy_(shards[i].second.detach().view({b.rows(), b.cols()}));
  }
}

/// A form's weights and boxes in the plan's parameter order (`names`): a
/// pipeline stage or an expert-parallel form holds only some of them, the
/// others an empty tensor and box (the plan never has the rank send or
/// receive them). Throws when the form lists a weight twice, or one the
/// plan does not.
struct HeldInPlanOrder {
  std::vector<std::pair<std::string, at::Tensor>> weights;
  std::vector<std::pair<std::string, models::Box>> boxes;
};
HeldInPlanOrder heldInPlanOrder(const models::CausalLM &form,
                                const std::vector<std::string> &names, const std::string &what,
                                const char *which) {
  const auto weights = form.namedWeights();
  const auto held = form.namedBoxes();
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < weights.size(); ++i)
    at[weights[i].first] = i;
  if (at.size() != weights.size() || held.size() != weights.size())
    throw RunError("reshard of " + what + ": the " + which + " form lists " +
                   std::to_string(weights.size()) + " weights and " +
                   std::to_string(held.size()) + " boxes, not each once");
  HeldInPlanOrder out;
  size_t found = 0;
  for (const std::string &name : names) {
    auto it = at.find(name);
    if (it == at.end()) {
      out.weights.emplace_back(name, at::Tensor());
      out.boxes.emplace_back(name, models::Box{});
    } else {
      out.weights.push_back(weights[it->second]);
      out.boxes.push_back(held[it->second]);
      ++found;
    }
  }
  if (found != weights.size())
    throw RunError("reshard of " + what + ": the " + which + " form holds " +
                   std::to_string(weights.size() - found) +
                   " weights the plan does not list");
  return out;
}

/// Pieces that travelled as bfloat16 (transfer_dtype: bf16), widened back.
at::Tensor roundedBf16(const at::Tensor &t) {
  return t.to(at::kBFloat16).to(t.scalar_type());
}

} // namespace

double WeightResharder::run(const Reshard &rs, std::map<int, RoleRt> &roles,
                            MetricSums *iteration, bool posted) {
  settle(); // the pieces posted last time went (or this rank waits here)
  iteration_ = iteration;
  received_ = 0;
  posted_ = posted;
  postedVersion_ = -1;
  const std::string what = str(role(rs.role()).name(), "?") + " " + str(rs.from_phase()) +
                           " -> " + str(rs.to_phase());
  auto rit = roles.find(rs.role());
  if (rit == roles.end() || (!rit->second.model && rit->second.holding != Holding::ShardsOnly))
    throw RunError("reshard of " + what + ": this rank holds no model of the role");
  RoleRt &rr = rit->second;
  if (posted && !rr.apart) // the runtime posts only an actor generating apart's
    throw RunError("reshard of " + what + ": posted, but the actor generates where it trains");
  if (rr.apart)
    across(rs, rr, what);
  else if (rr.holding == Holding::ShardsOnly && o_.reshard != "naive")
    shardsToShards(rs, rr, what);
  else
    throughCopy(rs, rr, roles, what);
  rr.copyVersion = versionOfCopy(rr, what);
  iteration_ = nullptr;
  posted_ = false;
  return received_;
}

void WeightResharder::settle() {
  for (auto &op : inFlight_)
    op->wait();
  inFlight_.clear();
  inFlightBufs_.clear();
}

/// The policy version the reshard brought: the training ranks' optimizer
/// steps. Apart, the generation ranks learn it from them (each training
/// rank adds its steps and a 1; all of them must agree).
int64_t WeightResharder::versionOfCopy(RoleRt &rr, const std::string &what) {
  if (!rr.apart)
    return rr.optim ? rr.optim->steps() : rr.copyVersion;
  if (posted_) // the version came with the pieces (checked in across())
    return rr.holding == Holding::GenerationRank ? postedVersion_
                                                 : (rr.optim ? rr.optim->steps() : 0);
  const int64_t mine = rr.optim ? rr.optim->steps() : 0;
  at::Tensor t = at::tensor({mine, mine * mine, (int64_t)(rr.optim ? 1 : 0)},
                            at::TensorOptions().dtype(at::kLong))
                     .to(models::engineDevice());
  rr.xcomm->allReduceSum(t);
  t = t.cpu();
  const int64_t sum = t[0].item<int64_t>(), sq = t[1].item<int64_t>(), n = t[2].item<int64_t>();
  if (n <= 0 || sum % n != 0 || sq != n * (sum / n) * (sum / n))
    throw RunError("reshard of " + what + ": the training ranks' weights are at different "
                   "policy versions (optimizer steps)");
  return sum / n;
}

/// Through a whole copy: this rank sends and receives exactly the element
/// ranges the plan lists (one message per peer, all posted at once). With
/// whole weights it checks every received range bit for bit against its
/// own copy; out of training shards it assembles its generation copy (or
/// its generation shards' staging copy). Either way the bytes the
/// communicator counted must equal the plan's.
void WeightResharder::throughCopy(const Reshard &rs, RoleRt &rr,
                                  std::map<int, RoleRt> &roles, const std::string &what) {
  using at::indexing::Slice;
  const Role &ro = role(rs.role());
  if (rr.holding == Holding::ShardsOnly)
    allocateWholeCopy(rr); // the naive baseline gathers into a whole copy
  Communicator &c = *rr.comm;
  const int me = rr.pos;
  auto named = rr.model->namedParameters();
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (named.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, the model has " + std::to_string(named.size()));
  checkReshardParams(rs, named, what);
  c10::NoGradGuard ng;
  if (rr.holdsShards())
    placeOwnShards(rr, named, what);
  auto piece = [&](const WeightTransfer *t) {
    return named[t->param()].second.detach().index(
        {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())});
  };
  if (o_.reshard == "naive")
    return naive(rs, rr, roles, named, what);
  // transfer_dtype: bf16: the pieces travel as bfloat16 (rounded to
  // nearest even) and are widened on arrival; the plan counts wire bytes.
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  auto rounded = [&](const at::Tensor &t) {
    return bf16Wire ? t.to(at::kBFloat16).to(t.scalar_type()) : t;
  };
  PieceExchange x = exchangePieces(rs, c, me, bf16Wire, wireBytes, heldType(rr), piece);
  const int64_t measured = x.measured, plannedIn = x.plannedIn;
  const double ms = x.ms;
  auto &in = x.in;
  auto ranks = ints(ro.ranks());
  for (auto &[peer, buf] : x.recvs) {
    int64_t off = 0;
    for (const WeightTransfer *t : in[peer]) {
      at::Tensor want = piece(t);
      at::Tensor got = buf.narrow(0, off, want.numel()).view(want.sizes());
      off += want.numel();
      if (rr.holdsShards()) {
        named[t->param()].second.detach().index_put_(
            {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())}, got);
        continue;
      }
      if (!at::equal(got, rounded(want)))
        throw RunError("reshard of " + what + ": rows " + std::to_string(t->row0()) + "-" +
                       std::to_string(t->row1() - 1) + ", cols " +
                       std::to_string(t->col0()) + "-" + std::to_string(t->col1() - 1) +
                       " of " + named[t->param()].first + " from rank " +
                       std::to_string(ranks[peer]) +
                       " differ from the weights they should be");
    }
  }
  if (measured != plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(measured) +
                   " bytes, the plan says " + std::to_string(plannedIn));
  finishGenerationCopy(rs, rr, named, bf16Wire, what);
  report(rs, c, what, measured, ms, false);
}

/// --reshard naive, the baseline (DeepSpeed-Chat's way): every rank
/// gathers the whole model, then keeps what it needs.
void WeightResharder::naive(const Reshard &rs, RoleRt &rr,
                            std::map<int, RoleRt> &roles, Named &named,
                            const std::string &what) {
  Communicator &c = *rr.comm;
  if (rr.holdsShards()) {
    // DeepSpeed-Chat's way out of sharded training: all-gather every
    // shard, so every rank holds the whole model.
    Communicator &g = rr.lm->group(); // where the whole weights are gathered
    const uint64_t before = g.bytesReceived();
    auto t0 = Clock::now();
    refreshGenerationCopies(roles);
    const double ms = msSince(t0);
    report(rs, c, what, (int64_t)(g.bytesReceived() - before), ms, true);
    dropWholeCopies(roles);
    return;
  }
  // Whole weights: each rank contributes an equal slice of the flat
  // weights, and checks what it gathered against its own copy.
  std::vector<at::Tensor> flatParts;
  for (auto &[name, t] : named)
    flatParts.push_back(t.detach().reshape({-1}));
  at::Tensor flat = at::cat(flatParts);
  const int64_t M = flat.numel(), n = c.size(), chunk = (M + n - 1) / n;
  at::Tensor padded = at::zeros({chunk * n}, flat.options());
  padded.narrow(0, 0, M).copy_(flat);
  const uint64_t before = c.bytesReceived();
  auto t0 = Clock::now();
  at::Tensor all = c.allGatherFlat(padded.narrow(0, rr.pos * chunk, chunk).contiguous());
  const double ms = msSince(t0);
  const int64_t measured = (int64_t)(c.bytesReceived() - before);
  if (!at::equal(all.reshape({-1}).narrow(0, 0, M), flat))
    throw RunError("reshard of " + what + " (naive): the gathered weights differ from "
                   "this rank's");
  if (rr.gen)
    rr.gen->loadFrom(*rr.model);
  report(rs, c, what, measured, ms, true);
}

/// After the pieces arrived: the generation shards loaded from the staging
/// copy (and checked across replicas), or the whole generation copies
/// checked identical over the role's ranks.
void WeightResharder::finishGenerationCopy(const Reshard &rs, RoleRt &rr, Named &named,
                                           bool bf16Wire, const std::string &what) {
  Communicator &c = *rr.comm;
  auto ranks = ints(role(rs.role()).ranks());
  if (bf16Wire && rr.holdsShards() && !rr.gen)
    // The generation copy: what the rank held itself is rounded like what
    // it received (the training shards stay exact float32).
    for (auto &[name, w] : named)
      w.detach().copy_(roundedBf16(w.detach()));
  if (rr.gen) {
    // Generation on TP shards: the boxes of this rank's generation slot
    // are in place (held or received); they become its TPLlama shards
    // (rounded to bfloat16 with a bf16 wire, like what travelled).
    // The ranks hosting the same TP index of different replicas must hold
    // identical shards.
    rr.gen->loadFrom(*rr.model);
    if (bf16Wire)
      for (auto &[name, w] : rr.gen->namedWeights())
        w.detach().copy_(roundedBf16(w.detach()));
    checkGenerationShards(rs, rr, what);
  } else if (rr.holdsShards()) {
    // Every rank assembled its generation copy from different pieces: the
    // copies must be identical.
    double sum = 0;
    for (auto &[name, w] : named)
      sum += w.detach().to(at::kDouble).sum().item<double>();
    at::Tensor mine = at::full({1}, sum, models::onEngine(at::kDouble));
    at::Tensor all = c.allGatherFlat(mine).cpu();
    for (int64_t i = 0; i < all.size(0); ++i)
      if (all[i][0].item<double>() != sum)
        throw RunError("reshard of " + what + ": the weights assembled on rank " +
                       std::to_string(ranks[i]) + " differ from this rank's");
  }
}

/// Ranks hosting the same shard of different generation replicas must hold
/// identical generation shards (each assembled them from other pieces): the
/// same TP index, or the same run of a mixture's experts (slot mod tp * ep,
/// tp the fastest slot coordinate, the experts' owner dp mod ep).
void WeightResharder::checkGenerationShards(const Reshard &rs, RoleRt &rr,
                                            const std::string &what) {
  double sum = 0;
  for (auto &[name, w] : rr.gen->namedWeights())
    sum += w.detach().to(at::kDouble).sum().item<double>();
  const Layout &gl = *role(rs.role()).generate();
  const int t = std::max(1, gl.tp()) * std::max(1, gl.ep());
  const auto &slots = rows_->genSlots().at(rs.role());
  const auto ranks = ints(rr.holding == Holding::GenerationRank ? role(rs.role()).generate_ranks() : role(rs.role()).ranks());
  at::Tensor mine = at::tensor({(double)(slots[rr.pos] % t), sum},
                               at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = rr.comm->allGatherFlat(mine.to(models::engineDevice())).cpu();
  for (int64_t i = 0; i < all.size(0); ++i)
    if (all[i][0].item<double>() == (double)(slots[rr.pos] % t) &&
        all[i][1].item<double>() != sum)
      throw RunError("reshard of " + what + ": the generation shard " +
                     std::to_string(slots[rr.pos] % t) + " assembled on rank " +
                     std::to_string(ranks[i]) + " differs from this rank's");
}

/// The planned reshard of a ShardsOnly actor: straight from its training shards
/// into its generation shards, no whole copy. Each sent piece is cut from
/// the training shard that holds it; the generation shard is filled from
/// the overlap of the two shards and the received pieces, which must cover
/// it exactly (checked by counting).
void WeightResharder::shardsToShards(const Reshard &rs, RoleRt &rr,
                                     const std::string &what) {
  using at::indexing::Slice;
  Communicator &c = *rr.comm;
  const int me = rr.pos;
  const auto shapes = models::llamaParameterShapes(rr.cfg);
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (shapes.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, the model has " + std::to_string(shapes.size()));
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs.params()->Get(k);
    if (shapes[k].first != str(wp->name()) || shapes[k].second[0] != wp->rows() ||
        shapes[k].second[1] != wp->cols())
      throw RunError("reshard of " + what + ": plan parameter " + str(wp->name()) +
                     " does not match the model's " + shapes[k].first);
  }
  const int64_t held = (int64_t)at::elementSize(rr.cfg.dtype);
  if (rs.bytes_per_element() != held)
    throw RunError("reshard of " + what + ": the plan counts " +
                   std::to_string(rs.bytes_per_element()) +
                   " bytes per element, the model's weights have " + std::to_string(held));
  c10::NoGradGuard ng;
  // Both forms' weights in the plan's parameter order.
  std::vector<std::string> names;
  for (const auto &[name, shape] : shapes)
    names.push_back(name);
  HeldInPlanOrder trainForm = heldInPlanOrder(*rr.lm, names, what, "training");
  HeldInPlanOrder genForm = heldInPlanOrder(*rr.gen, names, what, "generation");
  const auto &train = trainForm.weights, &gen = genForm.weights;
  const auto &trainBoxes = trainForm.boxes, &genBoxes = genForm.boxes;
  auto as2d = [](const at::Tensor &t, const models::Box &b) {
    return t.detach().view({b.rows(), b.cols()});
  };
  auto inside = [](const WeightTransfer *t, const models::Box &b) {
    return t->row0() >= b.r0 && t->row1() <= b.r1 && t->col0() >= b.c0 && t->col1() <= b.c1;
  };
  auto region = [](const at::Tensor &t2d, const models::Box &origin, int64_t r0, int64_t r1,
                   int64_t c0, int64_t c1) {
    return t2d.index({Slice(r0 - origin.r0, r1 - origin.r0), Slice(c0 - origin.c0, c1 - origin.c0)});
  };
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  // What this rank already holds of its generation shard.
  std::vector<int64_t> filled(nParams, 0);
  for (size_t k = 0; k < nParams; ++k) {
    const models::Box &tb = trainBoxes[k].second, &gb = genBoxes[k].second;
    models::Box i{std::max(tb.r0, gb.r0), std::min(tb.r1, gb.r1), std::max(tb.c0, gb.c0),
                  std::min(tb.c1, gb.c1)};
    if (i.empty() || tb.empty())
      continue;
    region(as2d(gen[k].second, gb), gb, i.r0, i.r1, i.c0, i.c1)
        .copy_(region(as2d(train[k].second, tb), tb, i.r0, i.r1, i.c0, i.c1));
    filled[k] += i.numel();
  }
  PieceExchange x = exchangePieces(rs, c, me, bf16Wire, wireBytes, heldType(rr),
                                   [&](const WeightTransfer *t) {
    const models::Box &tb = trainBoxes[t->param()].second;
    if (!inside(t, tb))
      throw RunError("reshard of " + what + ": the plan has this rank send a piece of " +
                     shapes[t->param()].first + " its training shard does not hold");
    return region(as2d(train[t->param()].second, tb), tb, t->row0(), t->row1(), t->col0(),
                  t->col1());
  });
  const int64_t measured = x.measured, plannedIn = x.plannedIn;
  const double ms = x.ms;
  for (auto &[peer, buf] : x.recvs) {
    int64_t off = 0;
    for (const WeightTransfer *t : x.in[peer]) {
      const models::Box &gb = genBoxes[t->param()].second;
      if (!inside(t, gb))
        throw RunError("reshard of " + what + ": the plan sends this rank a piece of " +
                       shapes[t->param()].first + " outside its generation shard");
      at::Tensor dst = region(as2d(gen[t->param()].second, gb), gb, t->row0(), t->row1(),
                              t->col0(), t->col1());
      dst.copy_(buf.narrow(0, off, dst.numel()).view(dst.sizes()));
      off += dst.numel();
      filled[t->param()] += dst.numel();
    }
  }
  if (measured != plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(measured) +
                   " bytes, the plan says " + std::to_string(plannedIn));
  for (size_t k = 0; k < nParams; ++k)
    if (filled[k] != genBoxes[k].second.numel())
      throw RunError("reshard of " + what + ": " + std::to_string(filled[k]) + " of the " +
                     std::to_string(genBoxes[k].second.numel()) + " numbers of this rank's " +
                     "generation shard of " + shapes[k].first +
                     " arrived or were held (the plan must cover it exactly once)");
  if (bf16Wire)
    for (auto &[name, w] : gen)
      if (w.defined())
        w.detach().copy_(w.detach().to(at::kBFloat16).to(w.scalar_type()));
  checkGenerationShards(rs, rr, what);
  report(rs, c, what, measured, ms, false);
}

/// Sums a transition's bytes over the role's ranks; its first rank counts
/// it, prints the one line per transition and, for planned transfers,
/// checks the total against the plan.

/// An actor generating on ranks of its own: its training ranks send every
/// planned piece (cut from their whole weights or their shards) and its
/// generation ranks, which hold nothing of their own, assemble their whole
/// generation copy from the pieces; each element must arrive exactly once
/// and the replicas must end up identical. The plan indexes training ranks,
/// then generation ranks (Reshard.ranks); the exchange runs on their group.
void WeightResharder::across(const Reshard &rs, RoleRt &rr, const std::string &what) {
  using at::indexing::Slice;
  const auto idx = ints(rs.ranks());
  const auto me = std::find(idx.begin(), idx.end(), rank_);
  if (me == idx.end() || !rr.xcomm)
    throw RunError("reshard of " + what + ": this rank is on neither side of the plan");
  // The plan's index -> the position in the reshard group (ascending ranks).
  std::vector<int> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> peer(idx.size());
  for (size_t i = 0; i < idx.size(); ++i)
    peer[i] = (int)(std::lower_bound(sorted.begin(), sorted.end(), idx[i]) - sorted.begin());
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  c10::NoGradGuard ng;
  // What this rank holds: a generation rank nothing; a training rank its
  // whole weights, or each parameter's shard box.
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<std::pair<std::string, models::Box>> boxes;
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (rr.holdsShards()) {
    // In the plan's parameter order (a pipeline stage holds only some).
    std::vector<std::string> names;
    for (size_t k = 0; k < nParams; ++k)
      names.push_back(str(rs.params()->Get(k)->name()));
    HeldInPlanOrder h = heldInPlanOrder(*rr.lm, names, what, "training");
    named = std::move(h.weights);
    boxes = std::move(h.boxes);
  } else if (rr.model) {
    named = rr.model->namedParameters();
  }
  if (named.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, this rank holds " + std::to_string(named.size()));
  auto piece = [&](const WeightTransfer *t) -> at::Tensor {
    const at::Tensor w = named[t->param()].second.detach();
    if (boxes.empty())
      return w.index({Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())});
    const models::Box &b = boxes[t->param()].second;
    if (!w.defined())
      throw RunError("reshard of " + what + ": the plan has this rank send " +
                     named[t->param()].first + ", which its stage does not hold");
    if (t->row0() < b.r0 || t->row1() > b.r0 + b.rows() || t->col0() < b.c0 ||
        t->col1() > b.c0 + b.cols())
      throw RunError("reshard of " + what + ": the plan has this rank send rows " +
                     std::to_string(t->row0()) + "-" + std::to_string(t->row1() - 1) +
                     " of " + named[t->param()].first + ", which its shard does not hold");
    return w.view({b.rows(), b.cols()})
        .index({Slice(t->row0() - b.r0, t->row1() - b.r0),
                Slice(t->col0() - b.c0, t->col1() - b.c0)});
  };
  Posting post;
  post.tag = kPostedTag;
  post.version = rr.optim ? rr.optim->steps() : 0;
  post.ops = &inFlight_;
  post.bufs = &inFlightBufs_;
  PieceExchange x = exchangePieces(rs, *rr.xcomm, (int)(me - idx.begin()), bf16Wire,
                                   wireBytes, heldType(rr), piece,
                                   [&](int i) { return peer.at((size_t)i); },
                                   posted_ ? &post : nullptr);
  if (posted_ && rr.holding == Holding::GenerationRank) {
    // Every training rank it heard from sent the same version.
    for (int64_t v : post.versions)
      if (v != post.versions.front())
        throw RunError("reshard of " + what + ": the training ranks' weights are at "
                       "different policy versions (optimizer steps " +
                       std::to_string(post.versions.front()) + " and " + std::to_string(v) + ")");
    if (post.versions.empty())
      throw RunError("reshard of " + what + ": this generation rank received no pieces");
    postedVersion_ = post.versions.front();
  }
  if (rr.holding == Holding::GenerationRank) {
    auto dst = rr.model->namedParameters();
    int64_t elems = 0, want = 0;
    if (rr.gen) // only this rank's generation shards arrive
      for (auto &[name, w] : rr.gen->namedWeights())
        want += w.numel();
    else
      for (auto &[name, w] : dst)
        want += w.numel();
    for (auto &[from, buf] : x.recvs) {
      int64_t off = 0;
      for (const WeightTransfer *t : x.in[from]) {
        const int64_t n = (t->row1() - t->row0()) * (t->col1() - t->col0());
        dst[t->param()].second.detach().index_put_(
            {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())},
            buf.narrow(0, off, n).view({t->row1() - t->row0(), t->col1() - t->col0()}));
        off += n;
        elems += n;
      }
    }
    if (elems != want)
      throw RunError("reshard of " + what + ": this generation rank received " +
                     std::to_string(elems) + " weights of its " + std::to_string(want));
    if (rr.gen) {
      // The received boxes are this rank's TP shards; ranks of the same TP
      // index in other replicas must hold identical ones.
      rr.gen->loadFrom(*rr.model);
      checkGenerationShards(rs, rr, what);
    } else {
      // Every replica assembled its copy from other pieces: they must agree.
      double sum = 0;
      for (auto &[name, w] : dst)
        sum += w.detach().to(at::kDouble).sum().item<double>();
      at::Tensor all =
          rr.comm->allGatherFlat(at::full({1}, sum, models::onEngine(at::kDouble))).cpu();
      for (int64_t i = 0; i < all.size(0); ++i)
        if (all[i][0].item<double>() != sum)
          throw RunError("reshard of " + what + ": the weights assembled on generation rank " +
                         std::to_string(ints(role(rr.index).generate_ranks())[(size_t)i]) +
                         " differ from this rank's");
    }
  }
  if (x.measured != x.plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(x.measured) +
                   " bytes, the plan says " + std::to_string(x.plannedIn));
  if (posted_) {
    if (x.measuredOut != x.plannedOut)
      throw RunError("reshard of " + what + ": posted " + std::to_string(x.measuredOut) +
                     " bytes, the plan says " + std::to_string(x.plannedOut));
    return reportPosted(rs, rr, what, x.measured, x.measuredOut, x.ms);
  }
  report(rs, *rr.xcomm, what, x.measured, x.ms, false);
}

/// A posted reshard's figures: each generation rank checked what it
/// received; the training ranks add what they posted (their own group, so
/// neither side waits for the other), which must be the plan's bytes, and
/// the first of them counts and prints it.
void WeightResharder::reportPosted(const Reshard &rs, RoleRt &rr, const std::string &what,
                                   int64_t received, int64_t sent, double ms) {
  received_ = (double)received;
  if (rr.holding == Holding::GenerationRank)
    return;
  at::Tensor t = at::full({1}, sent, models::onEngine(at::kLong));
  rr.comm->allReduceSum(t);
  t = t.cpu();
  if (rr.comm->rank() != 0)
    return;
  account(rs, what, t.item<int64_t>(), ms, false, true);
}

/// Sums a transition's bytes over the role's ranks; its first rank counts
/// it, prints the one line per transition and, for planned transfers,
/// checks the total against the plan.
void WeightResharder::report(const Reshard &rs, Communicator &c, const std::string &what,
                             int64_t measured, double ms, bool naive) {
  received_ = (double)measured;
  at::Tensor t = at::full({1}, measured, models::onEngine(at::kLong));
  c.allReduceSum(t);
  t = t.cpu();
  if (c.rank() != 0)
    return;
  account(rs, what, t.item<int64_t>(), ms, naive, false);
}

/// The first rank's count of a transition that moved `total` bytes in `ms`
/// (`posted`: the training ranks posted them): the run's and the
/// iteration's figures, the one line, and the check against the plan.
void WeightResharder::account(const Reshard &rs, const std::string &what, int64_t total,
                              double ms, bool naive, bool posted) {
  bytes_ += (double)total;
  planned_ += (double)(naive ? rs.naive_bytes() : rs.bytes());
  // The iteration's weight-reshard bytes and time (the metrics' reshard_*).
  if (iteration_) { // inside an iteration
    iteration_->reshardBytes += (double)total;
    iteration_->reshardMs += ms;
  }
  ++count_;
  log_.clearBar();
  if (!o_.quiet) {
    if (naive)
      std::printf("[reshard] %s (naive gather) %s in %.1f ms (the plan's naive figure %s; "
                  "planned %s)\n",
                  what.c_str(), fmtBytes((double)total).c_str(), ms,
                  fmtBytes((double)rs.naive_bytes()).c_str(), fmtBytes((double)rs.bytes()).c_str());
    else
      std::printf("[reshard] %s %s %s %.1f ms (planned %s)%s\n", what.c_str(),
                  fmtBytes((double)total).c_str(), posted ? "posted in" : "in", ms,
                  fmtBytes((double)rs.bytes()).c_str(),
                  rs.wire_dtype() && str(rs.wire_dtype()) == "bf16" ? " as bf16" : "");
  }
  if (!naive && total != rs.bytes())
    throw RunError("reshard of " + what + ": the " +
                   (posted ? "training ranks posted " : "role's ranks received ") +
                   std::to_string(total) + " bytes, the plan says " + std::to_string(rs.bytes()));
}

} // namespace hflow::exec
