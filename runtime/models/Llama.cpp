//===- Llama.cpp - a Llama-family decoder on ATen ---------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/Device.h"
#include "runtime/models/Layers.h"
#include "runtime/models/Moe.h"
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/Safetensors.h"

#include "runtime/comm/Communicator.h"
#include "runtime/plan/PlanModel.h"
#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/plan_generated.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::models {

std::string LlamaConfig::validate() const {
  auto s = [](int v) { return std::to_string(v); };
  if (layers <= 0 || hidden <= 0 || heads <= 0 || kvHeads <= 0 || ffn <= 0 ||
      vocab <= 0)
    return "model " + name + ": layers, hidden, heads, kv_heads, ffn and vocab "
           "must all be positive";
  if (headSize < 0)
    return "model " + name + ": head_dim " + s(headSize) + " is negative";
  if (kvLoraRank == 0 && headSize == 0 && hidden % heads != 0)
    return "model " + name + ": hidden " + s(hidden) +
           " is not divisible by heads " + s(heads);
  if (slidingWindow < 0)
    return "model " + name + ": sliding_window " + std::to_string(slidingWindow) +
           " is negative";
  if (heads % kvHeads != 0)
    return "model " + name + ": heads " + s(heads) +
           " is not divisible by kv_heads " + s(kvHeads);
  if (kvLoraRank == 0 && headDim() % 2 != 0)
    return "model " + name + ": head dim " + s(headDim()) +
           " must be even for RoPE";
  if (experts < 0 || (experts > 0 && (expertsPerToken < 1 || expertsPerToken > experts ||
                                      expertFfn < 1)))
    return "model " + name + ": a mixture of " + s(experts) + " experts needs 1 <= " +
           "experts per token (" + s(expertsPerToken) + ") <= experts and a positive " +
           "expert width (" + s(expertFfn) + ")";
  if (sharedExperts < 0 || denseLayers < 0 || (experts > 0 && denseLayers >= layers) ||
      (experts == 0 && (sharedExperts > 0 || denseLayers > 0 || sigmoidRouter)))
    return "model " + name + ": shared experts (" + s(sharedExperts) + "), dense first layers (" +
           s(denseLayers) + ") and a sigmoid router need a mixture, and fewer than the " +
           s(layers) + " layers dense";
  if (sigmoidRouter && (groups < 1 || topkGroups < 1 || topkGroups > groups ||
                        experts % groups != 0 || experts / groups < 2 ||
                        expertsPerToken > topkGroups * (experts / groups) ||
                        !(routedScaling > 0) || !std::isfinite(routedScaling)))
    return "model " + name + ": a grouped router of " + s(experts) + " experts in " + s(groups) +
           " groups keeping " + s(topkGroups) + " (each group at least 2 experts, the kept " +
           "groups' experts at least the " + s(expertsPerToken) + " a token takes, a " +
           "positive scaling)";
  if (kvLoraRank < 0 || qLoraRank < 0 ||
      (kvLoraRank > 0 && (qkNopeDim < 1 || qkRopeDim < 2 || qkRopeDim % 2 != 0 || vHeadDim < 1 ||
                          kvHeads != heads)) ||
      (kvLoraRank == 0 && (qLoraRank || qkNopeDim || qkRopeDim || vHeadDim)))
    return "model " + name + ": a latent attention needs positive ranks and head widths, an " +
           "even RoPE part and kv_heads equal to heads (kv_lora_rank " + s(kvLoraRank) +
           ", qk_rope_head_dim " + s(qkRopeDim) + ")";
  if (ropeScaling.yarn() && !mla())
    return "model " + name + ": YaRN's RoPE is built for DeepSeek-V3's latent attention only";
  return "";
}

double LlamaConfig::attentionScale() const {
  const int qk = mla() ? qkNopeDim + qkRopeDim : headDim();
  double scale = 1.0 / std::sqrt((double)qk);
  if (mla() && ropeScaling.yarn() && ropeScaling.mscaleAllDim > 0) {
    const double m = rope::yarnMscale(ropeScaling.factor, ropeScaling.mscaleAllDim);
    scale *= m * m;
  }
  return scale;
}

shape::ModelShape LlamaConfig::shape() const {
  shape::ModelShape m;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kvHeads = kvHeads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.tieEmbeddings = tieEmbeddings;
  m.qkvBias = qkvBias;
  m.lmHead = lmHead;
  m.headSize = headSize;
  m.qkNorm = qkNorm;
  m.experts = experts;
  m.expertsPerToken = expertsPerToken;
  m.expertFfn = expertFfn;
  m.sharedExperts = sharedExperts;
  m.denseLayers = denseLayers;
  m.routerBias = sigmoidRouter;
  m.qLoraRank = qLoraRank;
  m.kvLoraRank = kvLoraRank;
  m.qkNopeDim = qkNopeDim;
  m.qkRopeDim = qkRopeDim;
  m.vHeadDim = vHeadDim;
  return m;
}

