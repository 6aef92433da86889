//===- Episodes.cpp - multi-turn generation with an environment ----------===//
//
// A generate call with `env:` (docs/environments.md): every row is an
// episode. Each turn the engine generates for the rows still running, on
// their whole conversation so far; each row's tokens are appended as
// sampled (data::Conversation), the environment process of this rank
// (env::EnvProcess) gets the conversation and answers with its message,
// a reward and whether the episode is done; its message is appended as
// the chat template renders it. An environment that fails (crashes, hangs,
// floods, answers garbage) ends its episode, marked failed (nothing of it
// trained, no reward), never the run; the process starts again for the
// next request. The rollout holds each episode's tokens, the model's
// marked in "rmask" and every token in "ratt", and the rewards summed in
// "envr" (env_reward reads them).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Episodes.h"
#include "runtime/exec/MethodRunner.h"

#include "runtime/data/Conversation.h"
#include "runtime/env/EnvProcess.h"
#include "runtime/models/Device.h"
#include "runtime/models/Safetensors.h"

#include <nlohmann/json.hpp>

#include "runtime/schema/ActivationModel.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace hflow::exec {

using namespace hflow::plan;

env::EnvProcess &MethodRunner::environment(const PhaseRt &ph, int s, const plan::CallArgs &a) {
  auto &slot = envs_[s];
  if (slot)
    return *slot;
  const auto argv = ph.envArgv.find(s);
  if (argv == ph.envArgv.end() || argv->second.empty())
    throw RunError(describe(s) + ": its environment has no command");
  const char *tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/hflow-env-XXXXXX";
  if (!::mkdtemp(pattern.data()))
    throw RunError(describe(s) + ": cannot make a folder for its environment in '" +
                   pattern.substr(0, pattern.rfind('/')) + "'");
  env::EnvLimits lim;
  lim.timeoutS = a.env_timeout().value_or(10.0);
  lim.memoryBytes = a.env_memory_mb().value_or(1024) << 20;
  lim.isolate = a.env_isolate().value_or(true);
  slot = std::make_unique<env::EnvProcess>(argv->second, pattern, lim);
  try {
    slot->start();
  } catch (const env::EnvError &e) {
    throw RunError(describe(s) + ": " + e.what());
  }
  return *slot;
}

namespace {

/// The environment's reply to one turn, checked: its messages to append
/// (none when done), its reward, whether the episode is done; `why` when
/// it is not a reply the protocol allows.
struct Turn {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  double reward = 0;
  bool done = false;
  std::string why;
};

Turn readReply(const std::string &line) {
  Turn t;
  const auto j = nlohmann::ordered_json::parse(line); // (EnvProcess checked it)
  if (j.contains("reward")) {
    if (!j["reward"].is_number() || !std::isfinite(j["reward"].get<double>())) {
      t.why = "its \"reward\" is not a finite number";
      return t;
    }
    t.reward = j["reward"].get<double>();
  }
  if (j.contains("done")) {
    if (!j["done"].is_boolean()) {
      t.why = "its \"done\" is not true or false";
      return t;
    }
    t.done = j["done"].get<bool>();
  }
  if (j.contains("messages") && j.contains("content")) {
    t.why = "it has both \"messages\" and \"content\"";
    return t;
  }
  if (j.contains("messages")) {
    if (!j["messages"].is_array()) {
      t.why = "its \"messages\" is not a list";
      return t;
    }
    for (const auto &m : j["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string()) {
        t.why = "a message is not {\"role\": TEXT, \"content\": TEXT}";
        return t;
      }
      t.messages.push_back({{"role", m["role"]}, {"content", m["content"]}});
    }
  } else if (j.contains("content")) {
    if (!j["content"].is_string() || (j.contains("role") && !j["role"].is_string())) {
      t.why = "its \"content\" (or \"role\") is not text";
      return t;
    }
    t.messages.push_back({{"role", j.value("role", "tool")}, {"content", j["content"]}});
  }
  for (const auto &m : t.messages)
    if (m["role"] == "assistant") {
      t.why = "it speaks as the assistant (the model's role)";
      return t;
    }
  if (!t.done && t.messages.empty())
    t.why = "it neither ends the episode (\"done\": true) nor says anything (\"content\")";
  return t;
}

} // namespace

void EpisodeBatch::add(data::Conversation c, int64_t prompt, int64_t ep, int64_t smp,
                       int64_t r, std::string ans) {
  conv.push_back(std::move(c));
  promptLen.push_back(prompt);
  episode.push_back(ep);
  sample.push_back(smp);
  row.push_back(r);
  answer.push_back(std::move(ans));
}

