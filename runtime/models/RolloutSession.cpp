//===- RolloutSession.cpp - partial rollouts: generation that outlives a call ===//

#include "runtime/models/RolloutSession.h"

#include "runtime/models/RolloutEngineDetail.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace hflow::models {

RolloutSession::RolloutSession(int64_t samples, int64_t horizon) : n_(samples), horizon_(horizon) {
  if (samples < 1)
    throw std::invalid_argument("rollout session: " + std::to_string(samples) +
                                " samples per prompt");
  if (horizon < 0)
    throw std::invalid_argument("rollout session: a negative horizon");
}

bool RolloutSession::Group::done() const {
  for (const Sample &s : samples)
    if (!s.done)
      return false;
  return true;
}

Generation RolloutSession::run(const NextLogitsFn &step, const KvGeometry &geometry,
                               const at::Tensor &prompts, const at::Tensor &promptMask,
                               const SamplingOptions &o, at::Generator &gen,
                               const EngineLimits &limitsIn) {
  c10::InferenceMode guard;
  const SessionCall &call = o.session;
  const int64_t rows = prompts.size(0), P = prompts.size(1), R = o.maxTokens;
  if (rows % n_ != 0)
    throw std::invalid_argument("rollout session: " + std::to_string(rows) +
                                " prompt rows are not groups of " + std::to_string(n_));
  const int64_t G = rows / n_;
  if ((int64_t)call.tags.size() != G)
    throw std::invalid_argument("rollout session: " + std::to_string(call.tags.size()) +
                                " tags for " + std::to_string(G) + " groups");
  if (o.recordRouting)
    throw std::invalid_argument("rollout session: a partial rollout does not record a "
                                "mixture's routing (a resumed sequence's routing would mix "
                                "two versions' routers)");
  if (R < 1)
    throw std::invalid_argument("rollout session: max tokens must be positive");
  if (call.deliver < 0)
    throw std::invalid_argument("rollout session: a negative delivery");
  // The new groups join behind the ones in flight.
  int64_t longest = 0;
  std::vector<std::vector<int64_t>> fresh =
      rows > 0 ? detail::promptRows(prompts, promptMask, longest)
               : std::vector<std::vector<int64_t>>{};
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t j = 1; j < n_; ++j)
      if (fresh[(size_t)(g * n_ + j)] != fresh[(size_t)(g * n_)])
        throw std::invalid_argument("rollout session: row " + std::to_string(g * n_ + j) +
                                    "'s prompt differs from its group's first row");
    Group gr;
    gr.prompt = std::move(fresh[(size_t)(g * n_)]);
    gr.tag = call.tags[(size_t)g];
    gr.serial = serials_++;
    gr.admitted = calls_;
    gr.samples.resize((size_t)n_);
    groups_.push_back(std::move(gr));
  }
  if ((int64_t)groups_.size() < call.deliver)
    throw std::logic_error("rollout session: " + std::to_string(call.deliver) +
                           " groups to deliver, " + std::to_string(groups_.size()) +
                           " in flight");
  if (!seeded_) {
    seed_ = detail::drawSeed(gen);
    seeded_ = true;
  }
  for (const Group &g : groups_) {
    longest = std::max(longest, (int64_t)g.prompt.size());
    if ((int64_t)g.prompt.size() > P)
      throw std::invalid_argument("rollout session: a prompt in flight has " +
                                  std::to_string(g.prompt.size()) +
                                  " tokens, wider than this call's " + std::to_string(P));
  }
  int64_t live = 0;
  for (const Group &g : groups_)
    for (const Sample &s : g.samples)
      live += !s.done;
  const EngineLimits lim = detail::checkedLimits(limitsIn, longest, R, std::max<int64_t>(1, live));

  // The stop rule sees (tag, sample) as the row: a row's identity for its
  // caller, whichever call samples it.
  std::unordered_map<int64_t, int64_t> tagOf;
  for (const Group &g : groups_)
    tagOf[g.serial] = g.tag;
  SamplingOptions so = o;
  so.session = SessionCall{};
  if (o.stopWhen) {
    const int64_t n = n_;
    so.stopWhen = [&tagOf, n, inner = o.stopWhen](int64_t key, const std::vector<int64_t> &r) {
      return inner(tagOf.at(key / n) * n + key % n, r);
    };
  }
  detail::Engine e(step, geometry, so, lim, seed_);
  // Engine sequence -> (group position, sample), in the order added.
  std::vector<std::pair<size_t, int64_t>> who;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (int64_t j = 0; j < n_; ++j) {
      const Sample &s = groups_[gi].samples[(size_t)j];
      if (s.done)
        continue;
      e.add(groups_[gi].prompt, groups_[gi].serial * n_ + j, s.response, s.logprobs);
      who.emplace_back(gi, j);
    }
  // Enough: `deliver` groups done, and the groups that would stay behind
  // can still leave in time. A call delivers the `deliver` done groups
  // admitted first (a short group may overtake a long one); a group must
  // leave at most `horizon` calls after it came, and each later call takes
  // at most `deliver` groups, so of the groups left behind, those due
  // within d calls (d = 0 .. horizon - 1) must number at most d x deliver.
  // The caller admits `horizon` batches more than it delivers on its first
  // call and a batch on each after, so decoding on always gets there.
  std::vector<int64_t> open(groups_.size(), 0);
  for (const auto &[gi, j] : who)
    ++open[gi];
  std::vector<bool> counted(who.size(), false);
  auto enough = [&] {
    const std::vector<RolloutSeq> &seqs = e.seqs();
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs[i].done && !counted[i]) {
        counted[i] = true;
        --open[who[i].first];
      }
    // The groups left behind, by the calls they have left (their admission
    // + horizon, less this call): 0 would be too late.
    std::vector<int64_t> byDue((size_t)horizon_ + 1, 0);
    int64_t taken = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      if (open[gi] == 0 && taken < call.deliver) {
        ++taken;
        continue;
      }
      const int64_t d = groups_[gi].admitted + horizon_ - calls_;
      if (d < 0)
        return false;
      if (d < horizon_)
        ++byDue[(size_t)d];
    }
    if (taken < call.deliver)
      return false;
    int64_t due = 0;
    for (int64_t d = 0; d < horizon_; ++d) {
      due += byDue[(size_t)d];
      if (due > d * call.deliver)
        return false;
    }
    return true;
  };
  if (!enough())
    e.runUntil(enough);
  if (!enough())
    throw std::logic_error("rollout session: every sequence ended, and " +
                           std::to_string(call.deliver) +
                           " groups cannot leave with none past the horizon of " +
                           std::to_string(horizon_) +
                           " (more batches were admitted than the horizon holds)");
  // The engine's sequences back into the groups: the tokens this call
  // sampled carry its version.
  const std::vector<RolloutSeq> &seqs = e.seqs();
  for (size_t i = 0; i < who.size(); ++i) {
    Sample &s = groups_[who[i].first].samples[(size_t)who[i].second];
    const RolloutSeq &q = seqs[i];
    s.versions.resize(q.response.size(), (int32_t)call.version);
    s.response = q.response;
    s.logprobs = q.logprobs;
    s.done = q.done;
    s.stopped = q.stopped;
  }
  // The `deliver` done groups admitted first leave.
  const int64_t B = call.deliver * n_;
  Generation out = emptyGeneration(B, R, o.padToken, prompts.options());
  detail::HostRows rowsOut(B, R, o.padToken);
  std::vector<int64_t> ptok((size_t)(B * P), o.padToken);
  std::vector<float> pmask((size_t)(B * P), 0.f);
  std::vector<int32_t> ver((size_t)(B * R), -1);
  int64_t row = 0;
  std::deque<Group> kept;
  for (Group &g : groups_) {
    if (row == B || !g.done()) {
      kept.push_back(std::move(g));
      continue;
    }
    if (calls_ - g.admitted > horizon_)
      throw std::logic_error("rollout session: a group leaves " +
                             std::to_string(calls_ - g.admitted) +
                             " calls after it came, past the horizon of " +
                             std::to_string(horizon_) +
                             " (more batches were admitted than the horizon holds)");
    for (const Sample &s : g.samples) {
      const int64_t pad = P - (int64_t)g.prompt.size();
      for (size_t t = 0; t < g.prompt.size(); ++t) {
        ptok[(size_t)(row * P + pad) + t] = g.prompt[t];
        pmask[(size_t)(row * P + pad) + t] = 1.f;
      }
      rowsOut.put(row, s.response, s.logprobs, s.stopped);
      std::copy(s.versions.begin(), s.versions.end(), ver.begin() + row * R);
      out.tags.push_back(g.tag);
      ++row;
    }
  }
  groups_ = std::move(kept);
  for (const Group &g : groups_)
    if (g.admitted + horizon_ <= calls_)
      throw std::logic_error("rollout session: a group stays past the horizon of " +
                             std::to_string(horizon_));
  ++calls_;
  const auto dev = prompts.device();
  rowsOut.into(out, dev);
  out.prompts = detail::toDevice(ptok, at::kLong, {B, P}, dev);
  out.promptMask = detail::toDevice(pmask, at::kFloat, {B, P}, dev);
  out.versions = detail::toDevice(ver, at::kInt, {B, R}, dev);
  out.kvCacheBytes = e.poolBytes();
  out.stats = e.stats();
  return out;
}