void LlamaConfig::setShape(const shape::ModelShape &m) {
  layers = int(m.layers);
  hidden = int(m.hidden);
  heads = int(m.heads);
  kvHeads = int(m.kvHeads);
  ffn = int(m.ffn);
  vocab = int(m.vocab);
  tieEmbeddings = m.tieEmbeddings;
  qkvBias = m.qkvBias;
  lmHead = m.lmHead;
  headSize = int(m.headSize);
  qkNorm = m.qkNorm;
  experts = int(m.experts);
  expertsPerToken = int(m.expertsPerToken);
  expertFfn = int(m.expertFfn);
  sharedExperts = int(m.sharedExperts);
  denseLayers = int(m.denseLayers);
  sigmoidRouter = m.routerBias;
  qLoraRank = int(m.qLoraRank);
  kvLoraRank = int(m.kvLoraRank);
  qkNopeDim = int(m.qkNopeDim);
  qkRopeDim = int(m.qkRopeDim);
  vHeadDim = int(m.vHeadDim);
}

int64_t LlamaConfig::paramCount() const { return shape::paramCount(shape()); }

bool LlamaConfig::fromPlan(const plan::Model &m, LlamaConfig &out,
                           std::string &error) {
  LlamaConfig c;
  c.name = m.name() ? m.name()->str() : "model";
  std::string arch = m.arch() ? m.arch()->str() : "";
  if (!arch.empty() && arch != "llama" && arch != "qwen2" && arch != "qwen3" &&
      arch != "mistral" && arch != "qwen3_moe" && arch != "mixtral" && arch != "deepseek_v3") {
    error = "model " + c.name + ": architecture '" + arch +
            "' is not supported by this runtime (only 'llama', 'qwen2', 'qwen3', "
            "'mistral', 'qwen3_moe', 'mixtral' and 'deepseek_v3')";
    return false;
  }
  c.arch = arch.empty() ? "llama" : arch;
  if (m.dtype() != plan::DType::F32 && m.dtype() != plan::DType::BF16) {
    error = "model " + c.name + ": dtype " +
            std::string(plan::EnumNameDType(m.dtype())) +
            " is not supported by this runtime (only F32 and BF16)";
    return false;
  }
  c.dtype = m.dtype() == plan::DType::BF16 ? at::kBFloat16 : at::kFloat;
  c.setShape(plan::modelShape(m));
  c.ropeTheta = m.rope_theta();
  c.normEps = m.norm_eps();
  if (const plan::RopeScaling *rs = m.rope_scaling()) {
    c.ropeScaling.factor = rs->factor();
    c.ropeScaling.lowFreqFactor = rs->low_freq_factor();
    c.ropeScaling.highFreqFactor = rs->high_freq_factor();
    c.ropeScaling.originalMaxPositions = rs->original_max_positions();
    if (rs->yarn()) {
      c.ropeScaling.kind = rope::RopeScaling::Kind::Yarn;
      c.ropeScaling.betaFast = rs->beta_fast();
      c.ropeScaling.betaSlow = rs->beta_slow();
      c.ropeScaling.mscale = rs->mscale();
      c.ropeScaling.mscaleAllDim = rs->mscale_all_dim();
    }
  }
  c.slidingWindow = m.sliding_window();
  c.normTopk = m.norm_topk_prob();
  c.routerAuxCoef = m.router_aux_loss_coef();
  c.routerAuxLoss = m.router_aux_loss();
  c.groups = m.expert_groups();
  c.topkGroups = m.topk_groups();
  c.routedScaling = m.routed_scaling();
  c.ropeInterleave = m.rope_interleave();
  const bool moeArch = c.arch == "qwen3_moe" || c.arch == "mixtral" || c.arch == "deepseek_v3";
  if (moeArch != (c.experts > 0)) {
    error = "model " + c.name + ": architecture '" + c.arch + "' with " +
            std::to_string(c.experts) + " experts: qwen3_moe, mixtral and deepseek_v3 are " +
            "mixtures of experts, the other architectures dense";
    return false;
  }
  // DeepSeek-V3's latent attention and router come together, and only
  // with its arch.
  const bool deepseek = c.arch == "deepseek_v3";
  if (deepseek != c.mla() || deepseek != c.sigmoidRouter ||
      (!deepseek && (c.sharedExperts > 0 || c.denseLayers > 0 || c.ropeInterleave))) {
    error = "model " + c.name + ": architecture '" + c.arch +
            "': a latent attention, a sigmoid router, shared experts and dense first layers " +
            "are DeepSeek-V3's (deepseek_v3), which has the first two";
    return false;
  }
  if (!(c.routerAuxCoef >= 0) || !std::isfinite(c.routerAuxCoef)) {
    error = "model " + c.name + ": router_aux_loss_coef must be a non-negative number";
    return false;
  }
  error = c.validate();
  if (!error.empty())
    return false;
  if (m.params() != 0 && m.params() != c.paramCount()) {
    error = "model " + c.name + ": the plan says " + std::to_string(m.params()) +
            " parameters but the runtime's Llama has " +
            std::to_string(c.paramCount());
    return false;
  }
  out = c;
  return true;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t modelSeed(int64_t planSeed, int modelIndex) {
  return splitmix64(splitmix64((uint64_t)planSeed) ^
                    (0x6d6f64656cULL + (uint64_t)(int64_t)modelIndex));
}

struct Llama::Weights {
  /// A layer's weights as decoderLayer takes them (ParallelDetail.h).
  using Layer = detail::LayerWeights;
  at::Tensor embed, finalNorm, head;
  std::vector<Layer> layers;

  /// A layer's tensors in the order parameters() lists them: the
  /// projections and stacks, then the biases and q/k norms (after every
  /// layer's), then DeepSeek's (latent attention, shared experts, router
  /// bias) last.
  static std::vector<at::Tensor *> firstOf(Layer &l) {
    return {&l.attnNorm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlpNorm, &l.gate, &l.up,
            &l.down, &l.moe.router, &l.moe.gate, &l.moe.up, &l.moe.down};
  }
  static std::vector<at::Tensor *> secondOf(Layer &l) {
    return {&l.bq, &l.bk, &l.bv, &l.qNorm, &l.kNorm};
  }
  static std::vector<at::Tensor *> thirdOf(Layer &l) {
    return {&l.qA, &l.qANorm, &l.qB, &l.kvA, &l.kvANorm, &l.kvB, &l.sharedGate, &l.sharedUp,
            &l.sharedDown, &l.moe.bias};
  }

  std::vector<at::Tensor> all() const {
    std::vector<at::Tensor> v{embed};
    auto &self = const_cast<Weights &>(*this);
    for (auto *group : {&firstOf, &secondOf, &thirdOf})
      for (auto &l : self.layers)
        for (at::Tensor *t : (*group)(l))
          if (t->defined())
            v.push_back(*t);
    v.push_back(finalNorm);
    if (head.defined() && !head.is_same(embed))
      v.push_back(head);
    return v;
  }
};

Llama::Llama(const LlamaConfig &c, uint64_t seed)
    : config_(c), w_(std::make_unique<Weights>()) {
  if (std::string e = c.validate(); !e.empty())
    throw std::invalid_argument(e);
  c10::NoGradGuard noGrad; // plain tensors (not inference tensors): trainable later
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  const int64_t H = c.hidden, V = c.vocab, F = c.ffn, hd = c.headDim();
  auto mat = [&](int64_t rows, int64_t cols) {
    return at::empty({rows, cols}, opts).normal_(0.0, 0.02, gen);
  };
  w_->embed = mat(V, H);
  for (int i = 0; i < c.layers; ++i) {
    Weights::Layer l;
    l.attnNorm = at::ones({H}, opts);
    if (c.mla()) {
      const int64_t qk = c.heads * (c.qkNopeDim + c.qkRopeDim);
      if (c.qLoraRank > 0) {
        l.qA = mat(c.qLoraRank, H);
        l.qANorm = at::ones({c.qLoraRank}, opts);
        l.qB = mat(qk, c.qLoraRank);
      } else {
        l.wq = mat(qk, H);
      }
      l.kvA = mat(c.kvLoraRank + c.qkRopeDim, H);
      l.kvANorm = at::ones({c.kvLoraRank}, opts);
      l.kvB = mat(c.heads * (c.qkNopeDim + c.vHeadDim), c.kvLoraRank);
      l.wo = mat(H, c.heads * c.vHeadDim);
    } else {
      l.wq = mat(c.heads * hd, H);
      l.wk = mat(c.kvHeads * hd, H);
      l.wv = mat(c.kvHeads * hd, H);
      l.wo = mat(H, c.heads * hd);
    }
    l.mlpNorm = at::ones({H}, opts);
    if (c.moeLayer(i)) {
      const int64_t E = c.experts, Fe = c.expertFfn;
      l.moe.router = mat(E, H);
      l.moe.gate = at::empty({E, Fe, H}, opts).normal_(0.0, 0.02, gen);
      l.moe.up = at::empty({E, Fe, H}, opts).normal_(0.0, 0.02, gen);
      l.moe.down = at::empty({E, H, Fe}, opts).normal_(0.0, 0.02, gen);
      if (c.sharedExperts > 0) {
        const int64_t Fs = c.sharedExperts * Fe;
        l.sharedGate = mat(Fs, H);
        l.sharedUp = mat(Fs, H);
        l.sharedDown = mat(H, Fs);
      }
      if (c.sigmoidRouter) // zeros, as transformers initialises it
        l.moe.bias = at::zeros({E}, opts);
    } else {
      l.gate = mat(F, H);
      l.up = mat(F, H);
      l.down = mat(H, F);
    }
    w_->layers.push_back(std::move(l));
  }
  w_->finalNorm = at::ones({H}, opts);
  w_->head = c.tieEmbeddings ? w_->embed : mat(V, H);
  // A headless body draws the head all the same (and drops it), so its
  // weights equal those of the causal LM of the same config and seed.
  if (!c.lmHead)
    w_->head = at::Tensor();
  // Biases last, so configs without them draw the same weights as before.
  if (c.qkvBias)
    for (auto &l : w_->layers) {
      l.bq = at::empty({c.heads * hd}, opts).normal_(0.0, 0.02, gen);
      l.bk = at::empty({c.kvHeads * hd}, opts).normal_(0.0, 0.02, gen);
      l.bv = at::empty({c.kvHeads * hd}, opts).normal_(0.0, 0.02, gen);
    }
  // Norm weights are ones, as the other norms (and transformers' init).
  if (c.qkNorm)
    for (auto &l : w_->layers) {
      l.qNorm = at::ones({hd}, opts);
      l.kNorm = at::ones({hd}, opts);
    }
  // Every weight through `f` (a tied head stays the embedding).
  auto eachWeight = [&](const std::function<at::Tensor(const at::Tensor &)> &f) {
    const bool tied = w_->head.defined() && w_->head.is_same(w_->embed);
    auto apply = [&](at::Tensor &t) {
      if (t.defined())
        t = f(t);
    };
    apply(w_->embed);
    for (auto &l : w_->layers)
      for (at::Tensor *t : l.tensors())
        apply(*t);
    apply(w_->finalNorm);
    if (tied)
      w_->head = w_->embed;
    else
      apply(w_->head);
  };
  // A 16-bit model: the same draws, rounded (ties to even).
  if (c.dtype != at::kFloat)
    eachWeight([&](const at::Tensor &t) { return t.to(c.dtype); });
  // Drawn on the host (the same weights on every device), then placed on
  // the engine's device once.
  if (!engineDevice().is_cpu()) {
    const at::Device dev = engineDevice();
    eachWeight([&](const at::Tensor &t) { return t.to(dev); });
  }
}

Llama::~Llama() = default;

void Llama::keepExperts(comm::Communicator &ep, std::vector<int64_t> runs) {
  const int64_t E = config_.experts, e = ep.size();
  if (E == 0 || e < 1 || E % e != 0)
    throw std::invalid_argument("model " + config_.name + ": expert parallelism over " +
                                std::to_string(e) + " ranks needs a mixture whose experts (" +
                                std::to_string(E) + ") they divide");
  if (ep_)
    throw std::logic_error("model " + config_.name + " already keeps a run of its experts");
  const int64_t El = E / e;
  if (!runs.empty()) {
    checkExpertRuns(runs, e); // one run for each member
    ownerKey_ = expertOwnerKey(runs, E);
  }
  firstExpert_ = (runs.empty() ? ep.rank() : runs[(size_t)ep.rank()]) * El;
  runs_ = std::move(runs);
  c10::NoGradGuard noGrad;
  for (auto &l : w_->layers)
    for (at::Tensor *t : {&l.moe.gate, &l.moe.up, &l.moe.down})
      if (t->defined()) // (not on DeepSeek's dense first layers)
        *t = t->narrow(0, firstExpert_, El).clone(); // the rest freed
  ep_ = &ep;
}

std::vector<at::Tensor> Llama::expertParameters() const {
  std::vector<at::Tensor> v;
  for (auto &l : w_->layers)
    for (const at::Tensor *t : {&l.moe.gate, &l.moe.up, &l.moe.down})
      if (t->defined())
        v.push_back(*t);
  return v;
}

std::vector<at::Tensor> Llama::denseParameters() const {
  std::vector<at::Tensor> v;
  const std::vector<at::Tensor> experts = expertParameters();
  for (const at::Tensor &t : parameters()) {
    bool expert = false;
    for (const at::Tensor &x : experts)
      expert = expert || t.is_same(x);
    if (!expert)
      v.push_back(t);
  }
  return v;
}

std::vector<std::pair<std::string, at::Tensor>> Llama::namedParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto add = [&](std::string name, const at::Tensor &t) {
    out.emplace_back(std::move(name), t.dim() == 1 ? t.view({1, t.size(0)}) : t);
  };
  add("embed", w_->embed);
  for (size_t i = 0; i < w_->layers.size(); ++i) {
    const auto &l = w_->layers[i];
    const std::string pre = "layers." + std::to_string(i) + ".";
    add(pre + "attn_norm", l.attnNorm);
    if (l.kvA.defined()) { // latent attention (shape::llamaParams' order)
      if (l.qA.defined()) {
        add(pre + "attn.q_a", l.qA);
        add(pre + "attn.q_a_norm", l.qANorm);
        add(pre + "attn.q_b", l.qB);
      } else {
        add(pre + "attn.q", l.wq);
      }
      add(pre + "attn.kv_a", l.kvA);
      add(pre + "attn.kv_a_norm", l.kvANorm);
      add(pre + "attn.kv_b", l.kvB);
      add(pre + "attn.o", l.wo);
    } else {
      add(pre + "attn.q", l.wq);
      if (l.bq.defined())
        add(pre + "attn.q_bias", l.bq);
      add(pre + "attn.k", l.wk);
      if (l.bk.defined())
        add(pre + "attn.k_bias", l.bk);
      add(pre + "attn.v", l.wv);
      if (l.bv.defined())
        add(pre + "attn.v_bias", l.bv);
      add(pre + "attn.o", l.wo);
      if (l.qNorm.defined()) {
        add(pre + "attn.q_norm", l.qNorm);
        add(pre + "attn.k_norm", l.kNorm);
    }
    }
    add(pre + "mlp_norm", l.mlpNorm);
    if (!l.moe.router.defined()) {
      add(pre + "mlp.gate", l.gate);
      add(pre + "mlp.up", l.up);
      add(pre + "mlp.down", l.down);
      continue;
    }
    // Each expert's weights as views of the stacked ones.
    add(pre + "mlp.router", l.moe.router);
    if (l.moe.bias.defined())
      add(pre + "mlp.router_bias", l.moe.bias);
    for (int64_t e = 0; e < l.moe.gate.size(0); ++e) {
      const std::string ex = pre + "mlp.experts." + std::to_string(firstExpert_ + e) + ".";
      add(ex + "gate", l.moe.gate[e]);
      add(ex + "up", l.moe.up[e]);
      add(ex + "down", l.moe.down[e]);
    }
    if (l.sharedGate.defined()) {
      add(pre + "mlp.shared.gate", l.sharedGate);
      add(pre + "mlp.shared.up", l.sharedUp);
      add(pre + "mlp.shared.down", l.sharedDown);
    }
  }
  add("final_norm", w_->finalNorm);
  if (w_->head.defined() && !w_->head.is_same(w_->embed))
    add("lm_head", w_->head);
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>>
llamaParameterShapes(const LlamaConfig &c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const shape::Param &p : shape::llamaParams(c.shape()))
    out.push_back({p.name, {p.rows, p.cols}});
  return out;
}

