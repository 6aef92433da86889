//===- Optim.h - AdamW, gradient clipping, learning-rate schedules ---------===//
//
// The optimizer the runtime steps a role's parameters with. It works on any
// list of tensors a rank owns (whole parameters, or the shards of a sharded
// form), so the state it keeps is exactly as sharded as the parameters.
//
// AdamW (Loshchilov & Hutter; torch.optim.AdamW's update, amsgrad off):
//   m = b1 m + (1-b1) g            v = b2 v + (1-b2) g^2
//   p = p (1 - lr wd)              (decoupled weight decay)
//   p = p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// Clipping by global norm (torch.nn.utils.clip_grad_norm_): with
//   n = sqrt(sum_i |g_i|^2) (over every rank's part: the caller all-reduces
//   the squared sum), every g is scaled by min(1, max_norm / (n + 1e-6)).
// Schedule: linear warm-up from 0 over `warmup` steps, then constant or
// cosine decay to `minLrRatio * lr` at `totalSteps`.
//
// Mixed precision (Megatron's --bf16, FSDP's MixedPrecision): for a 16-bit
// parameter (bfloat16) the optimizer keeps a float32 master copy beside
// the moments; the update runs on the master with the gradient widened to
// float32 (and clipped there), and the parameter becomes the master
// rounded to its type. float32 parameters update in place, as before.
// The master is taken from the parameter at the first step (weights loaded
// after the optimizer was made are the ones it starts from) or from a
// checkpoint's state.
//
// Offload (offload_optimizer): the state of the parameters given a unit
// (`unitOf[i] >= 0`, a decoder layer or the rest of the model) lives in
// the host pool (models/HostPool.h). step() updates the parameters whose
// state stays on the device first, then streams the units in order: each
// unit's moments and master come onto the device (the next one copying in
// while this one updates), update there with the same operations, and go
// back. A parameter that itself lives in the host pool (offload_params:
// an FSDP shard and its gradient) comes with its unit the same way. The
// result is the same, bit for bit; the device holds two units at most
// during the step.
//
// Fused (HFLOW_FUSED_OPTIMIZER=1, off by default): the update of a group
// of parameters (those on the device; each offloaded unit) is one call of
// LibTorch's fused AdamW kernel (torch.optim.AdamW(fused=True): every
// tensor of the group read and written once, not once per operation),
// on the float32 masters with the widened gradients for 16-bit
// parameters, which then take the masters' values rounded in one
// copy each. The kernel computes in float32 (its bias corrections from a
// float32 step count, sqrt(v) / sqrt(1 - b2^t)): the same update to
// float32 rounding, not bit for bit. It exists on CUDA from LibTorch 2.0
// and on a CPU from 2.4; elsewhere asking for it is refused, never served
// by the per-operation update.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_OPTIM_H
#define HFLOW_RUNTIME_MODELS_OPTIM_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hflow::models {

struct AdamWOptions {
  double lr = 1e-5;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weightDecay = 0.01;
  double clipGrad = 1.0;  ///< max global gradient norm; 0 = no clipping
  int64_t warmup = 0;     ///< linear warm-up steps
  bool cosine = false;    ///< cosine decay after warm-up (else constant)
  int64_t totalSteps = 0; ///< cosine horizon
  double minLrRatio = 0.0;
  bool fused = false;     ///< LibTorch's fused kernel (above)
};

/// Whether this build's LibTorch has the fused AdamW kernel for `device`
/// (CUDA: LibTorch >= 2.0; CPU: >= 2.4), or a stand-in is set.
bool fusedAdamWAvailable(c10::Device device);

/// The fused kernel's call: parameters (float32), gradients, both
/// moments, each one's step count (float32, the step being taken), then
/// lr, beta1, beta2, weight decay and eps (at::_fused_adamw_ without
/// amsgrad, maximize or gradient scaling).
using FusedAdamWKernel = std::function<void(
    at::TensorList w, at::TensorList g, at::TensorList m, at::TensorList v,
    at::TensorList steps, double lr, double beta1, double beta2, double weightDecay, double eps)>;

