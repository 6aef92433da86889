//===- HflowOps.td - the hflow dialect's operations ------------------------===//
#ifndef HFLOW_OPS_TD
#define HFLOW_OPS_TD

include "HflowBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Hflow_DeviceOp : Hflow_Op<"device", [Symbol]> {
  let summary = "a device kind and its figures";
  let description = [{
    ```mlir
    hflow.device @a100_80g "gpu" <memory = 8.0e+10, bf16 = 3.12e+14,
                                  fp32 = 1.95e+13, bandwidth = 2.039e+12>
    ```
    Base units: memory in bytes, bf16 and fp32 in peak dense FLOP/s,
    bandwidth (device memory) in bytes/s. The cost model reads these.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$kind,
                       F64Attr:$memory, F64Attr:$bf16, F64Attr:$fp32,
                       F64Attr:$bandwidth);
  let assemblyFormat = [{
    $sym_name $kind ` ` `<` `memory` `=` $memory `,` `bf16` `=` $bf16 `,`
    `fp32` `=` $fp32 `,` `bandwidth` `=` $bandwidth `>` attr-dict
  }];
  let hasVerifier = 1;
}

def Hflow_MeshOp : Hflow_Op<"mesh", [Symbol]> {
  let summary = "a device mesh: nodes x devices per node";
  let description = [{
    ```mlir
    hflow.mesh @local "cpu" [1 x 4]
    ```
    Devices are numbered node-major: device `n * per_node + i` is device `i`
    of node `n`. `device` names an `hflow.device`; the optional `intra` and
    `inter` are the link bandwidths (bytes/s) within a node and between nodes,
    `pcie` the one between a device and its host (offload's copies), and
    `host_memory` a node's host memory in bytes (what offloaded state fits).
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$device,
                       I64Attr:$nodes, I64Attr:$per_node,
                       OptionalAttr<F64Attr>:$intra, OptionalAttr<F64Attr>:$inter,
                       OptionalAttr<F64Attr>:$pcie, OptionalAttr<F64Attr>:$host_memory);
  let assemblyFormat = "$sym_name $device ` ` `[` $nodes `x` $per_node `]` attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getSize() { return getNodesAttr().getInt() * getPerNodeAttr().getInt(); }
  }];
}

def Hflow_ModelOp : Hflow_Op<"model", [Symbol]> {
  let summary = "a decoder-only transformer";
  let description = [{
    ```mlir
    hflow.model @tiny "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2,
                               ffn = 128, vocab = 256, dtype = f32> {params = 106816 : i64}
    ```
    `params` (derived) is the parameter count: the embedding, per layer two
    RMSNorms, Q/K/V/O (with Q/K/V biases when `qkv_bias` is set, as in
    Qwen2) and the SwiGLU MLP, the final norm, and the LM head unless
    `tie_embeddings` is set (the head then reuses the embedding matrix).
    `rope_theta` is the rotary base (10000 when absent), `rms_norm_eps` the
    RMSNorm epsilon (1e-5 when absent). From a Hugging Face config.json
    (runtime/schema/HfConfig.h): `head_dim`, the width of one head when it is
    not hidden / heads (Qwen3); `qk_norm`, Qwen3's per-head RMSNorm of q and
    k (two [head_dim] weights per layer, counted in `params`);
    `rope_scaling`, Llama 3.1's rescaled RoPE as [factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings]; `sliding_window`,
    Mistral's attention window in tokens. A mixture of experts (Qwen3-MoE,
    Mixtral) in every layer's MLP: `experts` SwiGLU experts of width
    `expert_ffn` and a router [experts, hidden] in place of the dense MLP
    (counted in `params`; `ffn` is then unused), each token through
    `experts_per_token` of them, their weights renormalised when
    `norm_topk_prob`; `router_aux_loss_coef` weighs the load-balancing loss,
    which a training pass adds when `router_aux_loss` is set
    (config.json's output_router_logits, as transformers decides it).
    DeepSeek-V3 ("deepseek_v3"): `shared_experts` SwiGLUs beside the routed
    ones (one of width shared_experts * expert_ffn), the first
    `dense_layers` layers dense (width `ffn`), and `sigmoid_router`: sigmoid
    scores and a score-correction bias [experts] per layer (counted in
    `params`), the experts in `expert_groups` groups of which each token
    keeps `topk_groups`, the chosen weights times `routed_scaling`; its
    multi-head latent attention: `q_lora_rank` (absent: one q projection),
    `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`,
    `rope_interleave`; and YaRN's rope_scaling as [factor, 0, 0,
    original_max_position_embeddings, beta_fast, beta_slow, mscale,
    mscale_all_dim].
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$arch,
                       I64Attr:$layers, I64Attr:$hidden, I64Attr:$heads,
                       I64Attr:$kv_heads, I64Attr:$ffn, I64Attr:$vocab,
                       TypeAttr:$dtype, OptionalAttr<I64Attr>:$params,
                       UnitAttr:$tie_embeddings, UnitAttr:$qkv_bias,
                       OptionalAttr<F64Attr>:$rope_theta,
                       OptionalAttr<F64Attr>:$rms_norm_eps,
                       OptionalAttr<I64Attr>:$head_dim, UnitAttr:$qk_norm,
                       OptionalAttr<DenseF64ArrayAttr>:$rope_scaling,
                       OptionalAttr<I64Attr>:$sliding_window,
                       OptionalAttr<I64Attr>:$experts,
                       OptionalAttr<I64Attr>:$experts_per_token,
                       OptionalAttr<I64Attr>:$expert_ffn, UnitAttr:$norm_topk_prob,
                       OptionalAttr<F64Attr>:$router_aux_loss_coef,
                       UnitAttr:$router_aux_loss,
                       OptionalAttr<I64Attr>:$shared_experts,
                       OptionalAttr<I64Attr>:$dense_layers, UnitAttr:$sigmoid_router,
                       OptionalAttr<I64Attr>:$expert_groups,
                       OptionalAttr<I64Attr>:$topk_groups,
                       OptionalAttr<F64Attr>:$routed_scaling,
                       OptionalAttr<I64Attr>:$q_lora_rank,
                       OptionalAttr<I64Attr>:$kv_lora_rank,
                       OptionalAttr<I64Attr>:$qk_nope_head_dim,
                       OptionalAttr<I64Attr>:$qk_rope_head_dim,
                       OptionalAttr<I64Attr>:$v_head_dim, UnitAttr:$rope_interleave);
  let assemblyFormat = [{
    $sym_name $arch ` ` `<` `layers` `=` $layers `,` `hidden` `=` $hidden `,`
    `heads` `=` $heads `,` `kv_heads` `=` $kv_heads `,` `ffn` `=` $ffn `,`
    `vocab` `=` $vocab `,` `dtype` `=` $dtype `>` attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The parameter count these dimensions imply.
    int64_t computeParamCount();
    /// The dimensions that decide the parameters (runtime/schema/ModelShape.h).
    ::hflow::shape::ModelShape shape();
  }];
}

