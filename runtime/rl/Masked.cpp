//===- Masked.cpp - masked reductions, clip helpers, argument checks ------===//
#include "runtime/rl/Masked.h"
#include "runtime/rl/Check.h"

#include <sstream>
#include <stdexcept>

namespace hflow::rl {
namespace detail {

std::string shape_str(const at::Tensor &t) {
  std::ostringstream os;
  os << '[';
  for (int64_t i = 0; i < t.dim(); ++i)
    os << (i ? ", " : "") << t.size(i);
  os << ']';
  return os.str();
}

void fail(const char *fn, const std::string &what) {
  throw std::invalid_argument(std::string("hflow::rl::") + fn + ": " + what);
}

static void check_defined(const at::Tensor &t, const char *fn, const char *name) {
  if (!t.defined())
    fail(fn, std::string("`") + name + "` is an undefined tensor");
}

void check_floating(const at::Tensor &t, const char *fn, const char *name) {
  check_defined(t, fn, name);
  if (!at::isFloatingType(t.scalar_type()))
    fail(fn, std::string("`") + name + "` must have a floating dtype, got " +
                 c10::toString(t.scalar_type()));
}

void check_dim(const at::Tensor &t, int64_t dim, const char *fn, const char *name) {
  check_defined(t, fn, name);
  if (t.dim() != dim)
    fail(fn, std::string("`") + name + "` must be " + std::to_string(dim) +
                 "-D, got shape " + shape_str(t));
}

static void check_device(const at::Tensor &t, const char *name,
                         const at::Tensor &ref, const char *refName,
                         const char *fn) {
  if (t.device() != ref.device())
    fail(fn, std::string("`") + name + "` is on " + t.device().str() +
                 " but `" + refName + "` is on " + ref.device().str());
}

void check_like(const at::Tensor &t, const char *name, const at::Tensor &ref,
                const char *refName, const char *fn) {
  check_defined(t, fn, name);
  if (!t.sizes().equals(ref.sizes()))
    fail(fn, std::string("`") + name + "` has shape " + shape_str(t) +
                 " but `" + refName + "` has shape " + shape_str(ref));
  if (t.scalar_type() != ref.scalar_type())
    fail(fn, std::string("`") + name + "` has dtype " +
                 c10::toString(t.scalar_type()) + " but `" + refName +
                 "` has dtype " + c10::toString(ref.scalar_type()));
  check_device(t, name, ref, refName, fn);
}

at::Tensor mask_as(const at::Tensor &mask, const char *name,
                   const at::Tensor &values, const char *valuesName,
                   const char *fn) {
  check_defined(mask, fn, name);
  if (!mask.sizes().equals(values.sizes()))
    fail(fn, std::string("`") + name + "` has shape " + shape_str(mask) +
                 " but `" + valuesName + "` has shape " + shape_str(values));
  at::ScalarType st = mask.scalar_type();
  if (!(st == at::kBool || at::isIntegralType(st, /*includeBool=*/false) ||
        st == values.scalar_type()))
    fail(fn, std::string("`") + name + "` must be bool, integral or " +
                 c10::toString(values.scalar_type()) + " (the dtype of `" +
                 valuesName + "`), got " + c10::toString(st));
  check_device(mask, name, values, valuesName, fn);
  return mask.to(values.scalar_type());
}

void check_index(const at::Tensor &index, int64_t batch, const at::Tensor &ref,
                 const char *fn) {
  check_defined(index, fn, "index");
  if (index.scalar_type() != at::kLong)
    fail(fn, std::string("`index` must be int64, got ") +
                 c10::toString(index.scalar_type()));
  if (index.dim() != 1 || index.size(0) != batch)
    fail(fn, "`index` must have shape [" + std::to_string(batch) +
                 "] (one group id per row), got " + shape_str(index));
  check_device(index, "index", ref, "token_level_rewards", fn);
}

} // namespace detail

using namespace detail;

static void check_axis(const at::Tensor &t, std::optional<int64_t> axis,
                       const char *fn) {
  if (axis && (*axis < -t.dim() || *axis >= t.dim() || t.dim() == 0))
    fail(fn, "axis " + std::to_string(*axis) + " is out of range for shape " +
                 shape_str(t));
}

/// The public functions' checks: `values` floating, `mask` like it (returned
/// in its dtype), `axis` (when given) one of its axes.
static at::Tensor checked_mask(const at::Tensor &values, const at::Tensor &mask,
                               std::optional<int64_t> axis, const char *fn) {
  check_floating(values, fn, "values");
  at::Tensor m = mask_as(mask, "mask", values, "values", fn);
  check_axis(values, axis, fn);
  return m;
}

// The unchecked cores: values floating, m already in the values' dtype.
static at::Tensor sum_masked(const at::Tensor &values, const at::Tensor &m,
                             std::optional<int64_t> axis) {
  at::Tensor valid = at::where(m != 0, values, at::zeros({}, values.options()));
  at::Tensor prod = valid * m;
  return axis ? prod.sum(*axis) : prod.sum();
}

static at::Tensor mean_masked(const at::Tensor &values, const at::Tensor &m,
                              std::optional<int64_t> axis) {
  at::Tensor count = axis ? m.sum(*axis) : m.sum();
  return sum_masked(values, m, axis) / (count + 1e-8);
}

at::Tensor masked_sum(const at::Tensor &values, const at::Tensor &mask,
                      std::optional<int64_t> axis) {
  at::Tensor m = checked_mask(values, mask, axis, "masked_sum");
  return sum_masked(values, m, axis);
}

at::Tensor masked_mean(const at::Tensor &values, const at::Tensor &mask,
                       std::optional<int64_t> axis) {
  at::Tensor m = checked_mask(values, mask, axis, "masked_mean");
  return mean_masked(values, m, axis);
}

at::Tensor masked_var(const at::Tensor &values, const at::Tensor &mask,
                      bool unbiased) {
  at::Tensor m = checked_mask(values, mask, std::nullopt, "masked_var");
  at::Tensor mean = mean_masked(values, m, std::nullopt);
  at::Tensor centered = values - mean;
  at::Tensor variance = mean_masked(centered * centered, m, std::nullopt);
  if (unbiased) {
    at::Tensor n = m.sum();
    double nv = n.item<double>();
    if (nv == 0.0)
      fail("masked_var", "the mask has no nonzero element (sum(mask) == 0); "
                         "the unbiased variance needs at least two");
    if (nv == 1.0)
      fail("masked_var", "sum(mask) == 1: the unbiased variance divides by "
                         "N - 1 = 0; use a larger batch");
    variance = variance * (n / (n - 1));
  }
  return variance;
}

at::Tensor masked_whiten(const at::Tensor &values, const at::Tensor &mask,
                         bool shift_mean) {
  at::Tensor m = checked_mask(values, mask, std::nullopt, "masked_whiten");
  at::Tensor mean = mean_masked(values, m, std::nullopt);
  at::Tensor var = masked_var(values, m, /*unbiased=*/true);
  at::Tensor whitened = (values - mean) * at::rsqrt(var + 1e-8);
  if (!shift_mean)
    whitened = whitened + mean;
  return whitened;
}

at::Tensor clip_by_value(const at::Tensor &x, const at::Tensor &lo,
                         const at::Tensor &hi) {
  check_floating(x, "clip_by_value", "x");
  if (!lo.defined() || !hi.defined())
    fail("clip_by_value", "`lo` and `hi` must be defined tensors");
  return at::maximum(at::minimum(x, hi), lo);
}

at::Tensor clip_by_value(const at::Tensor &x, double lo, double hi) {
  check_floating(x, "clip_by_value", "x");
  return at::clamp_min(at::clamp_max(x, hi), lo);
}

} // namespace hflow::rl