int64_t Llama::numParameters() const {
  int64_t n = 0;
  for (auto &t : w_->all())
    n += t.numel();
  return n;
}

std::vector<at::Tensor> Llama::parameters() const { return w_->all(); }

void Llama::setTrainable(bool trainable) {
  for (at::Tensor &t : w_->all())
    t.requires_grad_(trainable);
}

void Llama::copyFrom(const Llama &other) {
  auto mine = w_->all(), theirs = other.w_->all();
  if (mine.size() != theirs.size())
    throw std::invalid_argument("Llama::copyFrom: models differ in structure");
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!mine[i].sizes().equals(theirs[i].sizes()))
      throw std::invalid_argument("Llama::copyFrom: models differ in shape");
    mine[i].copy_(theirs[i]);
  }
}

at::Tensor rmsNorm(const at::Tensor &x, const at::Tensor &w, double eps) {
  // transformers' LlamaRMSNorm: the statistics and the scaling in float32,
  // back to the input's type, then the weight. LibTorch's at::rms_norm
  // (from 2.4; one fused kernel on CUDA in later versions, where the chain
  // below is seven) computes the same and returns the input's type; given
  // the weight, its fused kernel would apply it before that rounding, so
  // the weight comes after it here (hflow-gpu-kernels --cases norm checks
  // it against the chain). Without it, the chain itself.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return w * at::rms_norm(x, {x.size(-1)}, {}, eps);
#else
  if (x.scalar_type() == at::kFloat)
    return x * at::rsqrt(x.pow(2).mean({-1}, /*keepdim=*/true) + eps) * w;
  at::Tensor f = x.to(at::kFloat);
  return w * (f * at::rsqrt(f.pow(2).mean({-1}, /*keepdim=*/true) + eps)).to(x.scalar_type());
#endif
}