void playEpisodes(EpisodeBatch &b, env::EnvProcess &env, const EpisodeEngine &engine,
                  models::SamplingOptions so, const EpisodeRules &rules) {
  const size_t rows = b.size();
  const int64_t R = rules.responseTokens;
  const int64_t turnTokens = std::min<int64_t>(rules.turnTokens > 0 ? rules.turnTokens : R, R);
  b.used.assign(rows, 0);
  b.turns.assign(rows, 0);
  b.lps.assign(rows, {});
  b.reward.assign(rows, 0.0);
  b.failed.assign(rows, 0);
  b.stopped.assign(rows, 0);
  std::vector<uint8_t> active(rows, 1);
  auto failEpisode = [&](size_t i, const std::string &why) {
    b.failed[i] = 1;
    active[i] = 0;
    b.failures.push_back("the episode of " +
                         (rules.heldOut ? std::string("held-out row ") + std::to_string(b.row[i])
                                        : "row " + std::to_string(b.row[i]) + " (prompt " +
                                              std::to_string(b.episode[i]) + ", sample " +
                                              std::to_string(b.sample[i]) + ")") +
                         " failed: " + why);
  };
  for (int64_t turn = 1; turn <= rules.maxTurns; ++turn) {
    std::vector<size_t> act;
    for (size_t i = 0; i < rows; ++i)
      if (active[i])
        act.push_back(i);
    if (act.empty())
      break;
    // The running conversations, left-padded; each turn at most
    // turn_tokens, and no more than a row's response has left.
    int64_t L = 0, room = 0;
    for (size_t i : act) {
      L = std::max<int64_t>(L, (int64_t)b.conv[i].ids().size());
      room = std::max<int64_t>(room, R - b.used[i]);
    }
    const int64_t A = (int64_t)act.size(), maxNew = std::min(turnTokens, room);
    at::Tensor tp = at::full({A, L}, rules.padId, at::TensorOptions().dtype(at::kLong));
    at::Tensor tm = at::zeros({A, L});
    for (int64_t j = 0; j < A; ++j) {
      const auto &ids = b.conv[act[(size_t)j]].ids();
      const int64_t pad = L - (int64_t)ids.size();
      for (size_t t = 0; t < ids.size(); ++t) {
        tp[j][pad + (int64_t)t] = ids[t];
        tm[j][pad + (int64_t)t] = 1.0f;
      }
    }
    so.maxTokens = maxNew;
    so.limits.poolBlocks = shape::kvPoolBlocks(A, L + maxNew, so.limits.blockSize);
    if (rules.poolBytes > 0 && rules.blockBytes > 0)
      so.limits.poolBlocks = std::min<int64_t>(so.limits.poolBlocks,
                                               (int64_t)((double)rules.poolBytes / rules.blockBytes));
    models::Generation gen;
    try {
      gen = engine(tp.to(models::engineDevice()), tm.to(models::engineDevice()), so);
    } catch (const std::logic_error &e) {
      throw RunError(rules.where + ": turn " + std::to_string(turn) + ": " + e.what());
    }
    b.forwards += gen.stats.forwards;
    b.preempted += gen.stats.preemptions;
    const at::Tensor toks = gen.tokens.cpu(), mask = gen.mask.cpu(), lp = gen.logprobs.cpu(),
                     stop = gen.stopped.defined() ? gen.stopped.cpu() : at::zeros({A}, at::kBool);
    for (int64_t j = 0; j < A; ++j) {
      const size_t i = act[(size_t)j];
      std::vector<int64_t> sampled;
      for (int64_t t = 0; t < toks.size(1) && mask[j][t].item<float>() > 0 &&
                          b.used[i] + (int64_t)sampled.size() < R;
           ++t) {
        sampled.push_back(toks[j][t].item<int64_t>());
        b.lps[i].push_back(lp[j][t].item<float>());
      }
      const int64_t count = mask[j].sum().item<float>();
      b.stopped[i] = stop[j].item<bool>() && (int64_t)sampled.size() == count;
      b.conv[i].assistant(sampled);
      b.used[i] += (int64_t)sampled.size();
      ++b.turns[i];
      // The environment's answer to the conversation so far.
      const bool last = turn == rules.maxTurns || b.used[i] >= R;
      nlohmann::ordered_json req;
      req["episode"] = b.episode[i];
      req["sample"] = b.sample[i];
      req["turn"] = turn;
      req["last"] = last;
      if (rules.heldOut)
        req["held_out"] = true;
      req["answer"] = b.answer[i];
      req["messages"] = b.conv[i].messages();
      const env::EnvReply rep = env.request(req.dump());
      if (rep.status != env::EnvStatus::Ok) {
        failEpisode(i, std::string("its environment ") + env::statusName(rep.status) + ": " +
                           rep.why);
        continue;
      }
      const Turn reply = readReply(rep.line);
      if (!reply.why.empty()) {
        env.stop(); // (its state no longer matches the episode's)
        failEpisode(i, "its environment's reply: " + reply.why);
        continue;
      }
      b.reward[i] += reply.reward;
      if (reply.done || last) {
        active[i] = 0;
        continue;
      }
      size_t added = 0;
      try {
        added = b.conv[i].environment(reply.messages);
      } catch (const std::exception &e) {
        failEpisode(i, std::string("rendering the environment's turn: ") + e.what());
        continue;
      }
      b.lps[i].insert(b.lps[i].end(), added, 0.f);
      b.used[i] += (int64_t)added;
      if (b.used[i] >= R) // the response is full: the turn is cut there
        active[i] = 0;
    }
  }
}

