//===- HflowPasses.td - the hflow compiler's passes ------------------------===//
#ifndef HFLOW_PASSES_TD
#define HFLOW_PASSES_TD

include "mlir/Pass/PassBase.td"

def HflowVerifyRoles : Pass<"hflow-verify-roles", "::mlir::ModuleOp"> {
  let summary = "check the program as a whole: one mesh, every role used is placed once";
  let description = [{
    Whole-program checks that no single op's verifier can make:

    * the module declares exactly one `hflow.mesh`, whose device is declared
      by an `hflow.device`, and at least one flow;
    * every role a flow calls is placed by exactly one `hflow.place`
      (a `reward_fn` role, which needs no devices, may stay unplaced);
    * every declared role is used by some flow (a warning otherwise).

    All problems are reported in one run; the pass fails if any is an error.
  }];
  let statistics = [
    Statistic<"numRoles", "roles", "Number of roles checked">
  ];
}

def HflowPlace : Pass<"hflow-place", "::mlir::ModuleOp"> {
  let summary = "resolve placement (explicit or `place auto`) into ranks and layouts";
  let description = [{
    For every `hflow.place [@a, @b] on @mesh[lo : hi]`, sets `ranks` on the
    placed roles to `lo, lo+1, ..., hi-1` and resolves each role's layouts:
    a layout whose dp is 0 takes dp = devices / (tp * pp). Checks that the
    range lies inside the mesh, that ranges of different place ops are
    disjoint (colocation is only by listing roles in one place), and that
    each layout covers exactly the role's devices and splits its model
    (heads and kv_heads by tp, layers by pp). `place auto` over every role
    runs the placement search, whose predicted times use the cost model's
    constants from the file the `calibration` option names (default: the
    built-in ones; docs/placement.md, Calibration).

    Before:
    ```mlir
    hflow.role @actor actor(@tiny) train <dp = 0, tp = 1, pp = 1> ...
    hflow.place [@actor] on @local[0 : 2]
    ```
    After:
    ```mlir
    hflow.role @actor actor(@tiny) train <dp = 2, tp = 1, pp = 1>
        ... {ranks = array<i64: 0, 1>}
    ```
  }];
  let options = [
    Option<"calibration", "calibration", "std::string", /*default=*/"\"\"",
           "a calibration file of the cost model's constants (JSON; "
           "docs/placement.md, Calibration); empty: the defaults">,
    Option<"executable", "executable", "bool", /*default=*/"false",
           "propose only layouts hflow-run executes (runtime/schema/Executes.h); "
           "hflowc sets it before writing a plan">
  ];
  let statistics = [
    Statistic<"numPlaced", "placed-roles", "Number of roles given ranks">
  ];
}

def HflowCheckExecutable : Pass<"hflow-check-executable", "::mlir::ModuleOp"> {
  let summary = "refuse what hflow-run does not execute yet, at the role";
  let description = [{
    The plan is a contract: what hflowc writes, hflow-run executes as
    written. After placement, every role's layouts and compute type are
    checked against the runtime's table (runtime/schema/Executes.h): a
    layout hflow-run would not run as planned (pp, sp and cp; tp or fsdp on
    a role other than the Actor; fsdp * tp; tensor-parallel shards that do
    not split the model evenly) or a dtype other than f32 is an error at
    the role's declaration, saying what is not supported yet. hflowc runs
    it before writing a plan; analyses (`--emit=mlir-placed`, hflow-opt)
    do not.
  }];
  let statistics = [
    Statistic<"numChecked", "roles", "Number of roles checked">
  ];
}

def HflowCheckBatch : Pass<"hflow-check-batch", "::mlir::ModuleOp"> {
  let summary = "check the train block's batch sizes against every layout";
  let description = [{
    For the flow an `hflow.train` drives, every call's batch must split
    evenly over the data-parallel ranks of the layout it runs in:

    * `generate` takes the step's `batch` prompts in the generate layout;
    * every other method sees `batch * n` sequences in the train layout;
    * `update` additionally steps the optimizer on `minibatch * n`
      sequences at a time, which must also split evenly.

    Runs after `hflow-place` (layouts must be resolved). Reports every
    violation, with notes at the train block and the role.
  }];
  let statistics = [
    Statistic<"numCalls", "calls-checked", "Number of calls checked">
  ];
}

