//===- AST.h - the hflow abstract syntax tree ------------------------------===//
//
// Plain structs, no LLVM and no ANTLR types: the front end (which needs C++
// exceptions for ANTLR) builds it, and MLIRGen (built under LLVM's
// -fno-exceptions) reads it. Semantic analysis fills the `resolved` parts.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_AST_H
#define HFLOW_COMPILER_FRONTEND_AST_H

#include "runtime/schema/Degrees.h"
#include "runtime/schema/HfConfig.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hflow::ast {

/// A position in a source file; line and column are 1-based. `length` is the
/// number of characters of the construct on its first line (for underlining).
struct SourceLoc {
  std::string file;
  int line = 0;
  int col = 0;
  int length = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// A call argument: positional when `key` is empty.
struct Arg {
  std::string key;
  SourceLoc keyLoc;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Name, Int, Float, String, Quantity, Call, MethodCall,
    Binary, // lhs op rhs, op one of + - * /
    Neg,    // -lhs (a negated literal is folded into the literal)
    Field,  // receiver.text, e.g. adv.returns
    Every   // `every N to "dir"`: intValue = N, text = dir
  };
  Kind kind;
  SourceLoc loc;
  std::string text;        // Name: identifier; String: unescaped; Call: callee
  int64_t intValue = 0;    // Int
  double floatValue = 0;   // Float; Quantity: the number before the unit
  std::string unit;        // Quantity: "GB", "TB/s", "TFLOPS", ...
  std::string receiver;    // MethodCall: the role name; Field: the value
  SourceLoc receiverLoc;   // MethodCall, Field
  std::vector<Arg> args;   // Call, MethodCall
  ExprPtr lhs, rhs;        // Binary (both), Neg (lhs)
  char op = 0;             // Binary: '+', '-', '*' or '/'

  // Resolved by Sema inside flows: the batch kind of a batch-valued
  // expression, or the folded value of a constant one.
  std::optional<int> batchKind; // an ast::BatchKind
  std::optional<double> constant;

  explicit Expr(Kind k, SourceLoc l) : kind(k), loc(std::move(l)) {}
};

struct Property {
  std::string key;
  SourceLoc keyLoc;
  ExprPtr value;
};

/// `device NAME = gpu(memory: 80GB, bf16: 312TFLOPS, fp32: 19.5TFLOPS,
///                    bandwidth: 2039GB/s)` (or `cpu(...)`)
struct DeviceDecl {
  std::string name;
  SourceLoc loc, nameLoc;
  ExprPtr ctor;
  // Resolved by Sema, in base units.
  std::string kind;              // "gpu" or "cpu"
  double memoryBytes = 0;        // device memory
  double bf16Flops = 0;          // peak dense bf16 FLOP/s
  double fp32Flops = 0;          // peak fp32 FLOP/s
  double memBandwidth = 0;       // memory bandwidth, bytes/s
};

/// `cluster NAME = mesh(DEVICE, nodes: N, per_node: M[, intra: BW, inter: BW])`
struct ClusterDecl {
  std::string name;
  SourceLoc loc, nameLoc;
  ExprPtr ctor;
  // Resolved by Sema.
  std::string device;
  int64_t nodes = 0, perNode = 0;
  double intraBandwidth = 0;     // bytes/s between devices of a node (0: unknown)
  double interBandwidth = 0;     // bytes/s between nodes (0: unknown)
  double pcieBandwidth = 0;      // bytes/s between a device and its host (0: unknown)
  double hostMemory = 0;         // bytes of host memory per node (0: unknown)
};

enum class DType { F32, BF16, F16 };

/// `model NAME = llama(layers: ..., ...)`
struct ModelDecl {
  std::string name;
  SourceLoc loc, nameLoc;
  ExprPtr ctor;
  // Resolved by Sema.
  std::string arch;
  int64_t layers = 0, hidden = 0, heads = 0, kvHeads = 0, ffn = 0, vocab = 0;
  DType dtype = DType::F32;
  bool tieEmbeddings = false; // the LM head shares the embedding matrix
  bool qkvBias = false;       // Q, K and V projections have biases (Qwen2)
  double ropeTheta = 10000;
  double normEps = 1e-5; // RMSNorm epsilon (Llama-2's; config.json's rms_norm_eps)
  // From a config.json (runtime/schema/HfConfig.h): the head width when it
  // is not hidden / heads (0), Qwen3's q/k norms, Llama 3.1's rope_scaling
  // as [factor, low_freq_factor, high_freq_factor, original_max_positions]
  // or DeepSeek-V3's YaRN as [factor, 0, 0, original_max_positions,
  // beta_fast, beta_slow, mscale, mscale_all_dim] (empty: none), Mistral's sliding window (0: none), and
  // max_position_embeddings (0: not given).
  int64_t headDim = 0;
  bool qkNorm = false;
  std::vector<double> ropeScaling;
  int64_t slidingWindow = 0, maxPositions = 0;
  hfconfig::Mixture moe; // a mixture of experts (qwen3_moe, mixtral, deepseek_v3)
  hfconfig::Latent mla;  // DeepSeek's latent attention (deepseek_v3; kvLoraRank 0: none)
  std::string hfDir;          // hf("dir"): the config.json it was read from
  SourceLoc hfDirLoc;         // the hf() argument naming it
  std::string hfArch;         // its architectures[0] ("" if none)
  /// config.json names a *ForSequenceClassification model: a body and a
  /// score head, no LM head (a reward model's checkpoint).
  bool scorer = false;
};