void MethodRunner::runEpisodes(MethodCall &c) {
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const plan::CallArgs &a = c.a;
  const int s = c.s;
  // The episode's response: this call's max_tokens (the phase's rollouts
  // are as wide as its widest generate call).
  const int64_t it = c.it, P = ph.P, n = ph.n,
                R = std::min<int64_t>(a.max_tokens().value_or(16), ph.R);
  std::shared_ptr<const data::ChatTemplate> tmpl =
      text_.prompts ? text_.prompts->chatTemplate() : nullptr;
  if (!tmpl)
    throw RunError(describe(s) + ": an episode's turns are rendered with the tokenizer's chat "
                                 "template, and the tokenizer '" + text_.tok->name() +
                   "' has none (give hflow-run --tokenizer a directory whose "
                   "tokenizer_config.json has a chat_template)");
  env::EnvProcess &env = environment(ph, s, a);
  Val &pr = input(c, 0);
  const Span sp = rows_->rowsFor(ph, s, c.in[0], j_.rank);
  const int64_t b = sp.hi - sp.lo, rows = b * n, lo = sp.lo * n;

  // Every episode's conversation, from its prompt's ids as the model sees
  // them and its chat (a text prompt as one user message).
  const at::Tensor ptH = pr["ptoks"].narrow(0, sp.lo, b).cpu(),
                   pmH = pr["pmask"].narrow(0, sp.lo, b).cpu(),
                   idH = pr["ids"].narrow(0, sp.lo, b).cpu();
  EpisodeBatch eps;
  for (int64_t i = 0; i < b; ++i) {
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < P; ++t)
      if (pmH[i][t].item<float>() > 0)
        ids.push_back(ptH[i][t].item<int64_t>());
    nlohmann::ordered_json messages;
    std::string answer;
    if (ph.dataset) {
      const data::Example &ex = (*ph.dataset)[(size_t)idH[i].item<int64_t>()];
      messages = ex.messages.empty()
                     ? nlohmann::ordered_json::array({{{"role", "user"}, {"content", ex.prompt}}})
                     : nlohmann::ordered_json::parse(ex.messages);
      answer = ex.answer;
    } else {
      messages = nlohmann::ordered_json::array(
          {{{"role", "user"}, {"content", text_.tok->decode(ids)}}});
    }
    for (int64_t k = 0; k < n; ++k)
      eps.add(data::Conversation(*text_.tok, tmpl, messages, ids), (int64_t)ids.size(),
              idH[i].item<int64_t>(), k, lo + i * n + k, answer);
  }

  models::SamplingOptions so = samplingOptions(a, c.opts, *text_.tok, text_.stops);
  so.paged = true;
  so.limits.blockSize = a.kv_block_size().value_or(16);
  so.limits.maxSeqs = a.max_num_seqs().value_or(0);
  so.stopWhen = stopStringMatcher(a, text_.tok.get()); // (each turn's own text)
  at::Generator g = models::makeGenerator(
      mix(ph.draw > 0 ? mix(mix(ph.seed, (uint64_t)it), 0xd4a3u + (uint64_t)ph.draw)
                      : mix(ph.seed, (uint64_t)it),
          (uint64_t)sp.lo * 7919 + (uint64_t)s));
  const models::CausalLM *form = rr.generationShards();
  cutGenerationShard(rr);
  const int64_t version = rr.generationVersion();
  // The KV pool of each turn: its rows at their whole conversation, no
  // more than the plan left for it (the engine preempts beyond).
  const models::LlamaConfig &cfg = form ? form->config() : rr.model->config();
  EpisodeRules rules;
  rules.maxTurns = a.max_turns().value_or(1);
  rules.turnTokens = a.turn_tokens().value_or(R);
  rules.responseTokens = R;
  rules.padId = text_.tok->padId();
  rules.blockBytes =
      shape::kvBlockBytes(cfg.shape(), cfg.layers, form ? form->passForm().tp : 1,
                          so.limits.blockSize, (double)at::elementSize(cfg.dtype));
  rules.poolBytes = p_.roles()->Get(rr.index)->kv_pool();
  rules.where = describe(s);
  playEpisodes(
      eps, env,
      [&](const at::Tensor &tp, const at::Tensor &tm, models::SamplingOptions &o) {
        return form ? form->generate(tp, tm, o, g) : rr.model->generate(tp, tm, o, g);
      },
      so, rules);
  const std::vector<std::string> &failures = eps.failures;
  int64_t turnsTaken = 0;
  for (int64_t t : eps.turns)
    turnsTaken += t;

  // The episodes into the rollout's rows, on the host, then one copy per
  // field to the rollout's device.
  const Widths w = ph.widths();
  Val host = makeVal(BatchKind::Rollout, rows, w, /*host=*/true);
  host["rtoks"].fill_(text_.tok->padId());
  const at::Tensor pt = ptH.repeat_interleave(n, 0), pm = pmH.repeat_interleave(n, 0);
  host["ptoks"].copy_(pt);
  host["pmask"].copy_(pm);
  auto rt = host["rtoks"].accessor<int64_t, 2>();
  auto rm = host["rmask"].accessor<float, 2>();
  auto ra = host["ratt"].accessor<float, 2>();
  auto rl = host["lp"].accessor<float, 2>();
  auto rv = host["version"].accessor<int32_t, 2>();
  int64_t trainedTokens = 0, drifts = 0, allTokens = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const size_t iu = (size_t)i;
    const auto &ids = eps.conv[iu].ids();
    const auto &tr = eps.conv[iu].trained();
    const int64_t len = std::min<int64_t>((int64_t)ids.size() - eps.promptLen[iu], R);
    allTokens += std::max<int64_t>(0, len);
    for (int64_t t = 0; t < len; ++t) {
      const size_t k = (size_t)(eps.promptLen[iu] + t);
      rt[i][t] = ids[k];
      ra[i][t] = 1.0f;
      const bool model = tr[k] && !eps.failed[iu];
      rm[i][t] = model ? 1.0f : 0.0f;
      rl[i][t] = model && (size_t)t < eps.lps[iu].size() ? eps.lps[iu][(size_t)t] : 0.0f;
      rv[i][t] = model ? (int32_t)version : -1;
      trainedTokens += model;
    }
    host["stop"][i] = (int64_t)eps.stopped[iu];
    host["envr"][i] = eps.failed[iu] ? 0.0f : (float)eps.reward[iu];
    host["ids"][i] = idH[i / n].item<int64_t>();
    host["group"][i] = sp.lo + i / n;
    drifts += eps.conv[iu].drifts();
  }
  Val ro_ = makeVal(BatchKind::Rollout, ph.batch * n, w);
  for (auto &[name, t] : host.f)
    ro_[name].narrow(0, lo, rows).copy_(t);
  // Each failed episode on stderr (its environment's folder holds its
  // stderr.log), quiet or not: a failure is never silent.
  for (const std::string &f : failures)
    std::fprintf(stderr, "[rank %d] %s: %s (environment folder %s)\n", j_.rank,
                 describe(s).c_str(), f.c_str(), env.folder().c_str());
  if (c.leader) {
    if (c.out.at(0) == ph.rolloutValue) {
      metrics_->lenSum += (double)trainedTokens;
      metrics_->lenN += (double)rows;
      metrics_->genForwards += (double)eps.forwards;
      metrics_->envEpisodes += (double)rows;
      metrics_->envTurns += (double)turnsTaken;
      metrics_->envFailures += (double)failures.size();
      metrics_->envDrifts += (double)drifts;
      metrics_->envTokens += (double)allTokens;
    }
    metrics_->tokens += (double)trainedTokens;
    metrics_->preempt += (double)eps.preempted;
  }
  if (!o_.dumpValues.empty() && c.leader) {
    // This rank's episodes: ids, the model's tokens, every token, rewards.
    const std::string dir = o_.dumpValues + "/" + ph.name + "-" + std::to_string(it + 1);
    try {
      std::filesystem::create_directories(dir);
      models::writeSafetensors(
          dir + "/step-" + std::to_string(s) + "-episodes-rows" + std::to_string(lo) +
              ".safetensors",
          {{"ids", host["ids"]}, {"response", host["rtoks"]},
           {"trained", host["rmask"].to(at::kDouble)}, {"present", host["ratt"].to(at::kDouble)},
           {"reward", host["envr"].to(at::kDouble)}},
          {{"step", describe(s)}});
    } catch (const std::exception &e) {
      throw RunError(std::string("--dump-values: ") + e.what());
    }
  }
  digests_[s] = ro_["rtoks"].narrow(0, lo, rows).sum().item<double>() +
                ro_["lp"].narrow(0, lo, rows).to(at::kDouble).sum().item<double>();
  vals_[c.out.at(0)] = std::move(ro_);
}

} // namespace hflow::exec
