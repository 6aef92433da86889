//===- PlanJson.cpp - print a plan file as JSON ----------------------------===//
//
// `hflowc --emit=plan-json`: the plan exactly as the runtime will read it,
// decoded from the FlatBuffer (after the runtime's own verifier accepted it),
// so a diff of two JSON files is a diff of two plans.
//
//===----------------------------------------------------------------------===//

#include "compiler/emit/PlanEmitter.h"

#include "runtime/plan/PlanLoader.h"
#include "runtime/schema/PlanArgs.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
namespace fb = ::hflow::plan;

namespace {

/// The fields a typed table sets, as an object's members (sorted by name;
/// integers, numbers, flags and strings as JSON has them).
void argsJson(llvm::json::OStream &j, const ::hflow::planargs::Named &fields) {
  using ::hflow::planargs::Storage;
  for (const auto &[name, v] : fields)
    switch (v.storage) {
    case Storage::Int: j.attribute(name, v.i); break;
    case Storage::Real: j.attribute(name, v.x); break;
    case Storage::Bool: j.attribute(name, v.b); break;
    case Storage::Text: j.attribute(name, v.text); break;
    }
}

void intArray(llvm::json::OStream &j, llvm::StringRef key,
              const flatbuffers::Vector<int32_t> *v) {
  j.attributeArray(key, [&] {
    if (v)
      for (int x : *v)
        j.value(x);
  });
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : ""; }

void layout(llvm::json::OStream &j, llvm::StringRef key, const fb::Layout *l) {
  j.attributeObject(key, [&] {
    j.attribute("dp", l->dp());
    j.attribute("tp", l->tp());
    j.attribute("pp", l->pp());
    j.attribute("fsdp", l->fsdp());
    j.attribute("sp", l->sp());
    j.attribute("cp", l->cp());
    j.attribute("ep", l->ep());
    if (l->fold())
      j.attribute("fold", l->fold());
  });
}

/// One mesh of the plan, as an object's fields.
void meshJson(llvm::json::OStream &j, const fb::Mesh *m) {
  j.attribute("name", str(m->name()));
  j.attribute("device", str(m->device()));
  j.attribute("nodes", m->nodes());
  j.attribute("per_node", m->per_node());
  j.attribute("device_memory", m->device_memory());
  j.attribute("device_bf16_flops", m->device_bf16_flops());
  j.attribute("device_fp32_flops", m->device_fp32_flops());
  j.attribute("device_bandwidth", m->device_bandwidth());
  j.attribute("intra_bandwidth", m->intra_bandwidth());
  j.attribute("inter_bandwidth", m->inter_bandwidth());
  j.attribute("intra_given", m->intra_given());

}

/// One model of the plan, as an object's fields.
void modelJson(llvm::json::OStream &j, const fb::Model *m) {
  j.attribute("name", str(m->name()));
  j.attribute("arch", str(m->arch()));
  j.attribute("layers", m->layers());
  j.attribute("hidden", m->hidden());
  j.attribute("heads", m->heads());
  j.attribute("kv_heads", m->kv_heads());
  j.attribute("ffn", m->ffn());
  j.attribute("vocab", m->vocab());
  j.attribute("dtype", fb::EnumNameDType(m->dtype()));
  j.attribute("params", m->params());
  j.attribute("tie_embeddings", m->tie_embeddings());
  j.attribute("qkv_bias", m->qkv_bias());
  j.attribute("rope_theta", m->rope_theta());
  j.attribute("norm_eps", m->norm_eps());
  if (m->head_dim() != 0)
    j.attribute("head_dim", m->head_dim());
  if (m->qk_norm())
    j.attribute("qk_norm", true);
  if (const fb::RopeScaling *rs = m->rope_scaling())
    j.attributeObject("rope_scaling", [&] {
      if (rs->yarn()) {
        j.attribute("rope_type", "yarn");
        j.attribute("factor", rs->factor());
        j.attribute("original_max_positions", rs->original_max_positions());
        j.attribute("beta_fast", rs->beta_fast());
        j.attribute("beta_slow", rs->beta_slow());
        j.attribute("mscale", rs->mscale());
        j.attribute("mscale_all_dim", rs->mscale_all_dim());
        return;
      }
      j.attribute("rope_type", "llama3");
      j.attribute("factor", rs->factor());
      j.attribute("low_freq_factor", rs->low_freq_factor());
      j.attribute("high_freq_factor", rs->high_freq_factor());
      j.attribute("original_max_positions", rs->original_max_positions());
    });
  if (m->sliding_window() != 0)
    j.attribute("sliding_window", m->sliding_window());
  if (m->experts() != 0) {
    j.attribute("experts", m->experts());
    j.attribute("experts_per_token", m->experts_per_token());
    j.attribute("expert_ffn", m->expert_ffn());
    j.attribute("norm_topk_prob", m->norm_topk_prob());
    j.attribute("router_aux_loss_coef", m->router_aux_loss_coef());
    j.attribute("router_aux_loss", m->router_aux_loss());
    if (m->sigmoid_router()) { // DeepSeek-V3's mixture
      j.attribute("shared_experts", m->shared_experts());
      j.attribute("dense_layers", m->dense_layers());
      j.attribute("sigmoid_router", true);
      j.attribute("expert_groups", m->expert_groups());
      j.attribute("topk_groups", m->topk_groups());
      j.attribute("routed_scaling", m->routed_scaling());
    }
  }
  if (m->kv_lora_rank() != 0) { // DeepSeek's latent attention
    j.attribute("q_lora_rank", m->q_lora_rank());
    j.attribute("kv_lora_rank", m->kv_lora_rank());
    j.attribute("qk_nope_head_dim", m->qk_nope_head_dim());
    j.attribute("qk_rope_head_dim", m->qk_rope_head_dim());
    j.attribute("v_head_dim", m->v_head_dim());
    j.attribute("rope_interleave", m->rope_interleave());
  }
  if (m->weights())
    j.attribute("weights", str(m->weights()));

}

/// One role of the plan, as an object's fields.
void roleJson(llvm::json::OStream &j, const fb::Role *r) {
  j.attribute("name", str(r->name()));
  j.attribute("kind", fb::roleKindName(r->kind()));
  j.attribute("model", r->model());
  intArray(j, "ranks", r->ranks());
  intArray(j, "generate_ranks", r->generate_ranks());
  layout(j, "train", r->train());
  layout(j, "generate", r->generate());
  if (r->rule())
    j.attribute("rule", str(r->rule()));
  if (r->kv_pool() > 0)
    j.attribute("kv_pool", r->kv_pool());
  if (r->host_memory() && r->host_memory()->size() > 0) { // format 4.2
    int64_t w = 0, g = 0;
    for (const fb::RankHostMemory *h : *r->host_memory())
      w += h->weights(), g += h->grads();
    if (w > 0)
      j.attributeArray("host_weights", [&] {
        for (const fb::RankHostMemory *h : *r->host_memory())
          j.value(h->weights());
      });
    if (g > 0)
      j.attributeArray("host_grads", [&] {
        for (const fb::RankHostMemory *h : *r->host_memory())
          j.value(h->grads());
      });
    j.attributeArray("host_optimizer", [&] {
      for (const fb::RankHostMemory *h : *r->host_memory())
        j.value(h->optimizer());
    });
  }
  j.attributeObject("options",
                    [&] { argsJson(j, ::hflow::planargs::setFields(r->options())); });

}

/// One step of the plan, as an object's fields.
void stepJson(llvm::json::OStream &j, const fb::Step *s) {
  j.attribute("kind", fb::EnumNameStepKind(s->kind()));
  if (s->kind() != fb::StepKind::CheckAllGather) {
    if (s->kind() != fb::StepKind::Builtin)
      j.attribute("role", s->role());
    j.attribute("method", str(s->method()));
    intArray(j, "inputs", s->inputs());
    intArray(j, "outputs", s->outputs());
    j.attributeObject("args",
                      [&] { argsJson(j, ::hflow::planargs::setFields(s->args())); });
  } else {
    j.attribute("group", s->group());
    j.attribute("checks", s->checks());
  }
  j.attribute("loc", str(s->loc()));
  if (s->kind() == fb::StepKind::Reshard)
    j.attribute("reshard", s->reshard());
  if (s->predicted_s() >= 0)
    j.attribute("predicted_s", s->predicted_s());
  if (s->moves_predicted_s() >= 0)
    j.attribute("moves_predicted_s", s->moves_predicted_s());

}

/// One reshard of the plan, as an object's fields.
void reshardJson(llvm::json::OStream &j, const fb::Reshard *r) {
  j.attribute("role", r->role());
  j.attribute("from_phase", str(r->from_phase()));
  j.attribute("to_phase", str(r->to_phase()));
  j.attribute("bytes", r->bytes());
  j.attribute("lower_bound", r->lower_bound());
  j.attribute("naive_bytes", r->naive_bytes());
  j.attribute("bytes_per_element", r->bytes_per_element());
  j.attribute("wire_bytes_per_element", r->wire_bytes_per_element()
                                            ? r->wire_bytes_per_element()
                                            : r->bytes_per_element());
  j.attribute("wire_dtype", str(r->wire_dtype()));
  intArray(j, "assignment", r->assignment());
  intArray(j, "ranks", r->ranks());
  j.attributeArray("params", [&] {
    if (r->params())
      for (const fb::WeightParam *w : *r->params())
        j.object([&] {
          j.attribute("name", str(w->name()));
          j.attribute("rows", w->rows());
          j.attribute("cols", w->cols());
        });
  });
  // [src, dst, param, row0, row1, col0, col1] per transfer.
  j.attributeArray("transfers", [&] {
    if (r->transfers())
      for (const fb::WeightTransfer *t : *r->transfers())
        j.array([&] {
          for (int64_t v : {int64_t(t->src()), int64_t(t->dst()),
                            int64_t(t->param()), t->row0(), t->row1(),
                            t->col0(), t->col1()})
            j.value(v);
        });
  });

}

/// One phase of the plan, as an object's fields.
void phaseJson(llvm::json::OStream &j, const fb::Phase *ph) {
  j.attribute("flow", str(ph->flow()));
  j.attribute("first_step", ph->first_step());
  j.attribute("num_steps", ph->num_steps());
  j.attribute("data", str(ph->data()));
  j.attribute("batch", ph->batch());
  j.attribute("n", ph->n());
  j.attribute("minibatch", ph->minibatch());
  j.attribute("train_steps", ph->train_steps());
  j.attribute("epochs", ph->epochs());
  j.attribute("checkpoint_every", ph->checkpoint_every());
  j.attribute("checkpoint_dir", str(ph->checkpoint_dir()));
  j.attribute("seed", ph->seed());
  j.attribute("off_policy", ph->off_policy());
  j.attribute("staleness", ph->staleness());
  j.attribute("staleness_bound", ph->staleness_bound());
  j.attribute("partial_horizon", ph->partial_horizon());
  if (ph->stream_steps() && ph->stream_steps()->size())
    j.attributeArray("stream_steps", [&] {
      for (int s : *ph->stream_steps())
        j.value(s);
    });
  j.attribute("prompt_len", ph->prompt_len());
  j.attribute("micro_batch", ph->micro_batch());
  if (ph->micro_batches() && ph->micro_batches()->size())
    j.attributeArray("micro_batches", [&] {
      for (int m : *ph->micro_batches())
        j.value(m);
    });
  j.attribute("prompt_key", str(ph->prompt_key()).empty() ? std::string("prompt")
                                                           : str(ph->prompt_key()));
  j.attribute("answer_key", str(ph->answer_key()).empty() ? std::string("answer")
                                                           : str(ph->answer_key()));

}

} // namespace