def Hflow_RoleOp : Hflow_Op<"role", [Symbol,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "an RL role played by a model";
  let description = [{
    ```mlir
    hflow.role @actor actor(@tiny) train <dp = 2, tp = 1, pp = 1>
                                   generate <dp = 1, tp = 2, pp = 1>
    hflow.role @reward reward_fn "exact_match" train <dp = 1, tp = 1, pp = 1>
                                 generate <dp = 1, tp = 1, pp = 1>
    ```
    After placement the role carries `ranks`, the global ranks it runs on,
    and, for an actor whose generation is placed apart (`place
    actor.generate on ...`), `generate_ranks`: the ranks of its generation
    layout (disjoint from `ranks`, which then hold only its training
    layout).
    `options` holds what the program set besides layouts: the optimizer
    (`optimizer = "adamw"`, `lr`, `weight_decay`, `clip_grad`, `warmup`),
    the actor's sampling defaults (`temperature`, `top_p`, `top_k`), a
    compute `dtype` and the actor's `transfer_dtype` (the element type its
    weights travel in between its layouts: `"bf16"` compresses f32 weights).
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, Hflow_RoleKindAttr:$kind,
                       OptionalAttr<FlatSymbolRefAttr>:$model,
                       OptionalAttr<StrAttr>:$rule,
                       Hflow_LayoutAttr:$train, Hflow_LayoutAttr:$generate,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks,
                       OptionalAttr<DictionaryAttr>:$options,
                       OptionalAttr<DenseI64ArrayAttr>:$generate_ranks);
  let assemblyFormat = [{
    $sym_name `` $kind (`(` $model^ `)`)? ($rule^)? `train` $train
    `generate` $generate attr-dict
  }];
  let hasVerifier = 1;
}

def Hflow_PlaceOp : Hflow_Op<"place", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "place roles on a range of a mesh's devices";
  let description = [{
    ```mlir
    hflow.place [@actor, @ref] on @local[0 : 2]
    ```
    Roles placed by one `hflow.place` are colocated: they share the devices
    in time. Ranges of different `hflow.place` ops must not overlap.

    With `phase = "generate"` (one actor, `place actor.generate on ...`)
    the range holds only the actor's generation layout: its rollout devices,
    apart from the devices it trains on.
  }];
  let arguments = (ins SymbolRefArrayAttr:$roles, FlatSymbolRefAttr:$mesh,
                       I64Attr:$start, I64Attr:$end,
                       OptionalAttr<StrAttr>:$phase);
  let assemblyFormat = "$roles `on` $mesh `[` $start `:` $end `]` attr-dict";
  let hasVerifier = 1;
}