at::Tensor rotateHalf(const at::Tensor &x) {
  int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor headNorm(const at::Tensor &x, const at::Tensor &w, double eps) {
  return w.defined() ? rmsNorm(x, w, eps) : x;
}

std::pair<at::Tensor, at::Tensor> ropeTables(const LlamaConfig &c, const at::Tensor &positions) {
  const int64_t hd = c.ropeDim();
  auto dopts = positions.options().dtype(at::kDouble);
  at::Tensor invFreq;
  if (!c.ropeScaling.active()) {
    invFreq = at::pow(c.ropeTheta, at::arange(0, hd, 2, dopts) / hd).reciprocal();
  } else {
    std::vector<double> f(hd / 2);
    for (int64_t i = 0; i < hd / 2; ++i)
      f[i] = rope::ropeInvFreq(i, hd, c.ropeTheta, c.ropeScaling);
    // To a GPU from pinned memory without waiting for it (a decode window's
    // steps never wait for the device; docs/runtime.md).
    invFreq = at::tensor(f, dopts.device(at::kCPU));
    if (!positions.is_cpu())
      invFreq = invFreq.pin_memory().to(positions.device(), /*non_blocking=*/true);
  }
  at::Tensor freqs = positions.to(at::kDouble).unsqueeze(-1) * invFreq; // [B,T,hd/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  if (const double af = rope::ropeAttentionFactor(c.ropeScaling); af != 1.0) // YaRN's
    return {(emb.cos() * af).to(c.dtype).unsqueeze(1), (emb.sin() * af).to(c.dtype).unsqueeze(1)};
  return {emb.cos().to(c.dtype).unsqueeze(1), emb.sin().to(c.dtype).unsqueeze(1)};
}

at::Tensor scoredPositions(const at::Tensor &tokens, const at::Tensor &mask, int64_t padToken) {
  const int64_t T = tokens.size(1);
  at::Tensor idx = at::arange(T, tokens.options().dtype(at::kLong)).unsqueeze(0).expand_as(tokens);
  at::Tensor real = mask > 0;
  // -1 where not eligible; the max is the rightmost eligible position.
  at::Tensor eligible = at::where(real & (tokens != padToken), idx, at::full_like(idx, -1));
  at::Tensor lastReal = at::where(real, idx, at::full_like(idx, -1)).amax(1).clamp_min(0);
  at::Tensor pick = eligible.amax(1);
  return at::where(pick >= 0, pick, lastReal);
}

at::Tensor positionsFromMask(const at::Tensor &mask) {
  return (mask.ne(0).to(at::kLong).cumsum(-1) - 1).clamp_min(0);
}

at::Tensor checkedReplay(const LlamaConfig &c, const at::Tensor &replay, int64_t B, int64_t T,
                         const char *who) {
  if (!replay.defined())
    return replay;
  const std::vector<int64_t> want = {B, T, c.moeLayers(), c.expertsPerToken};
  if (replay.sizes().vec() != want)
    throw std::invalid_argument(std::string(who) + ": a routing replay of shape " +
                                shapeString(replay.sizes()) +
                                " for [tokens' rows, columns, mixture layers, experts per token] = " +
                                shapeString(want));
  at::Tensor r = replay.to(engineDevice(), at::kLong);
  if (r.numel() > 0 && r.max().item<int64_t>() >= c.experts)
    throw std::invalid_argument(std::string(who) + ": a replayed expert id out of [0, " +
                                std::to_string(c.experts) + ")");
  return r;
}

at::Tensor Llama::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                         const at::Tensor &keyMask, KvStore *cache,
                         MoeTrace *moe) const {
  const auto &c = config_;
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument("Llama: tokens must be int64 [B, T]");
  requireOnEngine(tokens, "Llama forward: tokens");
  // RoPE's tables at each token's own position, the mask of the keys
  // (the cached ones, then these) each query sees, the softmax scale.
  const detail::AttnContext a = detail::attnContext(c, tokens, positions, keyMask, "Llama", cache);
  detail::MoeCall mc;
  if (c.experts > 0) {
    mc.rule = routerRule(c), mc.firstMoeLayer = c.denseLayers, mc.trace = moe;
    mc.ep = ep_, mc.ownerKey = ownerKey_;
    if (moe)
      mc.replay = checkedReplay(c, moe->replay, a.B, a.T, "Llama");
  }
  at::Tensor x = at::embedding(w_->embed, tokens); // [B, T, H]
  // Each layer through the decoder layer every form shares, under the
  // role's recompute option while a training pass records gradients
  // (layerStep keeps what the option says).
  // (a mixture's layers are not recomputed: hflowc refuses the option there)
  const shape::Recompute recompute = c.experts > 0 ? shape::Recompute::None : c.recompute;
  for (size_t li = 0; li < w_->layers.size(); ++li)
    x = detail::layerStep(recompute, x, w_->layers[li], a, c.heads, c.kvHeads, c.normEps,
                          nullptr, cache, li, &mc);
  if (cache)
    cache->commit(a.keyReal, positions);
  return rmsNorm(x, w_->finalNorm, c.normEps);
}