/// For tests on a LibTorch without the kernel: while it lives, `standIn`
/// takes the kernel's calls on every device, so that what the optimizer
/// does around the kernel (its groups, widened gradients, masters,
/// offloaded units) runs and is checked here.
class ScopedFusedAdamWStandIn {
public:
  explicit ScopedFusedAdamWStandIn(FusedAdamWKernel standIn);
  ~ScopedFusedAdamWStandIn();
  ScopedFusedAdamWStandIn(const ScopedFusedAdamWStandIn &) = delete;
  ScopedFusedAdamWStandIn &operator=(const ScopedFusedAdamWStandIn &) = delete;

private:
  FusedAdamWKernel previous_;
};
/// Whether HFLOW_FUSED_OPTIMIZER asks for the fused kernel ("1"; unset or
/// "0": the per-operation update).
bool fusedOptimizerRequested();
/// Throws std::invalid_argument, naming it, for an HFLOW_FUSED_OPTIMIZER
/// that is not 0 or 1, or that asks for a kernel this build does not
/// have for `device`.
void checkOptimizerEnvironment(c10::Device device);

/// The learning rate at optimizer step `step` (0-based) under `o`'s schedule.
double scheduledLr(const AdamWOptions &o, int64_t step);

/// The sum of |g|^2 over gradients, in float64, kept on one device: each
/// tensor's sum of squares is added there in the order given, the same
/// additions as adding each one's host value, bit for bit, without a
/// device-to-host read a tensor (one, by value(), at the end).
class SquareSum {
public:
  explicit SquareSum(c10::Device device);
  /// Adds |g|^2 (an undefined `g` adds nothing); g may be on another
  /// device (the host pool's), its sum comes over.
  void add(const at::Tensor &g);
  /// The sum so far, [1] float64 on the device.
  const at::Tensor &tensor() const { return acc_; }
  /// The sum so far, read on the host.
  double value() const;

private:
  at::Tensor acc_;
};

class AdamW {
public:
  /// `unitOf` (empty: none offloaded) gives each parameter's offload unit,
  /// -1 for one kept wholly on the device; `hostState` (empty: every
  /// parameter with a unit) whose state lives in the host pool.
  AdamW(std::vector<at::Tensor> params, AdamWOptions o, std::vector<int> unitOf = {},
        std::vector<bool> hostState = {});

  const AdamWOptions &options() const { return o_; }
  /// Changes the base learning rate (the schedule scales this one).
  void setLr(double lr) { o_.lr = lr; }
  /// Optimizer steps taken so far.
  int64_t steps() const { return t_; }
  /// Whether step() updates through the fused kernel.
  bool fused() const { return o_.fused; }

  /// The squared L2 norm of this rank's gradients (float64); parameters
  /// without a gradient count as zero.
  double localGradNormSquared() const;
  /// Scales the gradients so the global norm `globalNorm` becomes at most
  /// clipGrad; returns the factor applied (1 when not clipped).
  double clip(double globalNorm);
  /// One AdamW update with the scheduled learning rate; zeroes the grads.
  /// Returns the learning rate used.
  double step();
  void zeroGrad();

  /// The state as named tensors (m.i, v.i, master.i for a 16-bit
  /// parameter, and "step"), for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  /// Restores what state() returned; throws std::runtime_error naming the
  /// tensor on a shape mismatch.
  void loadState(const std::vector<std::pair<std::string, at::Tensor>> &s);
  /// Bytes of state (moments and masters) in the host pool (`host`) or on
  /// the device.
  int64_t stateBytes(bool host) const;

private:
  /// One parameter's update: `p` (updated in place), its gradient, `m`,
  /// `v` and `master`, wherever they are now (the same device).
  void update(const at::Tensor &p, const at::Tensor &grad, const at::Tensor &m,
              const at::Tensor &v, const at::Tensor &master, double lr, double bc1, double bc2);
  /// One parameter's tensors for the update, wherever they are now.
  struct Slot {
    at::Tensor p, grad, m, v, master;
  };
  /// The update of a group on one device: update() on each, or one call
  /// of the fused kernel.
  void updateGroup(const std::vector<Slot> &group, double lr, double bc1, double bc2);
  at::Tensor stepCount_; ///< the fused kernel's step, float32 on the device
  std::vector<at::Tensor> params_, m_, v_;
  std::vector<at::Tensor> master_; ///< float32 copies of 16-bit params (else undefined)
  std::vector<int> unitOf_;        ///< offload unit per parameter (-1: on the device)
  int units_ = 0;                  ///< offload units (max unitOf_ + 1)
  bool masterSet_ = false;         ///< master_ holds the weights (first step, or loaded)
  double pendingClip_ = 1.0;       ///< clip()'s factor for the 16-bit gradients
  AdamWOptions o_;
  int64_t t_ = 0;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_OPTIM_H