def Hflow_PlaceAutoOp : Hflow_Op<"place_auto"> {
  let summary = "let the compiler place the roles no hflow.place names";
  let description = [{
    ```mlir
    hflow.place_auto on @gpus
    ```
    `hflow-place` replaces it with the `hflow.place` ops it chooses, and
    resolves `auto` layouts.
  }];
  let arguments = (ins FlatSymbolRefAttr:$mesh);
  let assemblyFormat = "`on` $mesh attr-dict";
}

def Hflow_FlowOp : Hflow_Op<"flow", [Symbol, IsolatedFromAbove, SingleBlock,
    NoTerminator, DeclareOpInterfaceMethods<OpAsmOpInterface,
        ["getAsmBlockArgumentNames"]>]> {
  let summary = "the dataflow of one training step";
  let description = [{
    ```mlir
    hflow.flow @step {
    ^bb0(%prompts: !hflow.batch<prompts>):
      %rollout = hflow.call @actor "generate"(%prompts) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
    }
    ```
    `arg_names` keeps the source names of the arguments for printing.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       OptionalAttr<StrArrayAttr>:$arg_names);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Hflow_CallOp : Hflow_Op<"call", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "call a role's method on batch values";
  let description = [{
    ```mlir
    %rollout = hflow.call @actor "generate"(%prompts)
        {args = {max_tokens = 16 : i64}, name = "rollout"}
        : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
    ```
    The first input's kind and the result's kind must match the method's
    signature for the role's kind (e.g. an actor's `generate` takes prompts
    and returns a rollout). Keyword arguments of the source call are kept in
    the `args` dictionary; `name` is the source name of the result.
  }];
  let arguments = (ins FlatSymbolRefAttr:$role, StrAttr:$method,
                       Variadic<Hflow_BatchType>:$inputs,
                       OptionalAttr<DictionaryAttr>:$args,
                       OptionalAttr<StrAttr>:$name);
  let results = (outs Optional<Hflow_BatchType>:$result);
  let assemblyFormat = [{
    $role $method `(` $inputs `)` attr-dict `:` functional-type($inputs, results)
  }];
}


def Hflow_BuiltinOp : Hflow_Op<"builtin", [Pure,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "an RL builtin or arithmetic on batch values";
  let description = [{
    ```mlir
    %kl = hflow.builtin "kl"(%old_lp, %ref_lp) {args = {kind = "low_var_kl"}}
        : (!hflow.batch<logprobs>, !hflow.batch<logprobs>) -> !hflow.batch<kl>
    %r = hflow.builtin "sub"(%score, %kl) {scale_rhs = 1.0e-02 : f64}
        : (!hflow.batch<scores>, !hflow.batch<kl>) -> !hflow.batch<scores>
    %adv, %ret = hflow.builtin "gae"(%r, %values) {args = {gamma = 1.0 : f64, lam = 0.95 : f64}}
        : (!hflow.batch<scores>, !hflow.batch<values>)
          -> (!hflow.batch<advantages>, !hflow.batch<returns>)
    ```
    The builtins (`gae`, `grpo_advantage`, `rloo_advantage`, `reinforce_pp`,
    `reinforce_pp_baseline`, `remax`, `kl`, `whiten`, `clip`, `running_norm`,
    `rollout_logprobs`) take and return the
    batch kinds the front end's table (Builtins.h) gives them; advantage
    estimators also return the returns. Arithmetic: `add`, `sub`, `mul`,
    `div` of two batches, or of one batch and the constant `scalar`
    (`scalar_lhs` when the constant is the left operand), and `neg`.
    `scale_rhs` multiplies the second batch first (`a - 0.01 * b`).
    `name` is the source name of the (first) result.
  }];
  let arguments = (ins StrAttr:$callee, Variadic<Hflow_BatchType>:$inputs,
                       OptionalAttr<DictionaryAttr>:$args,
                       OptionalAttr<F64Attr>:$scalar, UnitAttr:$scalar_lhs,
                       OptionalAttr<F64Attr>:$scale_rhs,
                       OptionalAttr<StrAttr>:$name);
  let results = (outs Variadic<Hflow_BatchType>:$results);
  let assemblyFormat = [{
    $callee `(` $inputs `)` attr-dict `:` functional-type($inputs, results)
  }];
  let hasVerifier = 1;
}

