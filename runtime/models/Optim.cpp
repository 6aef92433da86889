//===- Optim.cpp - AdamW, gradient clipping, learning-rate schedules -------===//
#include "runtime/models/Optim.h"
#include "runtime/models/Device.h"
#include "runtime/models/HostPool.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

// LibTorch's fused AdamW: CUDA from 2.0, a CPU from 2.4.
#if TORCH_VERSION_MAJOR >= 2
#define HFLOW_FUSED_ADAMW 1
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define HFLOW_FUSED_ADAMW_CPU 1
#endif

namespace hflow::models {

namespace {
/// ScopedFusedAdamWStandIn's kernel, or empty.
FusedAdamWKernel standInKernel;
} // namespace

ScopedFusedAdamWStandIn::ScopedFusedAdamWStandIn(FusedAdamWKernel standIn)
    : previous_(std::move(standInKernel)) {
  standInKernel = std::move(standIn);
}

ScopedFusedAdamWStandIn::~ScopedFusedAdamWStandIn() { standInKernel = std::move(previous_); }

bool fusedAdamWAvailable(c10::Device device) {
  if (standInKernel)
    return true;
#if defined(HFLOW_FUSED_ADAMW_CPU)
  if (device.is_cpu())
    return true;
#endif
#if defined(HFLOW_FUSED_ADAMW)
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

namespace {
/// HFLOW_FUSED_OPTIMIZER's setting, or -1 (and why) when it is not one.
int fusedSetting(std::string &why) {
  const char *e = std::getenv("HFLOW_FUSED_OPTIMIZER");
  const std::string v = e ? e : "";
  if (v.empty() || v == "0")
    return 0;
  if (v == "1")
    return 1;
  why = "HFLOW_FUSED_OPTIMIZER='" + v +
        "': set it to 1 (LibTorch's fused AdamW kernel) or 0 (the per-operation update)";
  return -1;
}

std::string noFusedKernel(c10::Device device) {
  return std::string("this build's LibTorch (") + TORCH_VERSION +
         ") has no fused AdamW kernel for " + device.str() +
         " (CUDA has one from LibTorch 2.0, a CPU from 2.4)";
}
} // namespace

bool fusedOptimizerRequested() {
  std::string why;
  return fusedSetting(why) == 1;
}

void checkOptimizerEnvironment(c10::Device device) {
  std::string why;
  const int s = fusedSetting(why);
  if (s < 0)
    throw std::invalid_argument(why);
  if (s == 1 && !fusedAdamWAvailable(device))
    throw std::invalid_argument("HFLOW_FUSED_OPTIMIZER=1: " + noFusedKernel(device) +
                                "; unset it or set it to 0");
}

double scheduledLr(const AdamWOptions &o, int64_t step) {
  if (o.warmup > 0 && step < o.warmup)
    return o.lr * (double)(step + 1) / (double)o.warmup;
  if (!o.cosine || o.totalSteps <= o.warmup)
    return o.lr;
  double progress = std::min(1.0, (double)(step - o.warmup) /
                                      (double)(o.totalSteps - o.warmup));
  double minLr = o.lr * o.minLrRatio;
  return minLr + (o.lr - minLr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

SquareSum::SquareSum(c10::Device device)
    : acc_(at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device))) {}

void SquareSum::add(const at::Tensor &g) {
  if (!g.defined())
    return;
  c10::NoGradGuard ng;
  at::Tensor s = g.to(at::kDouble).pow(2).sum();
  acc_.add_(s.device() == acc_.device() ? s : s.to(acc_.device()));
}

double SquareSum::value() const { return acc_.item<double>(); }

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions o, std::vector<int> unitOf,
             std::vector<bool> hostState)
    : params_(std::move(params)), unitOf_(std::move(unitOf)), o_(o) {
  if (unitOf_.empty())
    unitOf_.assign(params_.size(), -1);
  if (hostState.empty())
    for (int u : unitOf_)
      hostState.push_back(u >= 0);
  if (unitOf_.size() != params_.size() || hostState.size() != params_.size())
    throw std::invalid_argument("AdamW: " + std::to_string(unitOf_.size()) +
                                " offload units and " + std::to_string(hostState.size()) +
                                " state places for " + std::to_string(params_.size()) +
                                " parameters");
  c10::NoGradGuard ng;
  // The fused kernel's groups: one device (the host pool's tensors are
  // updated on the device they stream to), each tensor dense.
  for (size_t i = 0; o_.fused && i < params_.size(); ++i) {
    const at::Tensor &p = params_[i];
    const c10::Device d = HostPool::holds(p) ? engineDevice() : p.device();
    if (!fusedAdamWAvailable(d))
      throw std::invalid_argument("AdamW: the fused kernel (HFLOW_FUSED_OPTIMIZER=1): " +
                                  noFusedKernel(d));
    if (!p.is_contiguous())
      throw std::invalid_argument("AdamW: the fused kernel (HFLOW_FUSED_OPTIMIZER=1) updates "
                                  "contiguous tensors; parameter " + std::to_string(i) +
                                  " (shape " + c10::str(p.sizes()) + ") is not");
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor &p = params_[i];
    units_ = std::max(units_, unitOf_[i] + 1);
    const bool mixed = p.scalar_type() != at::kFloat;
    if (hostState[i]) { // in the host pool
      if (unitOf_[i] < 0)
        throw std::invalid_argument("AdamW: parameter " + std::to_string(i) +
                                    " keeps its state in host memory but has no offload unit");
      m_.push_back(HostPool::zeros(p.sizes(), at::kFloat));
      v_.push_back(HostPool::zeros(p.sizes(), at::kFloat));
      master_.push_back(mixed ? HostPool::copyOf(p.detach().to(at::kFloat)) : at::Tensor());
      continue;
    }
    // Moments in float32 whatever the parameter's type.
    auto f32 = p.options().dtype(at::kFloat);
    m_.push_back(at::zeros(p.sizes(), f32));
    v_.push_back(at::zeros(p.sizes(), f32));
    master_.push_back(mixed ? p.detach().to(at::kFloat).contiguous() : at::Tensor());
  }
}

int64_t AdamW::stateBytes(bool host) const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (const at::Tensor *t : {&m_[i], &v_[i], &master_[i]})
      if (t->defined() && HostPool::holds(*t) == host)
        n += (int64_t)t->numel() * (int64_t)t->element_size();
  }
  return n;
}

