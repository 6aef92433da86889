//===- WeightReshard.h - an actor's weights from training to generation ---===//
//
// The hybrid engine's transition of an actor from its training layout to
// its generation layout, exactly as the plan lists it (docs/reshard.md):
// every rank sends and receives the planned element ranges (one message per
// peer), cut from its whole weights or its shards, into its generation copy
// or its generation shards; the bytes the communicator counted must equal
// the plan's. One executor, three ways in by the role's form on this rank:
// through a whole copy (whole weights, or shards beside a copy), straight
// from training shards into generation shards (Holding::ShardsOnly), or
// across to generation ranks of their own (apart); `--reshard naive` is the
// all-gather baseline.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WEIGHTRESHARD_H
#define HFLOW_RUNTIME_EXEC_WEIGHTRESHARD_H

#include "runtime/exec/RoleRuntime.h"
#include "runtime/exec/RowSchedule.h"
#include "runtime/exec/RunLog.h"
#include "runtime/exec/RunOptions.h"
#include "runtime/schema/plan_generated.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

class WeightResharder {
public:
  WeightResharder(const plan::Plan &p, const RunOptions &o, RunLog &log, int rank)
      : p_(p), o_(o), log_(log), rank_(rank) {}
  /// The generation slots, once the row schedule exists.
  void setSchedule(const RowSchedule &rows) { rows_ = &rows; }

  /// Executes reshard `rs` of its role on this rank
  /// (`roles`: every role here, which the naive baseline gathers whole);
  /// the iteration's reshard figures go to `iteration` (null outside one).
  /// Returns the bytes this rank received (the step's digest). Collective
  /// over the role's ranks (and its generation ranks).
  /// `posted` (an actor generating apart, off_policy 2): the training
  /// ranks post their pieces and return (settled at their next reshard, or
  /// by settle()); the generation ranks wait for them. The policy version
  /// travels with the pieces, and each side checks its own bytes.
  double run(const plan::Reshard &rs, std::map<int, RoleRt> &roles,
             MetricSums *iteration, bool posted = false);
  /// Waits for the pieces posted last (their receivers took them).
  void settle();

  /// The run's reshards as the roles' first ranks counted them: how many,
  /// bytes received, the plan's bytes for them.
  int count() const { return count_; }
  double bytes() const { return bytes_; }
  double planned() const { return planned_; }

private:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  const plan::Role &role(int r) const { return *p_.roles()->Get(r); }
  void throughCopy(const plan::Reshard &rs, RoleRt &rr, std::map<int, RoleRt> &roles,
                   const std::string &what);
  void naive(const plan::Reshard &rs, RoleRt &rr, std::map<int, RoleRt> &roles,
             Named &named, const std::string &what);
  void finishGenerationCopy(const plan::Reshard &rs, RoleRt &rr, Named &named, bool bf16Wire,
                            const std::string &what);
  void checkGenerationShards(const plan::Reshard &rs, RoleRt &rr, const std::string &what);
  void shardsToShards(const plan::Reshard &rs, RoleRt &rr, const std::string &what);
  void across(const plan::Reshard &rs, RoleRt &rr, const std::string &what);
  int64_t versionOfCopy(RoleRt &rr, const std::string &what);
  void account(const plan::Reshard &rs, const std::string &what, int64_t total, double ms,
               bool naive, bool posted);
  void reportPosted(const plan::Reshard &rs, RoleRt &rr, const std::string &what,
                    int64_t received, int64_t sent, double ms);
  void report(const plan::Reshard &rs, Communicator &c, const std::string &what,
              int64_t measured, double ms, bool naive);

  const plan::Plan &p_;
  const RunOptions &o_;
  RunLog &log_;
  int rank_;
  const RowSchedule *rows_ = nullptr;
  static constexpr int kPostedTag = 7;
  bool posted_ = false;                 ///< during run()
  int64_t postedVersion_ = -1;          ///< during run(): what arrived with the pieces
  std::vector<std::unique_ptr<comm::PendingOp>> inFlight_; ///< posted sends
  std::vector<at::Tensor> inFlightBufs_;
  MetricSums *iteration_ = nullptr; ///< during run()
  double received_ = 0;             ///< during run(): the step's digest
  double bytes_ = 0, planned_ = 0;
  int count_ = 0;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WEIGHTRESHARD_H