def Hflow_ReshardOp : Hflow_Op<"reshard", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "switch a role's weights from one layout to another";
  let description = [{
    ```mlir
    hflow.reshard @actor "train" -> "generate" {bytes = 3369074688 : i64,
        lower_bound = 3369074688 : i64, naive = 202152468480 : i64,
        max_recv = 210567168 : i64, transfers = 4176 : i64,
        pattern = "all-gather: 8 groups of 2"}
    ```
    Inserted by `hflow-insert-reshard` before a call that runs the role in
    its other layout (the actor's generate). The attributes summarise the
    planned transfers (docs/reshard.md): total `bytes` (equal to the
    `lower_bound` by construction), what a naive full gather moves, the
    most one rank receives, the transfer count and the collective pattern.
    `wire_dtype` is present when the weights travel in another element type
    than their own (the role's `transfer_dtype`: `"bf16"` for f32 weights);
    the byte figures then count those wire bytes (half of f32's).
  }];
  let arguments = (ins FlatSymbolRefAttr:$role, StrAttr:$from, StrAttr:$to,
                       I64Attr:$bytes, I64Attr:$lower_bound, I64Attr:$naive,
                       I64Attr:$max_recv, I64Attr:$transfers,
                       StrAttr:$pattern, OptionalAttr<StrAttr>:$wire_dtype);
  let assemblyFormat = "$role $from `->` $to attr-dict";
}

def Hflow_BatchReshardOp : Hflow_Op<"batch_reshard"> {
  let summary = "move a batch value from where it is made to where it is used";
  let description = [{
    ```mlir
    hflow.batch_reshard %rollout from "actor.generate" to "critic.values"
        {bytes = 8388608 : i64, lower_bound = 8388608 : i64,
         max_recv = 1048576 : i64, naive = 58720256 : i64, transfers = 8 : i64}
    ```
    Inserted by `hflow-insert-batch-reshard` before the first use of a value
    by ranks (or a layout) that do not hold all of what they need: the
    rows each data-parallel replica of the consumer needs and lacks, each
    fetched once (docs/reshard.md). `naive` is every consumer rank receiving
    the whole value.
  }];
  let arguments = (ins Hflow_BatchType:$value, StrAttr:$from, StrAttr:$to,
                       I64Attr:$bytes, I64Attr:$lower_bound, I64Attr:$naive,
                       I64Attr:$max_recv, I64Attr:$transfers);
  let assemblyFormat = "$value `from` $from `to` $to attr-dict `:` type($value)";
}

def Hflow_TrainOp : Hflow_Op<"train", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "how a flow is driven: data, batch sizes, steps, seed";
  let description = [{
    ```mlir
    hflow.train @step {batch = 256 : i64, data = "prompts.jsonl", minibatch = 64 : i64,
                       n = 8 : i64, seed = 1 : i64, steps = 1000 : i64}
    ```
    `batch` and `minibatch` count prompts; each prompt yields `n` responses,
    so a training call sees `batch * n` sequences. `hflow-check-batch` checks
    these against every layout of the roles the flow calls. `prompt_len`
    (longest prompt, tokens) and `micro_batch` (sequences per forward pass)
    size activations and the KV cache for `hflow-check-memory`.
    `off_policy = 1` runs the rollout of step k+1 on the actor's generation
    devices while step k trains (one-step off-policy pipelining).
    `staleness` is the declared bound, in policy versions (the actor's
    optimizer steps), between a token's sampling weights and the weights it
    trains; `staleness_bound` is the schedule's, which never exceeds it.
    `partial_horizon` (partial rollouts): the generate calls keep
    `partial_horizon` batches in flight beyond their own; each returns a
    batch of done groups and continues the others in later calls, a group
    leaving at most `partial_horizon` calls after it came.
    `stream` (synchronous schedule, generation on devices of its own): the
    steps that read only the rollout (logprob, values, score on plain
    data-parallel forms) take each group as it finishes, while the longest
    responses are still generated; the plan lists them (Phase.stream_steps).
    `prompt_key` and `answer_key` name the data set's fields (a name or a
    dotted path; absent: "prompt" and "answer").
  }];
  let arguments = (ins FlatSymbolRefAttr:$flow, StrAttr:$data, I64Attr:$batch,
                       I64Attr:$n, I64Attr:$minibatch, I64Attr:$seed,
                       OptionalAttr<I64Attr>:$steps, OptionalAttr<I64Attr>:$epochs,
                       OptionalAttr<I64Attr>:$checkpoint_every,
                       OptionalAttr<StrAttr>:$checkpoint_dir,
                       OptionalAttr<I64Attr>:$prompt_len,
                       OptionalAttr<I64Attr>:$micro_batch,
                       OptionalAttr<I64Attr>:$off_policy,
                       OptionalAttr<StrAttr>:$prompt_key,
                       OptionalAttr<StrAttr>:$answer_key,
                       OptionalAttr<I64Attr>:$staleness,
                       OptionalAttr<I64Attr>:$staleness_bound,
                       OptionalAttr<I64Attr>:$partial_horizon,
                       UnitAttr:$stream);
  let assemblyFormat = "$flow attr-dict";
  let hasVerifier = 1;
}

#endif // HFLOW_OPS_TD