at::Tensor KVCache::keyReal(const at::Tensor &newReal) const {
  return len > 0 ? at::cat({keyMask, newReal}, 1) : newReal;
}

std::pair<at::Tensor, at::Tensor> KVCache::append(size_t li, const at::Tensor &kNew,
                                                  const at::Tensor &vNew) {
  if (k.size() <= li) {
    k.resize(li + 1);
    v.resize(li + 1);
  }
  if (len > 0) {
    k[li] = at::cat({k[li], kNew}, 2);
    v[li] = at::cat({v[li], vNew}, 2);
  } else {
    k[li] = kNew;
    v[li] = vNew;
  }
  return {k[li], v[li]};
}

void KVCache::commit(const at::Tensor &real, const at::Tensor &positions) {
  keyMask = real;
  len = real.size(1);
  nextPos = positions.select(1, positions.size(1) - 1) + 1;
}

at::Tensor Llama::logits(const at::Tensor &h) const {
  if (!w_->head.defined())
    throw std::logic_error("model " + config_.name +
                           " has no LM head (a critic's or reward model's body)");
  return at::linear(h, w_->head);
}

at::Tensor Llama::forward(const at::Tensor &tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument("Llama::forward: tokens must be int64 [B, T]");
  at::Tensor pos = at::arange(tokens.size(1), tokens.options()).unsqueeze(0).expand(
      {tokens.size(0), tokens.size(1)});
  return logits(hidden(tokens, pos, at::Tensor()));
}