def HflowCheckMemory : Pass<"hflow-check-memory", "::mlir::ModuleOp"> {
  let summary = "check that every set of colocated roles fits in device memory";
  let description = [{
    For every `hflow.place`, adds up what each role placed there keeps on a
    device (weights, and for roles that train their gradients and AdamW
    state, all divided by the layout's fsdp * tp * pp) and the largest
    transient need of any one phase (a training pass's activations with
    gradient checkpointing, or the actor's generation shard plus KV cache),
    and compares the sum with the device's memory. The error gives the
    figures per role; docs/cost-model.md has the formulas.

    Batch sizes come from the `hflow.train` op (`batch`, `n`, and the
    optional `prompt_len` and `micro_batch`), response lengths from the
    generate calls' `max_tokens`. Runs after `hflow-place`.
  }];
  let statistics = [
    Statistic<"numSets", "roles-checked", "Number of placed roles sized">
  ];
}

def HflowExplainPlacement : Pass<"hflow-explain-placement", "::mlir::ModuleOp"> {
  let summary = "print the best placements the search finds, with their costs";
  let description = [{
    Runs the placement search (docs/placement.md) over every role with a
    model on the program's mesh and prints the best `k` candidates: the
    predicted iteration time by stage (generate, prepare, train), each
    colocated set's devices, memory per device, and each role's layouts.
    Leaves the IR unchanged. `hflowc --explain-placement[=k]`; the
    `calibration` option (hflowc --calibration) names the cost model's
    constants.
  }];
  let options = [
    Option<"k", "k", "int", /*default=*/"3", "how many candidates to print">,
    Option<"calibration", "calibration", "std::string", /*default=*/"\"\"",
           "a calibration file of the cost model's constants (JSON; "
           "docs/placement.md, Calibration); empty: the defaults">,
    Option<"executable", "executable", "bool", /*default=*/"false",
           "only layouts hflow-run executes (as hflowc places before writing a plan)">
  ];
}

def HflowInsertReshard : Pass<"hflow-insert-reshard", "::mlir::ModuleOp"> {
  let summary = "plan the weight transfers between a role's two layouts";
  let description = [{
    For every role whose generation layout holds other bytes than its
    training layout (the actor), plans the switch with the minimal transfers
    (docs/reshard.md: box intervals per parameter, an assignment of
    generation shards to ranks maximising what is already in place, every
    missing byte fetched exactly once) and inserts `hflow.reshard` before
    each call that runs in the generation layout, summarising the plan.
    With the role's `transfer_dtype` (bf16 for f32 weights) the bytes are
    the wire bytes and the op records `wire_dtype`; a `transfer_dtype` on a
    role whose weights never move gets a warning. Runs after `hflow-place`.
  }];
  let statistics = [
    Statistic<"numReshards", "reshards", "Number of hflow.reshard ops inserted">
  ];
}

def HflowInsertBatchReshard : Pass<"hflow-insert-batch-reshard", "::mlir::ModuleOp"> {
  let summary = "plan the moves of batch values between producers and consumers";
  let description = [{
    For every value of a flow and every placement that uses it (a role's
    ranks in the call's layout, or the controller for builtins), plans the
    rows each rank needs and lacks, each fetched once from a holder (the
    controller holds the prompts it loads and the builtins' results), and
    inserts `hflow.batch_reshard` before the first such use when anything
    moves. Sizes come from the train block (rows: batch, or batch * n after
    generation; bytes per row from prompt_len and max_tokens). Runs after
    `hflow-place`.
  }];
  let statistics = [
    Statistic<"numReshards", "batch-reshards", "Number of hflow.batch_reshard ops inserted">
  ];
}

def HflowPrintReshardPlan : Pass<"hflow-print-reshard-plan", "::mlir::ModuleOp"> {
  let summary = "print every planned reshard with its bytes and estimated time";
  let description = [{
    For every `hflow.reshard`: what moves, source and target layouts, the
    ranks, the collectives and point-to-point transfers chosen, total bytes,
    the most any rank receives, the lower bound, what a naive full gather
    (DeepSpeed-Chat) would move, HybridFlow's per-rank formula where it
    applies, the extra memory per rank, and the estimated time; then totals.
    `format=json` prints the same as JSON (docs/reshard.md lists the fields).
    The estimated time uses the link efficiency and per-message latencies
    of the file the `calibration` option names (default: the built-in ones).
    Runs `hflow-insert-reshard`'s planner again for the details, so it needs
    placed IR. `hflow-opt --print-reshard-plan[=json] prog.hflow` runs the
    whole pipeline and this pass.
  }];
  let options = [
    Option<"format", "format", "std::string", /*default=*/"\"text\"",
           "text or json">,
    Option<"calibration", "calibration", "std::string", /*default=*/"\"\"",
           "a calibration file of the cost model's constants (JSON; "
           "docs/placement.md, Calibration); empty: the defaults">
  ];
}

#endif // HFLOW_PASSES_TD