double AdamW::localGradNormSquared() const {
  SquareSum s(engineDevice());
  for (const auto &p : params_)
    s.add(p.grad());
  return s.value();
}

double AdamW::clip(double globalNorm) {
  if (o_.clipGrad <= 0 || !std::isfinite(globalNorm))
    return 1.0;
  double f = o_.clipGrad / (globalNorm + 1e-6);
  if (f >= 1.0)
    return 1.0;
  c10::NoGradGuard ng;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad().defined() && !master_[i].defined())
      params_[i].mutable_grad().mul_(f);
  pendingClip_ = f; // 16-bit gradients: scaled once widened, in step()
  return f;
}

double AdamW::step() {
  c10::NoGradGuard ng;
  const double lr = scheduledLr(o_, t_);
  ++t_;
  const double bc1 = 1.0 - std::pow(o_.beta1, (double)t_);
  const double bc2 = 1.0 - std::pow(o_.beta2, (double)t_);
  if (!masterSet_) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (master_[i].defined())
        master_[i].copy_(params_[i].detach());
    masterSet_ = true;
  }
  // Parameters with everything on the device first, then the offloaded
  // units streamed in turn: of each parameter, whichever of its weights,
  // gradient, moments and master live in the host pool.
  std::vector<std::vector<size_t>> byUnit(units_);
  std::vector<Slot> onDevice;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined())
      continue;
    if (unitOf_[i] < 0)
      onDevice.push_back({params_[i], params_[i].grad(), m_[i], v_[i], master_[i]});
    else
      byUnit[unitOf_[i]].push_back(i);
  }
  updateGroup(onDevice, lr, bc1, bc2);
  if (units_ > 0) {
    std::vector<std::vector<at::Tensor>> host;
    std::vector<std::vector<bool>> back; // what the update changes
    for (const std::vector<size_t> &u : byUnit) {
      host.emplace_back();
      back.emplace_back();
      for (size_t i : u) {
        const at::Tensor grad = params_[i].grad();
        for (const at::Tensor *t : std::initializer_list<const at::Tensor *>{
                 &params_[i], &grad, &m_[i], &v_[i], &master_[i]})
          if (t->defined() && HostPool::holds(*t)) {
            host.back().push_back(*t);
            back.back().push_back(t != &grad);
          }
      }
    }
    UnitStream stream(host);
    for (size_t u = 0; u < byUnit.size(); ++u) {
      std::vector<at::Tensor> dev = stream.next();
      size_t k = 0;
      auto here = [&](const at::Tensor &t) { return t.defined() && HostPool::holds(t) ? dev[k++] : t; };
      std::vector<Slot> unit;
      for (size_t i : byUnit[u]) {
        Slot s;
        s.p = here(params_[i]);
        s.grad = here(params_[i].grad());
        s.m = here(m_[i]), s.v = here(v_[i]), s.master = here(master_[i]);
        unit.push_back(std::move(s));
      }
      updateGroup(unit, lr, bc1, bc2);
      stream.writeBack(u, dev, back[u]);
    }
    stream.finish();
  }
  zeroGrad();
  return lr;
}