at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                         double temperature) {
  at::Tensor f = logits.to(at::kFloat);
  at::Tensor l = temperature > 0 && temperature != 1.0 ? f / temperature : f;
  return at::log_softmax(l, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
}

at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) {
  at::Tensor f = logits.to(at::kFloat);
  at::Tensor l = temperature > 0 && temperature != 1.0 ? f / temperature : f;
  at::Tensor lp = at::log_softmax(l, -1);
  return -(lp.exp() * lp).sum(-1);
}

at::Tensor samplingLogits(const at::Tensor &logits, const SamplingOptions &o) {
  at::Tensor l = logits / o.temperature;
  const int64_t V = l.size(-1);
  if (o.topK > 0 && o.topK < V) {
    at::Tensor kth = std::get<0>(l.topk(o.topK, -1)).narrow(-1, o.topK - 1, 1);
    l = l.masked_fill(l.lt(kth), -std::numeric_limits<float>::infinity());
  }
  if (o.topP < 1.0) {
    auto [sorted, idx] = l.sort(-1, /*descending=*/true);
    at::Tensor probs = at::softmax(sorted, -1);
    // Drop a token when the mass before it already reaches top_p (the most
    // likely token is always kept).
    at::Tensor before = probs.cumsum(-1) - probs;
    at::Tensor drop = before.ge(o.topP);
    sorted = sorted.masked_fill(drop, -std::numeric_limits<float>::infinity());
    l = at::full_like(l, -std::numeric_limits<float>::infinity()).scatter(-1, idx, sorted);
  }
  return l;
}

