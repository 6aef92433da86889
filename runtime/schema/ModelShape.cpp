//===- ModelShape.cpp - a Llama-family model's parameters -----------------===//
#include "runtime/schema/ModelShape.h"

#include <utility>

namespace hflow::shape {

std::vector<Param> llamaParams(const ModelShape &m) {
  std::vector<Param> ps;
  if (!m.valid())
    return ps;
  const int64_t h = m.hidden, hd = m.headDim();
  const int64_t qDim = m.heads * hd, kvDim = m.kvHeads * hd;
  auto add = [&](std::string name, int64_t rows, int64_t cols, Split s, int64_t layer) {
    Param p;
    p.name = std::move(name);
    p.rows = rows;
    p.cols = cols;
    p.tp = s;
    p.layer = layer;
    ps.push_back(std::move(p));
  };
  add("embed", m.vocab, h, Split::Rows, Param::kFirstStage);
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    add(pre + "attn_norm", 1, h, Split::Replicated, l);
    if (m.mla()) {
      // The latents are replicated over tensor parallelism; the per-head
      // up-projections split by heads (rows), o by their columns.
      const int64_t qk = m.heads * m.qkHeadDim();
      if (m.qLoraRank > 0) {
        add(pre + "attn.q_a", m.qLoraRank, h, Split::Replicated, l);
        add(pre + "attn.q_a_norm", 1, m.qLoraRank, Split::Replicated, l);
        add(pre + "attn.q_b", qk, m.qLoraRank, Split::Rows, l);
      } else {
        add(pre + "attn.q", qk, h, Split::Rows, l);
      }
      add(pre + "attn.kv_a", m.kvLoraRank + m.qkRopeDim, h, Split::Replicated, l);
      add(pre + "attn.kv_a_norm", 1, m.kvLoraRank, Split::Replicated, l);
      add(pre + "attn.kv_b", m.heads * (m.qkNopeDim + m.vHeadDim), m.kvLoraRank, Split::Rows, l);
      add(pre + "attn.o", h, m.heads * m.vHeadDim, Split::Cols, l);
    } else {
      add(pre + "attn.q", qDim, h, Split::Rows, l);
      if (m.qkvBias) // 1-D, split along its length like q's rows
        add(pre + "attn.q_bias", 1, qDim, Split::Cols, l);
      add(pre + "attn.k", kvDim, h, Split::Rows, l);
      if (m.qkvBias)
        add(pre + "attn.k_bias", 1, kvDim, Split::Cols, l);
      add(pre + "attn.v", kvDim, h, Split::Rows, l);
      if (m.qkvBias)
        add(pre + "attn.v_bias", 1, kvDim, Split::Cols, l);
      add(pre + "attn.o", h, qDim, Split::Cols, l);
      if (m.qkNorm) { // one head's width, shared by every head: replicated
        add(pre + "attn.q_norm", 1, hd, Split::Replicated, l);
        add(pre + "attn.k_norm", 1, hd, Split::Replicated, l);
    }
    }
    add(pre + "mlp_norm", 1, h, Split::Replicated, l);
    if (!m.moeLayer(l)) {
      add(pre + "mlp.gate", m.ffn, h, Split::Rows, l);
      add(pre + "mlp.up", m.ffn, h, Split::Rows, l);
      add(pre + "mlp.down", h, m.ffn, Split::Cols, l);
      continue;
    }
    // The router is replicated; each expert splits as the dense MLP does.
    add(pre + "mlp.router", m.experts, h, Split::Replicated, l);
    if (m.routerBias)
      add(pre + "mlp.router_bias", 1, m.experts, Split::Replicated, l);
    for (int64_t e = 0; e < m.experts; ++e) {
      const std::string ex = pre + "mlp.experts." + std::to_string(e) + ".";
      add(ex + "gate", m.expertFfn, h, Split::Rows, l);
      add(ex + "up", m.expertFfn, h, Split::Rows, l);
      add(ex + "down", h, m.expertFfn, Split::Cols, l);
      for (size_t i = ps.size() - 3; i < ps.size(); ++i)
        ps[i].expert = e, ps[i].experts = m.experts;
    }
    if (m.sharedExperts > 0) { // split as the dense MLP is
      const int64_t fs = m.sharedExperts * m.expertFfn;
      add(pre + "mlp.shared.gate", fs, h, Split::Rows, l);
      add(pre + "mlp.shared.up", fs, h, Split::Rows, l);
      add(pre + "mlp.shared.down", h, fs, Split::Cols, l);
    }
  }
  add("final_norm", 1, h, Split::Replicated, Param::kLastStage);
  if (m.lmHead && !m.tieEmbeddings)
    add("lm_head", m.vocab, h, Split::Rows, Param::kLastStage);
  return ps;
}

int64_t attentionParamCount(const ModelShape &m) {
  const int64_t h = m.hidden;
  if (m.mla()) {
    const int64_t qk = m.heads * m.qkHeadDim();
    const int64_t q = m.qLoraRank > 0 ? m.qLoraRank * h + m.qLoraRank + qk * m.qLoraRank : qk * h;
    return q + (m.kvLoraRank + m.qkRopeDim) * h + m.kvLoraRank +
           m.heads * (m.qkNopeDim + m.vHeadDim) * m.kvLoraRank + h * m.heads * m.vHeadDim;
  }
  const int64_t hd = m.headDim(), q = m.heads * hd, kv = m.kvHeads * hd;
  int64_t n = h * q + 2 * h * kv + q * h;
  if (m.qkvBias)
    n += q + 2 * kv;
  if (m.qkNorm)
    n += 2 * hd;
  return n;
}
namespace {
/// Every routed expert's weights in one mixture layer.
int64_t routedParams(const ModelShape &m) { return m.experts * 3 * m.hidden * m.expertFfn; }
} // namespace

int64_t layerParamCount(const ModelShape &m, int64_t l) {
  const int64_t h = m.hidden;
  int64_t perLayer = 2 * h + attentionParamCount(m);
  if (m.moeLayer(l))
    perLayer += m.experts * h + (m.routerBias ? m.experts : 0) + routedParams(m) +
                3 * h * m.sharedExperts * m.expertFfn;
  else
    perLayer += 3 * h * m.ffn;
  return perLayer;
}

int64_t layerParamCount(const ModelShape &m) {
  const int64_t L = m.layers > 0 ? m.layers : 1;
  return (m.denseLayers * layerParamCount(m, 0) +
          (m.layers - m.denseLayers) * layerParamCount(m, m.layers - 1)) /
         L;
}

int64_t paramCount(const ModelShape &m) {
  const int64_t h = m.hidden;
  const int64_t layers = m.denseLayers * layerParamCount(m, 0) +
                         (m.layers - m.denseLayers) * layerParamCount(m, m.layers - 1);
  return m.vocab * h + layers + h + (m.lmHead && !m.tieEmbeddings ? h * m.vocab : 0);
}

int64_t activeParamCount(const ModelShape &m) {
  const int64_t idle = m.moe() ? (m.experts - m.expertsPerToken) * 3 * m.hidden * m.expertFfn : 0;
  return paramCount(m) - m.moeLayers() * idle;
}

int64_t heldParamCount(const ModelShape &m, int64_t ep) {
  const int64_t experts = m.moeLayers() * routedParams(m);
  return ep > 1 ? paramCount(m) - experts + experts / ep : paramCount(m);
}

} // namespace hflow::shape