//===-- the state in a checkpoint ------------------------------------------===//

std::map<std::string, at::Tensor> RolloutSession::state() const {
  // meta: n, horizon, seed, seeded, calls, serials, groups.
  std::vector<int64_t> meta = {n_,     horizon_, (int64_t)seed_, seeded_ ? 1 : 0,
                               calls_, serials_, (int64_t)groups_.size()};
  std::vector<int64_t> groups, prompts, samples, tokens;
  std::vector<float> lps;
  std::vector<int32_t> versions;
  for (const Group &g : groups_) {
    groups.insert(groups.end(), {g.tag, g.serial, g.admitted, (int64_t)g.prompt.size()});
    prompts.insert(prompts.end(), g.prompt.begin(), g.prompt.end());
    for (const Sample &s : g.samples) {
      samples.insert(samples.end(), {(int64_t)s.response.size(), s.done ? 1 : 0, s.stopped ? 1 : 0});
      tokens.insert(tokens.end(), s.response.begin(), s.response.end());
      lps.insert(lps.end(), s.logprobs.begin(), s.logprobs.end());
      versions.insert(versions.end(), s.versions.begin(), s.versions.end());
    }
  }
  auto t = [](auto &v, at::ScalarType type) {
    return at::from_blob(v.data(), {(int64_t)v.size()}, at::TensorOptions().dtype(type)).clone();
  };
  return {{"meta", t(meta, at::kLong)},         {"groups", t(groups, at::kLong)},
          {"prompts", t(prompts, at::kLong)},   {"samples", t(samples, at::kLong)},
          {"tokens", t(tokens, at::kLong)},     {"logprobs", t(lps, at::kFloat)},
          {"versions", t(versions, at::kInt)}};
}