/// One token per row from [B, V] logits.
static at::Tensor sampleNext(const at::Tensor &logits, const SamplingOptions &o,
                             at::Generator &gen) {
  if (o.greedy || o.temperature <= 0)
    return logits.argmax(-1);
  at::Tensor l = samplingLogits(logits, o);
  return at::multinomial(at::softmax(l, -1), 1, /*replacement=*/false, gen).squeeze(-1);
}

Generation emptyGeneration(int64_t B, int64_t R, int64_t padToken,
                           const at::TensorOptions &tokenOptions) {
  Generation g;
  g.tokens = at::full({B, R}, padToken, tokenOptions);
  g.mask = at::zeros({B, R}, tokenOptions.dtype(at::kFloat));
  g.logprobs = at::zeros({B, R}, tokenOptions.dtype(at::kFloat));
  g.stopped = at::zeros({B}, tokenOptions.dtype(at::kBool));
  return g;
}

/// One batch of rows through the sampling loop (no token budget).
static Generation generateRows(const LogitsFn &step, const at::Tensor &prompts,
                               const at::Tensor &pmask, const SamplingOptions &o,
                               at::Generator &gen, bool useCache, int64_t firstRow) {
  const int64_t B = prompts.size(0), R = o.maxTokens;
  const double temp = (o.greedy || o.temperature <= 0) ? 1.0 : o.temperature;
  Generation g = emptyGeneration(B, R, o.padToken, prompts.options());
  if (R == 0 || B == 0)
    return g;
  at::Tensor done = at::zeros({B}, prompts.options().dtype(at::kBool));
  std::vector<std::vector<int64_t>> responses(o.stopWhen ? (size_t)B : 0);
  KVCache cache;
  at::Tensor seq = prompts, seqMask = pmask;
  at::Tensor last = step(prompts, positionsFromMask(pmask), pmask, useCache ? &cache : nullptr)
                        .select(1, prompts.size(1) - 1);
  for (int64_t t = 0; t < R; ++t) {
    last = last.to(at::kFloat); // 16-bit models sample from float32 logits
    at::Tensor next = sampleNext(last, o, gen);
    next = at::where(done, at::full_like(next, o.padToken), next);
    at::Tensor live = done.logical_not();
    g.tokens.select(1, t).copy_(next);
    g.mask.select(1, t).copy_(live.to(at::kFloat));
    g.logprobs.select(1, t).copy_(
        at::where(live, tokenLogprobs(last, next, temp), at::zeros_like(last.select(1, 0))));
    if (o.stopToken >= 0)
      done = done | next.eq(o.stopToken);
    for (int64_t stop : o.moreStopTokens)
      done = done | next.eq(stop);
    if (o.stopWhen) {
      // Stop strings read each live row's response so far on the host.
      at::Tensor hostNext = next.cpu(), hostLive = live.cpu();
      auto N = hostNext.accessor<int64_t, 1>();
      auto L = hostLive.accessor<bool, 1>();
      std::vector<uint8_t> ends((size_t)B, 0);
      for (int64_t r = 0; r < B; ++r)
        if (L[r]) {
          responses[(size_t)r].push_back(N[r]);
          ends[(size_t)r] = o.stopWhen(firstRow + r, responses[(size_t)r]);
        }
      done = done | at::from_blob(ends.data(), {B}, at::TensorOptions().dtype(at::kBool))
                        .to(done.device(), /*non_blocking=*/false, /*copy=*/true);
    }
    if (t + 1 == R || done.all().item<bool>())
      break;
    at::Tensor nextCol = next.unsqueeze(1);
    if (useCache) {
      at::Tensor pos = cache.nextPos.unsqueeze(1);
      last = step(nextCol, pos, at::ones({B, 1}, pmask.options()), &cache).select(1, 0);
    } else {
      seq = at::cat({seq, nextCol}, 1);
      seqMask = at::cat({seqMask, at::ones({B, 1}, pmask.options())}, 1);
      last = step(seq, positionsFromMask(seqMask), seqMask, nullptr)
                 .select(1, seq.size(1) - 1);
    }
  }
  g.stopped = done; // ended on a stop token or string (the rest: max tokens)
  // The cache only grows: its final size is its largest.
  for (const std::vector<at::Tensor> *kv : {&cache.k, &cache.v})
    for (const at::Tensor &t : *kv)
      if (t.defined())
        g.kvCacheBytes += (int64_t)t.nbytes();
  return g;
}