LogicalResult (::hflow::printPlanJson)(llvm::ArrayRef<uint8_t> planFile,
                                   llvm::raw_ostream &os, std::string &error) {
  fb::LoadedPlan loaded;
  if (!fb::verifyPlanBuffer(std::vector<uint8_t>(planFile.begin(), planFile.end()),
                            loaded, error))
    return failure();
  const fb::Plan &p = *loaded.plan();
  llvm::json::OStream j(os, 2);
  j.object([&] {
    j.attribute("format", std::to_string(loaded.formatMajor()) + "." +
                              std::to_string(loaded.formatMinor()));
    j.attribute("program", str(p.program()));
    std::string sha;
    static const char *kHex = "0123456789abcdef";
    for (uint8_t c : *p.source_sha256()) {
      sha += kHex[c >> 4];
      sha += kHex[c & 15];
    }
    j.attribute("source_sha256", sha);
    j.attribute("compiler_version", str(p.compiler_version()));
    j.attribute("flow", str(p.flow()));
    j.attribute("world_size", p.world_size());
    j.attribute("seed", p.seed());
    j.attributeArray("meshes", [&] {
      for (const fb::Mesh *m : *p.meshes())
        j.object([&] { meshJson(j, m); });
    });
    j.attributeArray("models", [&] {
      if (p.models())
        for (const fb::Model *m : *p.models())
          j.object([&] { modelJson(j, m); });
    });
    j.attributeArray("roles", [&] {
      if (p.roles())
        for (const fb::Role *r : *p.roles())
          j.object([&] { roleJson(j, r); });
    });
    j.attributeArray("groups", [&] {
      if (p.groups())
        for (const fb::Group *g : *p.groups())
          j.object([&] {
            j.attribute("name", str(g->name()));
            intArray(j, "ranks", g->ranks());
          });
    });
    j.attributeArray("values", [&] {
      if (p.values())
        for (const fb::Value *v : *p.values())
          j.object([&] {
            j.attribute("name", str(v->name()));
            j.attribute("kind", fb::batchKindName(v->kind()));
            j.attribute("producer", v->producer());
          });
    });
    j.attributeArray("steps", [&] {
      if (p.steps())
        for (const fb::Step *s : *p.steps())
          j.object([&] { stepJson(j, s); });
    });
    j.attributeArray("reshards", [&] {
      if (p.reshards())
        for (const fb::Reshard *r : *p.reshards())
          j.object([&] { reshardJson(j, r); });
    });
    j.attributeArray("phases", [&] {
      if (p.phases())
        for (const fb::Phase *ph : *p.phases())
          j.object([&] { phaseJson(j, ph); });
    });
    j.attributeArray("schedules", [&] {
      for (const fb::RankSchedule *s : *p.schedules())
        j.object([&] {
          j.attribute("rank", s->rank());
          intArray(j, "steps", s->steps());
        });
    });
  });
  os << "\n";
  return success();
}