void AdamW::update(const at::Tensor &p, const at::Tensor &grad, const at::Tensor &m,
                   const at::Tensor &v, const at::Tensor &master, double lr, double bc1,
                   double bc2) {
  const bool mixed = master.defined();
  // The update's target and gradient: the float32 master and the widened
  // (clipped) gradient, or the float32 parameter itself.
  at::Tensor w = mixed ? master : p;
  at::Tensor g = mixed ? grad.to(at::kFloat) : grad;
  if (mixed && pendingClip_ != 1.0)
    g.mul_(pendingClip_);
  m.mul_(o_.beta1).add_(g, 1.0 - o_.beta1);
  v.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
  if (o_.weightDecay != 0)
    w.mul_(1.0 - lr * o_.weightDecay);
  at::Tensor denom = (v / bc2).sqrt_().add_(o_.eps);
  w.addcdiv_(m, denom, -lr / bc1);
  if (mixed)
    p.detach().copy_(w); // rounded to the parameter's type
}

void AdamW::updateGroup(const std::vector<Slot> &group, double lr, double bc1, double bc2) {
  if (!o_.fused) {
    for (const Slot &s : group)
      update(s.p, s.grad, s.m, s.v, s.master, lr, bc1, bc2);
    return;
  }
  // Calls of at most the largest widened gradient's bytes, the transient
  // the per-operation update needs too: a 16-bit parameter's gradient is
  // widened for the call, and its master rounded into it after.
  int64_t cap = 0;
  for (const Slot &s : group)
    cap = std::max(cap, (int64_t)s.grad.numel());
  std::vector<at::Tensor> w, g, m, v, rounded, masters;
  int64_t widened = 0;
  auto flush = [&] {
    if (w.empty())
      return;
    const int64_t n = (int64_t)w.size();
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(w.front().device());
    if (!stepCount_.defined() || stepCount_.device() != w.front().device() ||
        stepCount_.numel() < n)
      stepCount_ = at::empty({n}, f32);
    // The kernel reads the step (already counted) from each entry.
    stepCount_.fill_((double)t_);
    const std::vector<at::Tensor> steps = stepCount_.narrow(0, 0, n).unbind();
    if (standInKernel) {
      standInKernel(w, g, m, v, steps, lr, o_.beta1, o_.beta2, o_.weightDecay, o_.eps);
    } else {
#if defined(HFLOW_FUSED_ADAMW)
      at::_fused_adamw_(w, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, o_.beta1, o_.beta2,
                        o_.weightDecay, o_.eps, /*amsgrad=*/false, /*maximize=*/false);
#else
      throw std::logic_error("AdamW: the fused kernel was asked for in a build without it");
#endif
    }
    for (size_t i = 0; i < rounded.size(); ++i)
      rounded[i].detach().copy_(masters[i]); // rounded to the parameter's type
    w.clear(), g.clear(), m.clear(), v.clear(), rounded.clear(), masters.clear();
    widened = 0;
  };
  for (const Slot &s : group) {
    if (s.master.defined()) {
      if (widened > 0 && widened + s.grad.numel() > cap)
        flush();
      at::Tensor gw = s.grad.to(at::kFloat);
      if (pendingClip_ != 1.0)
        gw.mul_(pendingClip_);
      widened += s.grad.numel();
      w.push_back(s.master), g.push_back(gw);
      rounded.push_back(s.p), masters.push_back(s.master);
    } else {
      w.push_back(s.p), g.push_back(s.grad);
    }
    m.push_back(s.m), v.push_back(s.v);
  }
  flush();
  (void)bc1, (void)bc2; // the kernel's own, from the step
}

void AdamW::zeroGrad() {
  c10::NoGradGuard ng;
  for (auto &p : params_)
    if (p.grad().defined())
      p.mutable_grad().zero_();
  pendingClip_ = 1.0;
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> s;
  for (size_t i = 0; i < params_.size(); ++i) {
    s.emplace_back("m." + std::to_string(i), m_[i]);
    s.emplace_back("v." + std::to_string(i), v_[i]);
    if (master_[i].defined())
      s.emplace_back("master." + std::to_string(i), master_[i]);
  }
  s.emplace_back("step", at::full({1}, t_, at::TensorOptions().dtype(at::kLong)));
  return s;
}

void AdamW::loadState(const std::vector<std::pair<std::string, at::Tensor>> &s) {
  std::map<std::string, at::Tensor> byName(s.begin(), s.end());
  c10::NoGradGuard ng;
  auto take = [&](const std::string &name, at::Tensor &dst) {
    auto it = byName.find(name);
    if (it == byName.end())
      throw std::runtime_error("optimizer state: no tensor '" + name + "'");
    if (!it->second.sizes().equals(dst.sizes()))
      throw std::runtime_error("optimizer state: tensor '" + name + "' has shape " +
                               c10::str(it->second.sizes()) + ", expected " +
                               c10::str(dst.sizes()));
    dst.copy_(it->second);
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    take("m." + std::to_string(i), m_[i]);
    take("v." + std::to_string(i), v_[i]);
    if (master_[i].defined())
      take("master." + std::to_string(i), master_[i]);
  }
  masterSet_ = true;
  auto it = byName.find("step");
  if (it == byName.end())
    throw std::runtime_error("optimizer state: no tensor 'step'");
  t_ = it->second.item<int64_t>();
}

} // namespace hflow::models
