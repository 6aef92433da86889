//===- RoleBuilder.h - each role's model forms on this rank ---------------===//
//
// Private to runtime/exec. Which roles this rank is on, and for each its
// runtime (RoleRt, RoleRuntime.h): its model (the plan's shape, checked
// against the tokenizer; a Hugging Face checkpoint when the model names
// one), head, optimizer and model form — whole weights, tensor-parallel or
// FSDP shards, a pipeline stage, sequence parallel — with the communicators
// it runs on, and its generation shards when it generates tensor parallel.
// build() runs before the rendezvous (what can fail alone fails there);
// connect() after it, when the groups exist. The roles and communicators
// belong to the Worker; the builder fills them and remembers which model
// came from which directory.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ROLEBUILDER_H
#define HFLOW_RUNTIME_EXEC_ROLEBUILDER_H

#include "runtime/exec/EngineState.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hflow::exec {

/// What the role builder borrows from the Worker.
struct RoleBuilderRefs : EngineContext {
  const RunSetup &s_;
  std::map<int, RoleRt> &roles_;
  Comms &comms_;
  std::function<void(std::string)> preparing;
};

class RoleBuilder : RoleBuilderRefs {
public:
  explicit RoleBuilder(const RoleBuilderRefs &r) : RoleBuilderRefs(r) {}

  /// Every role this rank is on: its model and weights, its form.
  void build();
  /// Each role's communicators and sharded forms, after the rendezvous.
  void connect();

  /// Plan model `m`'s configuration, checked against the tokenizer.
  models::LlamaConfig modelConfig(int m) const;
  /// Role `r`'s model configuration: its model's, in the role's own
  /// `dtype` when it sets one (the precision it computes in).
  models::LlamaConfig roleConfig(int r) const;
  /// Role `r`'s model forms by runtime/schema/Executes.h, or why not.
  executes::Verdict formsOf(int r) const;
  /// Whether role `r` has weights it trains.
  bool trains(int r) const;
  /// Model index -> the Hugging Face directory its weights came from.
  const std::map<int, std::string> &loadedFrom() const { return loadedFrom_; }

private:
  void buildGenerationRank(int r, int pos);
  void buildRoleModel(int r, RoleRt &rt, const executes::Verdict &forms);
  void chooseShards(int r, RoleRt &rt, const executes::Verdict &forms);
  void loadWholeWeights(int r, RoleRt &rt, const models::LlamaConfig &cfg,
                        const std::string &wdir);
  Communicator *groupNamed(const std::string &name) const;
  void connectGenerationRank(int r, RoleRt &rr);
  void buildTrainingForm(int r, RoleRt &rr);
  void loadShards(int r, RoleRt &rr);
  void buildGenerationForm(int r, RoleRt &rr);
  void keepShardsOnly(int r, RoleRt &rr);
  double offloadShare(int r, bool params) const;
  /// Role `r`'s AdamW over `params`; `named` (the form's named weights)
  /// places each parameter in its decoder layer for offload_optimizer.
  std::unique_ptr<models::AdamW>
  makeOptimizer(int r, const std::vector<at::Tensor> &params,
                const std::vector<std::pair<std::string, at::Tensor>> &named) const;

  std::map<int, std::string> loadedFrom_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ROLEBUILDER_H