enum class RoleKind { Actor, Critic, Reference, RewardModel, RewardFn };

/// A parallel layout as written: its degrees (runtime/schema/Degrees.h) and
/// how they were written. `fsdp` alone (no degree)
/// shards over every device the role has; `auto` leaves the layout to the
/// planner.
struct Layout : ::hflow::layout::Degrees {
  bool explicitDp = false;   // dp was written (otherwise inferred from devices)
  bool fsdpAll = false;      // bare `fsdp`: the degree is inferred like dp
  bool isAuto = false;       // `auto`
  SourceLoc loc;
  bool written = false;
};

/// `role NAME = Kind(model) { train: ..., generate: ... }`
struct RoleDecl {
  std::string name;
  SourceLoc loc, nameLoc;
  ExprPtr ctor;
  std::vector<Property> props;
  // Resolved by Sema.
  RoleKind kind = RoleKind::Actor;
  std::string model;       // empty for RewardFn
  std::string rule;        // RewardFn: the named rule
  Layout train, generate;
  /// Scalar options by name, in base units, for the planner and the runtime:
  /// optimizer ("adamw"), lr, weight_decay, clip_grad, warmup (roles that
  /// train); temperature, top_p, top_k (the actor's sampling defaults);
  /// dtype (compute dtype override); transfer_dtype (an Actor's weights on
  /// the wire between its layouts; dropped when it has no effect). Only what
  /// was written is present.
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;
};

/// `place a, b on MESH[lo:hi]`, or `place auto [on MESH]` (isAuto, no roles),
/// or `place actor.generate on MESH[lo:hi]` (one role; phase "generate": the
/// actor's rollout devices, apart from its training devices).
struct PlaceDecl {
  SourceLoc loc;
  bool isAuto = false;
  std::vector<std::pair<std::string, SourceLoc>> roles;
  std::string phase;       // "" or what follows the role's dot
  SourceLoc phaseLoc;
  std::string mesh;
  SourceLoc meshLoc;
  int64_t lo = 0, hi = 0;
  SourceLoc rangeLoc;
};

enum class BatchKind {
  Prompts, Rollout, LogProbs, Values, Scores, Advantages, Returns, KL
};

struct Param {
  std::string name, type;
  SourceLoc loc, typeLoc;
  BatchKind kind = BatchKind::Prompts; // resolved by Sema
};

/// `let NAME = EXPR` or a bare `EXPR`.
struct Stmt {
  std::string name;        // empty for an expression statement
  SourceLoc loc, nameLoc;
  ExprPtr value;
  // Resolved by Sema for method calls.
  std::optional<BatchKind> resultKind;
};

struct FlowDecl {
  std::string name;
  SourceLoc loc, nameLoc;
  std::vector<Param> params;
  std::vector<Stmt> body;
};

/// `train FLOW { data: ..., batch: ..., ... }`: how the flow is driven.
struct TrainDecl {
  std::string flow;
  SourceLoc loc, flowLoc;
  std::vector<Property> props;
  // Resolved by Sema.
  std::string data;             // prompt dataset (JSONL)
  int64_t batch = 0;            // prompts per step
  int64_t samples = 1;          // n: responses per prompt
  int64_t steps = 0, epochs = 0;
  int64_t minibatch = 0;        // prompts per optimizer step (0: = batch)
  int64_t seed = 1;
  int64_t checkpointEvery = 0;  // 0: no checkpoints
  std::string checkpointDir;
  int64_t logEvery = 1;
  int64_t promptLen = 0;        // longest prompt in tokens (0: planner default)
  int64_t microBatch = 0;       // sequences per forward pass (0: default)
  int64_t offPolicy = 0;        // 1: rollout k+1 overlaps training on k
  int64_t staleness = -1;       // the declared bound in policy versions (-1: none)
  int64_t stalenessBound = -1;  // Sema's: the flow's bound (-1: none, see SemaStaleness.cpp)
  int64_t partialHorizon = 0;   // Sema's: syncs a response may span (0: none, partial rollouts)
  bool stream = false;          // `stream: true`: row-local steps take the rollout's groups as they finish
  std::string promptKey, answerKey; // data fields (empty: "prompt", "answer")
  SourceLoc dataLoc, batchLoc, minibatchLoc, offPolicyLoc, stalenessLoc, streamLoc;
};

/// `import "PATH"`, resolved by the front end to the file it loaded.
struct ImportDecl {
  std::string path;
  SourceLoc loc;
  std::string resolved;    // the file loaded, empty if not found
};

/// A whole program: the main file's declarations and those of every file it
/// imports (transitively), each declaration keeping its own file in its locs.
struct Program {
  std::string file;
  std::string source;      // the main file's text, for hashing
  std::vector<ImportDecl> imports; // of every loaded file, in load order
  std::vector<DeviceDecl> devices;
  std::vector<ClusterDecl> clusters;
  std::vector<ModelDecl> models;
  std::vector<RoleDecl> roles;
  std::vector<PlaceDecl> places;
  std::vector<FlowDecl> flows;
  std::vector<TrainDecl> trains;
};

const char *roleKindName(RoleKind k);
const char *batchKindName(BatchKind k);
const char *dtypeName(DType d);

} // namespace hflow::ast

#endif // HFLOW_COMPILER_FRONTEND_AST_H