int64_t batchRowsFor(int64_t maxBatchTokens, int64_t promptLen, int64_t maxTokens,
                     int64_t rows) {
  if (maxBatchTokens <= 0)
    return rows;
  const int64_t perRow = std::max<int64_t>(1, promptLen + maxTokens);
  if (maxBatchTokens < perRow)
    throw std::invalid_argument(
        "generate: max_batch_tokens " + std::to_string(maxBatchTokens) +
        " is smaller than one row (prompt " + std::to_string(promptLen) + " + " +
        std::to_string(maxTokens) + " new tokens = " + std::to_string(perRow) + ")");
  return std::max<int64_t>(1, std::min(rows, maxBatchTokens / perRow));
}

Generation generateWith(const LogitsFn &step, const at::Tensor &prompts,
                        const at::Tensor &promptMask, const SamplingOptions &o,
                        at::Generator &gen, bool useCache) {
  c10::InferenceMode guard;
  if (prompts.dim() != 2 || prompts.scalar_type() != at::kLong)
    throw std::invalid_argument("generate: prompts must be int64 [B, P]");
  if (o.maxTokens < 0)
    throw std::invalid_argument("generate: negative max tokens");
  at::Tensor pmask = promptMask.defined() ? promptMask.ne(0)
                                          : at::ones_like(prompts, at::kBool);
  const int64_t B = prompts.size(0);
  const int64_t rows = batchRowsFor(o.maxBatchTokens, prompts.size(1), o.maxTokens, B);
  if (rows >= B)
    return generateRows(step, prompts, pmask, o, gen, useCache, 0);
  // A token budget: batches of `rows` rows, one after the other, each with
  // its own KV cache; the sampler's stream continues across them.
  Generation g = emptyGeneration(B, o.maxTokens, o.padToken, prompts.options());
  for (int64_t r0 = 0; r0 < B; r0 += rows) {
    const int64_t n = std::min(rows, B - r0);
    Generation part = generateRows(step, prompts.narrow(0, r0, n), pmask.narrow(0, r0, n), o,
                                   gen, useCache, r0);
    g.tokens.narrow(0, r0, n).copy_(part.tokens);
    g.mask.narrow(0, r0, n).copy_(part.mask);
    g.logprobs.narrow(0, r0, n).copy_(part.logprobs);
    g.stopped.narrow(0, r0, n).copy_(part.stopped);
    g.kvCacheBytes = std::max(g.kvCacheBytes, part.kvCacheBytes);
  }
  return g;
}

Generation Llama::generateImpl(const at::Tensor &prompts, const at::Tensor &promptMask,
                               const SamplingOptions &o, at::Generator &gen,
                               bool useCache) const {
  LogitsFn step = [this](const at::Tensor &toks, const at::Tensor &pos,
                         const at::Tensor &mask, KvStore *cache) {
    return logits(hidden(toks, pos, mask, cache));
  };
  return generateWith(step, prompts, promptMask, o, gen, useCache);
}

void Llama::serveExperts() const {
  if (!ep_)
    return;
  c10::InferenceMode guard;
  const at::Tensor none = at::empty({0, config_.hidden}, onEngine(config_.dtype));
  const RouterRule rule = routerRule(config_);
  for (const auto &l : w_->layers)
    if (l.moe.router.defined())
      (void)moeMlpExpertParallel(none, l.moe, rule, *ep_, nullptr, at::Tensor(), ownerKey_);
}

Generation Llama::generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                           const SamplingOptions &opts, at::Generator &gen) const {
  if (ep_)
    throw std::logic_error("generate: model " + config_.name + " holds " +
                           std::to_string(config_.experts / ep_->size()) + " of its " +
                           std::to_string(config_.experts) +
                           " experts (expert parallelism): it does not generate");
  if (opts.paged)
    return generatePaged(*this, prompts, promptMask, opts, gen, opts.limits);
  if (opts.recordRouting)
    throw std::invalid_argument("generate: only the paged engine records a mixture's routing");
  return generateImpl(prompts, promptMask, opts, gen, /*useCache=*/true);
}

Generation Llama::generateNoCache(const at::Tensor &prompts,
                                  const at::Tensor &promptMask,
                                  const SamplingOptions &opts,
                                  at::Generator &gen) const {
  return generateImpl(prompts, promptMask, opts, gen, /*useCache=*/false);
}

} // namespace hflow::models
