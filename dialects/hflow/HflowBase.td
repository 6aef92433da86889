//===- HflowBase.td - the hflow dialect, its enums, attributes and types ---===//
#ifndef HFLOW_BASE_TD
#define HFLOW_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Hflow_Dialect : Dialect {
  let name = "hflow";
  let cppNamespace = "::mlir::hflow";
  let summary = "RL post-training programs: meshes, models, roles, placement and flows";
  let description = [{
    The `hflow` dialect describes one RL post-training program: the device
    meshes, the models, the RL roles that use them (actor, critic, reference,
    reward), where each role runs and in which parallel layouts, and the
    dataflow of one training step as calls of role methods on batch values.

    Passes check the program as a whole, place roles on devices and lower the
    flow to per-rank schedules, which `hflowc` writes as an execution plan.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
}

class Hflow_Op<string mnemonic, list<Trait> traits = []>
    : Op<Hflow_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Hflow_RoleKind : I32EnumAttr<"RoleKind", "the RL role a model plays", [
    I32EnumAttrCase<"Actor", 0, "actor">,
    I32EnumAttrCase<"Critic", 1, "critic">,
    I32EnumAttrCase<"Reference", 2, "reference">,
    I32EnumAttrCase<"RewardModel", 3, "reward_model">,
    I32EnumAttrCase<"RewardFn", 4, "reward_fn">]> {
  let cppNamespace = "::mlir::hflow";
  let genSpecializedAttr = 0;
}
def Hflow_RoleKindAttr : EnumAttr<Hflow_Dialect, Hflow_RoleKind, "role_kind">;

def Hflow_BatchKind : I32EnumAttr<"BatchKind", "what a batch value holds", [
    I32EnumAttrCase<"Prompts", 0, "prompts">,
    I32EnumAttrCase<"Rollout", 1, "rollout">,
    I32EnumAttrCase<"LogProbs", 2, "logprobs">,
    I32EnumAttrCase<"Values", 3, "values">,
    I32EnumAttrCase<"Scores", 4, "scores">,
    I32EnumAttrCase<"Advantages", 5, "advantages">,
    I32EnumAttrCase<"Returns", 6, "returns">,
    I32EnumAttrCase<"KL", 7, "kl">]> {
  let cppNamespace = "::mlir::hflow";
  let genSpecializedAttr = 0;
}

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def Hflow_LayoutAttr : AttrDef<Hflow_Dialect, "Layout"> {
  let mnemonic = "layout";
  let summary = "a parallel layout: data, sharded data, tensor, pipeline, "
                "sequence, context and expert degrees";
  let description = [{
    `#hflow.layout<dp = 2, tp = 2, pp = 1>` places a model on dp*tp*pp
    devices. `fsdp` (fully sharded data parallel: weights, gradients and
    optimizer state split over its ranks, ZeRO-3), `sp` (sequence parallel)
    and `cp` (context parallel) default to 1 and are printed only when set;
    the layout's device count is the product of these six degrees. `ep`
    (expert parallel, default 1) divides dp: a mixture of experts splits its
    experts over each run of ep consecutive data-parallel ranks (Megatron's
    carving of expert parallelism out of data parallelism), so a program's
    `ep(2) * dp(2)` is `dp = 4, ep = 2` here. `fold = 1` (default 0) is
    Megatron's parallel folding, `tp(t) * ep(t) * etp(1)` in a program: the
    experts split whole over the tp ranks (ep stays 1 here).

    A degree of 0 for dp or fsdp means "all devices the role is placed on,
    divided by the other degrees", resolved by the placement pass. tp = 0
    (with dp = 0 and pp = 0) is `auto`: the placement pass chooses the layout.
  }];
  let parameters = (ins "int64_t":$dp, "int64_t":$tp, "int64_t":$pp,
                        DefaultValuedParameter<"int64_t", "1">:$fsdp,
                        DefaultValuedParameter<"int64_t", "1">:$sp,
                        DefaultValuedParameter<"int64_t", "1">:$cp,
                        DefaultValuedParameter<"int64_t", "1">:$ep,
                        DefaultValuedParameter<"int64_t", "0">:$fold);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let builders = [
    AttrBuilder<(ins "int64_t":$dp, "int64_t":$tp, "int64_t":$pp), [{
      return $_get($_ctxt, dp, tp, pp, 1, 1, 1, 1, 0);
    }]>
  ];
  let extraClassDeclaration = [{
    int64_t size() const {
      return getDp() * getFsdp() * getTp() * getPp() * getSp() * getCp();
    }
    /// The degrees that split one replica of the weights.
    int64_t shards() const { return getFsdp() * getTp() * getPp(); }
    bool isAuto() const { return getTp() == 0; }
    static LayoutAttr getAuto(::mlir::MLIRContext *ctx) {
      return get(ctx, 0, 0, 0, 1, 1, 1, 1, 0);
    }
  }];
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

def Hflow_BatchType : TypeDef<Hflow_Dialect, "Batch"> {
  let mnemonic = "batch";
  let summary = "a batch of sequences flowing between role calls";
  let description = [{
    `!hflow.batch<rollout>`: the kind says what the batch holds, so that a
    rollout is never passed where prompts are expected.
  }];
  let parameters = (ins EnumParameter<Hflow_BatchKind>:$kind);
  let assemblyFormat = "`<` $kind `>`";
}

#endif // HFLOW_BASE_TD