void RolloutSession::restore(const std::map<std::string, at::Tensor> &state) {
  auto get = [&](const char *name, at::ScalarType type) {
    auto it = state.find(name);
    if (it == state.end())
      throw std::invalid_argument(std::string("rollout session state: no '") + name + "'");
    if (it->second.scalar_type() != type || it->second.dim() != 1)
      throw std::invalid_argument(std::string("rollout session state: '") + name +
                                  "' is not a vector of the expected type");
    return it->second.contiguous().cpu();
  };
  at::Tensor meta = get("meta", at::kLong), groups = get("groups", at::kLong),
             prompts = get("prompts", at::kLong), samples = get("samples", at::kLong),
             tokens = get("tokens", at::kLong), lps = get("logprobs", at::kFloat),
             versions = get("versions", at::kInt);
  if (meta.numel() != 7)
    throw std::invalid_argument("rollout session state: a meta of " +
                                std::to_string(meta.numel()) + " values, not 7");
  const int64_t *m = meta.data_ptr<int64_t>();
  if (m[0] != n_ || m[1] != horizon_)
    throw std::invalid_argument("rollout session state: " + std::to_string(m[0]) +
                                " samples and horizon " + std::to_string(m[1]) +
                                ", this session has " + std::to_string(n_) + " and " +
                                std::to_string(horizon_));
  const int64_t G = m[6];
  if (G < 0 || groups.numel() != 4 * G || samples.numel() != 3 * G * n_ ||
      tokens.numel() != lps.numel() || tokens.numel() != versions.numel())
    throw std::invalid_argument("rollout session state: its tables disagree in size");
  const int64_t *gv = groups.data_ptr<int64_t>(), *sv = samples.data_ptr<int64_t>();
  const int64_t *pv = prompts.data_ptr<int64_t>(), *tv = tokens.data_ptr<int64_t>();
  const float *lv = lps.data_ptr<float>();
  const int32_t *vv = versions.data_ptr<int32_t>();
  std::deque<Group> out;
  int64_t pp = 0, tp = 0;
  for (int64_t g = 0; g < G; ++g) {
    Group gr;
    gr.tag = gv[4 * g], gr.serial = gv[4 * g + 1], gr.admitted = gv[4 * g + 2];
    const int64_t plen = gv[4 * g + 3];
    if (plen < 1 || pp + plen > prompts.numel())
      throw std::invalid_argument("rollout session state: a prompt outside its table");
    gr.prompt.assign(pv + pp, pv + pp + plen);
    pp += plen;
    for (int64_t j = 0; j < n_; ++j) {
      const int64_t *si = sv + 3 * (g * n_ + j);
      if (si[0] < 0 || tp + si[0] > tokens.numel())
        throw std::invalid_argument("rollout session state: a response outside its table");
      Sample s;
      s.response.assign(tv + tp, tv + tp + si[0]);
      s.logprobs.assign(lv + tp, lv + tp + si[0]);
      s.versions.assign(vv + tp, vv + tp + si[0]);
      s.done = si[1] != 0, s.stopped = si[2] != 0;
      tp += si[0];
      gr.samples.push_back(std::move(s));
    }
    out.push_back(std::move(gr));
  }
  if (pp != prompts.numel() || tp != tokens.numel())
    throw std::invalid_argument("rollout session state: tables longer than its groups");
  seed_ = (uint64_t)m[2], seeded_ = m[3] != 0, calls_ = m[4], serials_ = m[5];
  groups_ = std::move(out);
}

} // namespace hflow::models
