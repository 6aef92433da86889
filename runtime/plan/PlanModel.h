//===- PlanModel.h - a plan's model as the shared model shape -------------===//
//
// The runtime reads a plan Model's dimensions here, once, into the type
// the compiler's ModelOp::shape() gives on the other side of the plan
// (runtime/schema/ModelShape.h): the Llama config (LlamaConfig::fromPlan)
// and the runtime's table (RoleForms.cpp) take them from it. Header-only,
// so the model library uses it without linking the plan loader.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_PLAN_PLANMODEL_H
#define HFLOW_RUNTIME_PLAN_PLANMODEL_H

#include "runtime/schema/ModelShape.h"
#include "runtime/schema/plan_generated.h"

namespace hflow::plan {

/// The dimensions of `m` that decide its parameters. A plan has no LM-head
/// flag: the shape keeps its default (an LM head, tied or not).
inline shape::ModelShape modelShape(const Model &m) {
  shape::ModelShape s;
  // The dense decoder's sizes.
  s.layers = m.layers();
  s.hidden = m.hidden();
  s.heads = m.heads();
  s.kvHeads = m.kv_heads();
  s.headSize = m.head_dim();
  s.ffn = m.ffn();
  s.vocab = m.vocab();
  // Which weights exist.
  s.tieEmbeddings = m.tie_embeddings();
  s.qkvBias = m.qkv_bias();
  s.qkNorm = m.qk_norm();
  if (m.experts() > 0) { // a mixture of experts (else the shape's dense zeros)
    s.experts = m.experts();
    s.expertsPerToken = m.experts_per_token();
    s.expertFfn = m.expert_ffn();
    // DeepSeek-V3's (zeros and false in every other plan).
    s.sharedExperts = m.shared_experts();
    s.denseLayers = m.dense_layers();
    s.routerBias = m.sigmoid_router();
  }
  s.qLoraRank = m.q_lora_rank();
  s.kvLoraRank = m.kv_lora_rank();
  s.qkNopeDim = m.qk_nope_head_dim();
  s.qkRopeDim = m.qk_rope_head_dim();
  s.vHeadDim = m.v_head_dim();
  return s;
}

} // namespace hflow::plan

#endif // HFLOW_RUNTIME_PLAN_PLANMODEL_H
