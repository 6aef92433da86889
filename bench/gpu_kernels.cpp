//===- gpu_kernels.cpp - the project's CUDA kernels against references ------===//
//
// hflow-gpu-kernels [--device cpu|cuda] [--cases SET] [--time]
//
// The paged decode attention (runtime/models/PagedAttention.h) as the
// rollout engine calls it: a KV pool with scattered block tables, rows of
// different lengths, one decode step through PagedKvStep, and the same step
// as the last of a decode window (PagedKvWindow). For each case the
// kernel's output (attendInPlace, on a GPU whose build has the kernel) and
// the ATen path's (append's gather, then attendGrouped with the step's mask)
// and the kernel's ATen reference (pagedDecodeReference, the paged path a
// CPU takes) are compared with a brute force in float64 on the host (each
// row's keys through its table, softmax, the weighted values): f32 within
// 1e-5 of the output's largest value, bf16 and f16 within 3e-2 (the ATen
// path rounds its scores and probabilities to the inputs' type: 1.2e-2
// seen on a CPU). On a CPU the paged path is the reference, through
// attendInPlace as the engine calls it (the dry run CI runs; f16 is skipped
// there: no f16 matmul in Debian's LibTorch).
// With --time on a GPU, both paths of one layer at the rollout benchmark's
// shapes (256 rows, 768 keys: Llama-3-8B's and Qwen2.5-0.5B's heads, bf16),
// each timed over 50 calls, with the bytes of the pool they must read.
//
// Then the packed training attention (attendPacked, HFLOW_PACKED_PASSES):
// rows of different lengths packed into one sequence, each a segment
// attending within itself, forward and backward. Its output and the
// gradients of its queries, keys and values are compared with a float64
// brute force segment by segment (f32 within 1e-5, bf16 and f16 within
// 3e-2); on a GPU in 16-bit the flash kernel on variable-length segments
// must have taken them. With --time on a GPU, a training pass's attention
// (16 rows of up to 2,048 tokens) packed through the flash kernel against
// the padded rows through attendGrouped, forward and backward.
//
// Then the fused AdamW (AdamW with HFLOW_FUSED_OPTIMIZER's kernel,
// LibTorch's): six steps of the same gradients through the fused kernel
// and through the per-operation update on the same device (float32 and
// bfloat16 parameters with float32 masters, weight decay, clipping, a
// warm-up, offloaded units), every parameter, master and moment within
// float32 rounding of the other's after each step (the kernel computes its
// bias corrections in float32), and each 16-bit parameter exactly its
// master rounded. Skipped where this build's LibTorch has no fused kernel
// for the device (Debian's 1.13). With --time on a GPU, one step at
// Qwen2.5-0.5B's and Qwen2.5-1.5B's parameters (bf16, float32 masters) both ways.
//
// Then the models' RMSNorm (rmsNorm: LibTorch's at::rms_norm from 2.4, the
// weight applied after its rounding) against transformers' LlamaRMSNorm
// operation by operation, forward and gradients (normCases).
//
// --cases paged, packed, optim or norm runs one set alone (gpu-test checks them
// apart, so that a failure of one is not taken for another's). Prints a
// line per case and ends "N passed, N failed"; exits 1 on a failure.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/NcclBackend.h"
#include "runtime/models/Device.h"
#include "runtime/models/Layers.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Packing.h"
#include "runtime/models/PagedKv.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hflow::models;

namespace {

struct Case {
  const char *name;
  int64_t B, nq, nkv, hd, block, maxLen, window;
  at::ScalarType dtype;
};

struct Setup {
  std::unique_ptr<KvBlockPool> pool;
  std::vector<std::vector<int>> tables;
  std::vector<int64_t> lens;
  at::Tensor q, k, v; ///< the step's new query, key and value [B, heads, 1, hd]
};

/// A pool whose blocks are handed out in a shuffled order, rows of lengths
/// drawn from `least` (or maxLen, if less) up to maxLen (the last row at
/// maxLen; every row with `full`), the first len - 1 keys of each row
/// written into the pool as earlier steps would have. Every row has blocks
/// of its own.
Setup makeSetup(const Case &c, uint64_t seed, bool full = false, int64_t least = 1) {
  std::mt19937_64 rng(seed);
  Setup s;
  least = std::min(least, c.maxLen);
  for (int64_t r = 0; r < c.B; ++r)
    s.lens.push_back(full || r + 1 == c.B
                         ? c.maxLen
                         : least + (int64_t)(rng() % (uint64_t)(c.maxLen - least + 1)));
  int64_t blocks = 1;
  for (int64_t len : s.lens)
    blocks += (len + c.block - 1) / c.block;
  KvGeometry g;
  g.layers = 1, g.kvHeads = c.nkv, g.headDim = c.hd, g.dtype = c.dtype;
  s.pool = std::make_unique<KvBlockPool>(g, blocks, c.block);
  std::vector<int> order((size_t)blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  for (int64_t len : s.lens) {
    std::vector<int> t;
    for (int64_t i = 0; i < (len + c.block - 1) / c.block; ++i)
      t.push_back(order[next++]);
    s.tables.push_back(t);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto f = at::TensorOptions().dtype(at::kFloat);
  s.pool->keys(0).copy_(at::randn(s.pool->keys(0).sizes(), gen, f));
  s.pool->values(0).copy_(at::randn(s.pool->values(0).sizes(), gen, f));
  auto dev = onEngine(c.dtype);
  s.q = at::randn({c.B, c.nq, 1, c.hd}, gen, f).to(dev);
  s.k = at::randn({c.B, c.nkv, 1, c.hd}, gen, f).to(dev);
  s.v = at::randn({c.B, c.nkv, 1, c.hd}, gen, f).to(dev);
  return s;
}

PagedKvStep stepOf(Setup &s) {
  std::vector<const std::vector<int> *> t;
  std::vector<int64_t> past, q;
  for (size_t r = 0; r < s.tables.size(); ++r) {
    t.push_back(&s.tables[r]);
    past.push_back(s.lens[r] - 1);
    q.push_back(1);
  }
  return PagedKvStep(*s.pool, t, past, q);
}

/// The same step as the third of a decode window of 3 (PagedKvWindow, as
/// the engine's HFLOW_DECODE_STEPS runs it): a row of 3 keys or more
/// (makeSetup's `least`) has 2 positions before the window. A row of one
/// key (the "one key" case) has its slots end at its first step (span 1)
/// and computes on that last slot, as a row that reached max tokens inside
/// a window does: the ATen path reads its one key in each of 3 columns,
/// the same attention, and the kernel reads it once.
PagedKvStep windowStepOf(Setup &s) {
  std::vector<const std::vector<int> *> t;
  std::vector<int64_t> past, span;
  std::vector<int64_t> toks;
  for (size_t r = 0; r < s.tables.size(); ++r) {
    if (s.lens[r] == 2)
      throw std::logic_error("windowStepOf: a row of 2 keys (its step 2 would read key 1 twice)");
    t.push_back(&s.tables[r]);
    const bool room = s.lens[r] >= 3;
    past.push_back(room ? s.lens[r] - 3 : s.lens[r] - 1);
    span.push_back(room ? 3 : 1);
    toks.push_back(0);
  }
  return PagedKvWindow(*s.pool, t, past, span, 3, toks).step(2);
}

/// The ATen path: the gathered keys, attendGrouped under the step's mask.
at::Tensor atenPath(PagedKvStep &step, const Setup &s, const Case &c, double scale) {
  at::Tensor keyReal = step.keyReal(step.newMask());
  at::Tensor bias = attentionBias(keyReal, step.past(), 1, c.window);
  auto [k, v] = step.append(0, s.k, s.v);
  return attendGrouped(s.q, k, v, bias, scale);
}

/// Each row's slot of its new position (len - 1).
at::Tensor newSlots(const Setup &s, const Case &c) {
  std::vector<int64_t> slots;
  for (size_t r = 0; r < s.lens.size(); ++r) {
    const int64_t i = s.lens[r] - 1;
    slots.push_back((int64_t)s.tables[r][(size_t)(i / c.block)] * c.block + i % c.block);
  }
  return at::tensor(slots, at::TensorOptions().dtype(at::kLong));
}

/// pagedDecodeReference over the pool as the step left it (its new keys
/// and values stored), through each row's table and length (a row's
/// length is the same in a window's last step: its key is at len - 1).
at::Tensor referenceOf(const Setup &s, const Case &c, double scale) {
  size_t most = 1;
  for (const auto &t : s.tables)
    most = std::max(most, t.size());
  at::Tensor tables = at::zeros({c.B, (int64_t)most}, at::TensorOptions().dtype(at::kInt));
  for (int64_t r = 0; r < c.B; ++r)
    for (size_t i = 0; i < s.tables[(size_t)r].size(); ++i)
      tables[r][(int64_t)i] = s.tables[(size_t)r][i];
  at::Tensor lens = at::tensor(s.lens, at::TensorOptions().dtype(at::kLong)).to(at::kInt);
  const c10::Device d = s.pool->keys(0).device();
  return pagedDecodeReference(s.q, s.pool->keys(0), s.pool->values(0), tables.to(d), lens.to(d),
                              c.block, c.window, scale);
}

/// Float64 on the host, row by row through the tables, from the pool before
/// the step stores anything: the step's new key and value put in each row's
/// new slot here, so a path that stores them wrongly (or not) differs.
at::Tensor bruteForce(const Setup &s, const Case &c, double scale) {
  at::Tensor K = s.pool->keys(0).to(at::kCPU).to(at::kDouble),
             V = s.pool->values(0).to(at::kCPU).to(at::kDouble);
  const at::Tensor slots = newSlots(s, c);
  K.index_copy_(0, slots, s.k.to(at::kCPU).to(at::kDouble).squeeze(2));
  V.index_copy_(0, slots, s.v.to(at::kCPU).to(at::kDouble).squeeze(2));
  at::Tensor Q = s.q.to(at::kCPU).to(at::kDouble);
  at::Tensor out = at::zeros({c.B, c.nq, 1, c.hd}, at::TensorOptions().dtype(at::kDouble));
  const int64_t g = c.nq / c.nkv;
  for (int64_t r = 0; r < c.B; ++r) {
    const int64_t len = s.lens[(size_t)r];
    const int64_t from = c.window > 0 ? std::max<int64_t>(0, len - c.window) : 0;
    std::vector<int64_t> slots;
    for (int64_t i = from; i < len; ++i)
      slots.push_back((int64_t)s.tables[(size_t)r][(size_t)(i / c.block)] * c.block + i % c.block);
    at::Tensor idx = at::tensor(slots, at::TensorOptions().dtype(at::kLong));
    at::Tensor kr = K.index_select(0, idx), vr = V.index_select(0, idx); // [n, nkv, hd]
    for (int64_t h = 0; h < c.nq; ++h) {
      at::Tensor sc = at::mv(kr.select(1, h / g), Q[r][h][0]) * scale;
      out[r][h][0].copy_(at::mv(vr.select(1, h / g).t(), at::softmax(sc, 0)));
    }
  }
  return out;
}

double relErr(const at::Tensor &got, const at::Tensor &want) {
  at::Tensor g = got.to(at::kCPU).to(at::kDouble);
  return (g - want).abs().max().item<double>() / want.abs().max().item<double>();
}

template <class F> double msPerCall(F f, int reps) {
  f(); // warm-up
  (void)f().sum().template item<double>();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor last;
  for (int i = 0; i < reps; ++i)
    last = f();
  (void)last.sum().item<double>(); // the stream drained
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
             .count() /
         reps;
}

/// A case of packed training attention (attendPacked, as a packed pass's
/// layers call it): B rows of T columns, each row's real tokens a span of
/// its own length (one row of T, one of a single token) at its own offset.
struct PackedCase {
  const char *name;
  int64_t B, T, nq, nkv, hd, window;
  at::ScalarType dtype;
};

/// The rows' key mask [B, T] (kLong) of a case: row r's span drawn from the
/// seed, row 0 full, row 1 one token.
at::Tensor packedMask(const PackedCase &c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  at::Tensor m = at::zeros({c.B, c.T}, at::TensorOptions().dtype(at::kLong));
  for (int64_t r = 0; r < c.B; ++r) {
    const int64_t len = r == 0 ? c.T : r == 1 ? 1 : 1 + (int64_t)(rng() % (uint64_t)c.T);
    const int64_t from = (int64_t)(rng() % (uint64_t)(c.T - len + 1));
    m[r].narrow(0, from, len).fill_(1);
  }
  return m;
}

/// Float64 on the host, segment by segment: each query head over its group's
/// key head, the segment's keys at or before it (within the window), then
/// the weighted values. q [1, nq, N, hd], k and v [1, nkv, N, hd].
at::Tensor packedBruteForce(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            const PackedRows &p, double scale, int64_t window) {
  const int64_t nq = q.size(1), nkv = k.size(1), g = nq / nkv;
  std::vector<at::Tensor> out;
  for (size_t s = 0; s + 1 < p.starts.size(); ++s) {
    const int64_t a = p.starts[s], len = p.starts[s + 1] - a;
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < nq; ++h) {
      const at::Tensor qs = q[0][h].narrow(0, a, len), ks = k[0][h / g].narrow(0, a, len),
                       vs = v[0][h / g].narrow(0, a, len);
      at::Tensor sc = at::matmul(qs, ks.t()) * scale; // [len, len]
      const at::Tensor i = at::arange(len, sc.options().dtype(at::kLong)).unsqueeze(1);
      const at::Tensor j = at::arange(len, sc.options().dtype(at::kLong)).unsqueeze(0);
      at::Tensor allowed = j <= i;
      if (window > 0)
        allowed = allowed & (i - j < window);
      sc = sc.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
      heads.push_back(at::matmul(at::softmax(sc, 1), vs));
    }
    out.push_back(at::stack(heads, 0)); // [nq, len, hd]
  }
  return at::cat(out, 1).unsqueeze(0);
}

/// The packed cases: attendPacked's output and its gradients (q, k, v under
/// one fixed output gradient) against the float64 brute force's, each
/// within `tol` of its largest value. On a GPU in 16-bit attendPacked must
/// take the flash kernel on variable-length segments; elsewhere its
/// per-segment path (the CPU's) is what is checked.
void packedCases(const std::string &device, bool time, int &passed, int &failed) {
  c10::InferenceMode autograd(false);
  const PackedCase cases[] = {
      {"packed rows, qwen2.5-0.5b heads, f32", 6, 96, 14, 2, 64, 0, at::kFloat},
      {"packed rows, window 9, f32", 5, 48, 6, 2, 128, 9, at::kFloat},
      {"packed rows, llama3-8b heads, bf16", 4, 160, 32, 8, 128, 0, at::kBFloat16},
      {"packed rows, qwen2.5-0.5b heads, bf16", 8, 200, 14, 2, 64, 0, at::kBFloat16},
      {"packed rows, window 24, bf16", 5, 128, 8, 2, 64, 24, at::kBFloat16},
      {"packed rows, hd 256, bf16", 3, 64, 16, 2, 256, 0, at::kBFloat16},
      {"packed rows, hd 32, f16", 4, 80, 4, 4, 32, 0, at::kHalf},
  };
  uint64_t seed = 1000;
  for (const PackedCase &c : cases) {
    ++seed;
    if (c.dtype == at::kHalf && device == "cpu") {
      std::printf("skipped: %s: no f16 matmul on this CPU's LibTorch\n", c.name);
      continue;
    }
    const auto dev = onEngine(c.dtype);
    const at::Tensor mask = packedMask(c, seed).to(dev.device());
    const PackedRows p = packRows(mask);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto f64 = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor q64 = at::randn({1, c.nq, p.N, c.hd}, gen, f64),
                     k64 = at::randn({1, c.nkv, p.N, c.hd}, gen, f64),
                     v64 = at::randn({1, c.nkv, p.N, c.hd}, gen, f64),
                     g64 = at::randn({1, c.nq, p.N, c.hd}, gen, f64);
    const double scale = 1.0 / std::sqrt((double)c.hd);
    // The reference from the inputs as the path sees them (rounded to its
    // type), so only the path's own arithmetic is measured.
    auto leaf = [&](const at::Tensor &x) { return x.to(dev).detach().requires_grad_(true); };
    at::Tensor q = leaf(q64), k = leaf(k64), v = leaf(v64);
    auto ref = [&](const at::Tensor &x) {
      return x.detach().to(at::kCPU).to(at::kDouble).requires_grad_(true);
    };
    at::Tensor qr = ref(q), kr = ref(k), vr = ref(v);
    const int64_t before = packedFlashAttends();
    at::Tensor out = attendPacked(q, k, v, p, packedMasks(p, c.window, q), scale, c.window);
    const bool flash = packedFlashAttends() > before;
    out.backward(g64.to(dev));
    at::Tensor want = packedBruteForce(qr, kr, vr, p, scale, c.window);
    want.backward(g64);
    const double tol = c.dtype == at::kFloat ? 1e-5 : 3e-2;
    auto err = [](const at::Tensor &got, const at::Tensor &w) {
      return relErr(got.detach(), w.detach());
    };
    const double eo = err(out, want), eq = err(q.grad(), qr.grad()),
                 ek = err(k.grad(), kr.grad()), ev = err(v.grad(), vr.grad());
    const bool wantFlash = device == "cuda" && c.dtype != at::kFloat;
    const bool ok = eo <= tol && eq <= tol && ek <= tol && ev <= tol && flash == wantFlash;
    (ok ? passed : failed)++;
    std::printf("%s: %s: %s, %lld segments of up to %lld tokens: output %.2e, gradients q %.2e "
                "k %.2e v %.2e of the largest (tolerance %.0e)%s\n",
                ok ? "passed" : "FAILED", c.name, flash ? "flash varlen" : "per segment",
                (long long)(p.starts.size() - 1), (long long)p.maxLen, eo, eq, ek, ev, tol,
                flash == wantFlash ? ""
                : wantFlash        ? "; the flash kernel was not taken"
                                   : "; the flash kernel was taken on a CPU or in f32");
  }
  if (!time || device != "cuda")
    return;
  // A training pass's attention, forward and backward: 16 rows of up to
  // 2,048 columns, lengths drawn from [256, 2048], packed through the flash
  // kernel against the padded rows through attendGrouped under their mask.
  for (const PackedCase &c :
       {PackedCase{"qwen2.5-0.5b heads, 16 rows x 2048, bf16", 16, 2048, 14, 2, 64, 0,
                   at::kBFloat16},
        PackedCase{"llama3-8b heads, 16 rows x 2048, bf16", 16, 2048, 32, 8, 128, 0,
                   at::kBFloat16}}) {
    std::mt19937_64 rng(7);
    const auto dev = onEngine(c.dtype);
    at::Tensor mask = at::zeros({c.B, c.T}, at::TensorOptions().dtype(at::kLong));
    for (int64_t r = 0; r < c.B; ++r)
      mask[r].narrow(0, 0, 256 + (int64_t)(rng() % (uint64_t)(c.T - 255))).fill_(1);
    mask = mask.to(dev.device());
    const PackedRows p = packRows(mask);
    const double scale = 1.0 / std::sqrt((double)c.hd);
    auto leafOf = [&](at::IntArrayRef shape) {
      return at::randn(shape, dev).detach().requires_grad_(true);
    };
    at::Tensor q = leafOf({1, c.nq, p.N, c.hd}), k = leafOf({1, c.nkv, p.N, c.hd}),
               v = leafOf({1, c.nkv, p.N, c.hd});
    at::Tensor qp = leafOf({c.B, c.nq, c.T, c.hd}), kp = leafOf({c.B, c.nkv, c.T, c.hd}),
               vp = leafOf({c.B, c.nkv, c.T, c.hd});
    const auto masks = packedMasks(p, 0, q);
    const at::Tensor bias = attentionBias(mask, 0, c.T, 0);
    const double tPacked = msPerCall(
        [&] {
          at::Tensor o = attendPacked(q, k, v, p, masks, scale, 0);
          o.backward(at::ones_like(o));
          return q.grad();
        },
        20);
    const double tPadded = msPerCall(
        [&] {
          at::Tensor o = attendGrouped(qp, kp, vp, bias, scale);
          o.backward(at::ones_like(o));
          return qp.grad();
        },
        20);
    std::printf("time: packed attention, forward and backward: %s, %lld of %lld tokens real: "
                "flash varlen %.3f ms, padded ATen path %.3f ms (%.2fx the packed)\n",
                c.name, (long long)p.N, (long long)(c.B * c.T), tPacked, tPadded,
                tPadded / tPacked);
  }
}

/// The largest |a - b| over two lists of float32 or bf16 tensors, the
/// difference taken in float32 (exact for bf16; within 2^-24 of itself for
/// float32, far below the tolerances). Not float64: a 4864 x 896 matrix's
/// float64 copies are each above glibc's mmap threshold, and on the 2-core
/// VM their page faults took 45 of the optimizer cases' 50 s.
double maxDiff(const std::vector<at::Tensor> &a, const std::vector<at::Tensor> &b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i)
    e = std::max(e, (a[i].to(at::kFloat) - b[i].to(at::kFloat)).abs().max().item<double>());
  return e;
}

/// The largest |t| over a list of tensors.
double maxAbs(const std::vector<at::Tensor> &ts) {
  double e = 0;
  for (const at::Tensor &t : ts)
    e = std::max(e, t.abs().max().item<double>());
  return e;
}

/// An optimizer's state tensors whose names start with `prefix` ("m.", "v.",
/// "master."), in order.
std::vector<at::Tensor> stateOf(const AdamW &o, const std::string &prefix) {
  std::vector<at::Tensor> out;
  for (const auto &[name, t] : o.state())
    if (name.rfind(prefix, 0) == 0)
      out.push_back(t.to(engineDevice()));
  return out;
}

/// Parameters of `shapes` in `dtype` on the engine's device (leaves that
/// take gradients, as a model's), from `seed`.
std::vector<at::Tensor> paramsOf(const std::vector<std::vector<int64_t>> &shapes,
                                 at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (const auto &sh : shapes)
    ps.push_back((at::randn(sh, onEngine(at::kFloat)) * 0.5).to(dtype).requires_grad_(true));
  return ps;
}

/// The fused AdamW against the per-operation update (above).
void optimCases(const std::string &device, bool time, int &passed, int &failed) {
  c10::InferenceMode autograd(false);
  // Without the kernel (Debian's LibTorch 1.13 on a CPU) the cases run the
  // per-operation update against itself: the dry run of this check.
  const bool kernel = fusedAdamWAvailable(engineDevice());
  if (!kernel)
    std::printf("fused AdamW: this build's LibTorch (%s) has no fused kernel for %s: the "
                "per-operation update against itself (the check's dry run)\n",
                TORCH_VERSION, device.c_str());
  struct OptimCase {
    const char *name;
    at::ScalarType dtype;
    bool offload;
  };
  // A norm, projections, an odd size and an embedding-like matrix.
  const std::vector<std::vector<int64_t>> shapes = {
      {896}, {128, 896}, {896, 896}, {37, 11}, {4864, 896}, {1003}, {2048, 384}};
  for (const OptimCase &c : {OptimCase{"fused AdamW, f32 parameters", at::kFloat, false},
                             OptimCase{"fused AdamW, bf16 parameters, f32 masters",
                                       at::kBFloat16, false},
                             OptimCase{"fused AdamW, bf16, offloaded units", at::kBFloat16,
                                       true}}) {
    AdamWOptions o;
    o.lr = 1e-3, o.weightDecay = 0.1, o.clipGrad = 1.0, o.warmup = 2;
    o.cosine = true, o.totalSteps = 8, o.minLrRatio = 0.1;
    std::vector<at::Tensor> a = paramsOf(shapes, c.dtype, 5), b = paramsOf(shapes, c.dtype, 5);
    std::vector<int> units;
    if (c.offload) // the first four in two units, the rest on the device
      units = {0, 0, 1, 1, -1, -1, -1};
    AdamWOptions of = o;
    of.fused = kernel;
    AdamW plain(a, o, units), fused(b, of, units);
    const int steps = 6;
    double eW = 0, eM = 0, eV = 0, tolW = 0;
    bool rounded = true, clipped = false;
    for (int t = 0; t < steps; ++t) {
      at::manual_seed(100 + t);
      for (size_t i = 0; i < a.size(); ++i) {
        // Gradients large enough that clipping scales them on most steps.
        at::Tensor g = (at::randn(a[i].sizes(), onEngine(at::kFloat)) * (t % 2 ? 0.01 : 1.0))
                           .to(c.dtype);
        a[i].mutable_grad() = g.clone();
        b[i].mutable_grad() = g.clone();
      }
      for (AdamW *opt : {&plain, &fused}) {
        const double f = opt->clip(std::sqrt(opt->localGradNormSquared()));
        clipped = clipped || f < 1.0;
        opt->step();
      }
      // Each step's update is lr-sized: the kernel's float32 bias
      // corrections (1 - 0.999^t to float32) change it by ~1e-4 of lr at
      // most; the weights' own rounding adds an ulp or two a step.
      const std::vector<at::Tensor> wa = c.dtype == at::kFloat ? a : stateOf(plain, "master.");
      const std::vector<at::Tensor> wb = c.dtype == at::kFloat ? b : stateOf(fused, "master.");
      tolW += o.lr * 1e-4 + 2.5e-7 * std::max(1.0, maxAbs(wa));
      eW = std::max(eW, maxDiff(wa, wb) / tolW);
      const auto ma = stateOf(plain, "m."), mb = stateOf(fused, "m.");
      const auto va = stateOf(plain, "v."), vb = stateOf(fused, "v.");
      eM = std::max(eM, maxDiff(ma, mb) / maxAbs(ma));
      eV = std::max(eV, maxDiff(va, vb) / maxAbs(va));
      if (c.dtype != at::kFloat)
        for (size_t i = 0; i < b.size(); ++i)
          rounded = rounded && at::equal(b[i].detach(), wb[i].to(c.dtype));
    }
    // (The kernel may form 1 - b2 in float32: 1.3e-5 of v's scale; a
    // wrong coefficient or a moment left out is off by far more.)
    const double tolMoments = 1e-4;
    const bool ok = fused.fused() == kernel && !plain.fused() && clipped && rounded && eW <= 1.0 &&
                    eM <= tolMoments && eV <= tolMoments;
    (ok ? passed : failed)++;
    std::printf("%s: %s, %d steps: weights %.2f of the tolerance, moments %.1e and %.1e of the "
                "largest (tolerance %.0e)%s%s\n",
                ok ? "passed" : "FAILED", c.name, steps, eW, eM, eV, tolMoments,
                rounded ? "" : "; a bf16 parameter is not its master rounded",
                clipped ? "" : "; clipping never scaled the gradients");
  }
  if (!time || !kernel || device != "cuda")
    return;
  // One step at a real model's parameters: Qwen2.5's decoder layers
  // (q, k, v with biases, o, gate, up, down, two norms) and the tied
  // embedding, bf16 with float32 masters.
  struct Shape {
    const char *name;
    int64_t layers, hidden, inter, kv, vocab;
  };
  for (const Shape &m : {Shape{"qwen2.5-0.5b", 24, 896, 4864, 128, 151936},
                         Shape{"qwen2.5-1.5b", 28, 1536, 8960, 256, 151936}}) {
    std::vector<std::vector<int64_t>> sh = {{m.vocab, m.hidden}, {m.hidden}};
    for (int64_t l = 0; l < m.layers; ++l)
      for (std::vector<int64_t> s :
           {std::vector<int64_t>{m.hidden, m.hidden}, {m.hidden}, {m.kv, m.hidden}, {m.kv},
            {m.kv, m.hidden}, {m.kv}, {m.hidden, m.hidden}, {m.inter, m.hidden},
            {m.inter, m.hidden}, {m.hidden, m.inter}, {m.hidden}, {m.hidden}})
        sh.push_back(s);
    int64_t n = 0;
    for (const auto &s : sh) {
      int64_t k = 1;
      for (int64_t d : s)
        k *= d;
      n += k;
    }
    double ms[2] = {0, 0};
    for (int f = 0; f < 2; ++f) {
      std::vector<at::Tensor> ps = paramsOf(sh, at::kBFloat16, 3);
      AdamWOptions o;
      o.fused = f == 1;
      AdamW opt(ps, o);
      // step() zeroes the gradients it read: each step reads them again.
      for (at::Tensor &p : ps)
        p.mutable_grad() = at::full_like(p, 1e-3).detach();
      auto once = [&] {
        opt.step();
        return ps.front().detach();
      };
      ms[f] = msPerCall(once, 5);
    }
    // Bytes the fused step must move a parameter: the bf16 gradient read,
    // the master and both moments read and written, the parameter written.
    const double bytes = (double)n * (2 + 3 * 8 + 2);
    std::printf("time: AdamW step, %s (%.0fM parameters, bf16, f32 masters): fused %.2f ms "
                "(%.0f GB/s of its 28 bytes a parameter), per operation %.2f ms (%.2fx the "
                "fused); each with its zeroing of the gradients\n",
                m.name, n / 1e6, ms[1], bytes / ms[1] / 1e6, ms[0], ms[0] / ms[1]);
  }
}

/// Whether rmsNorm takes LibTorch's at::rms_norm (from 2.4; Llama.cpp).
constexpr bool kAtenRmsNorm =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4);

/// transformers' LlamaRMSNorm, operation by operation: the reference the
/// model's rmsNorm must match.
at::Tensor rmsNormChain(const at::Tensor &x, const at::Tensor &w, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return w * (f * at::rsqrt(f.pow(2).mean({-1}, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

/// The model's RMSNorm (rmsNorm, LibTorch's at::rms_norm where it has one)
/// against the chain above, forward and the gradients of the input and the
/// weight: f32 within 1e-6 of the output's largest value and gradients
/// within 1e-5 of theirs; 16-bit all but 1e-3 (f16 4e-3) of the outputs bit
/// for bit the chain's and every one within two units in the last place
/// (the normalised value may round the other way where the float32
/// statistics differ in their last bit, and the weight's product rounds
/// again), and gradients within 2e-2 (bf16) or 4e-3 (f16) of their
/// largest. Each 16-bit case also requires the criterion to reject the
/// weight applied before the rounding (a quarter of the outputs differ).
/// Without at::rms_norm (Debian's 1.13) rmsNorm is the chain itself: the
/// check's dry run. With --time on a GPU, forward and backward of a packed
/// pass's norm (16,384 tokens of 4,096, bf16) both ways.
void normCases(const std::string &device, bool time, int &passed, int &failed) {
  c10::InferenceMode autograd(false);
  if (!kAtenRmsNorm)
    std::printf("RMSNorm: this build's LibTorch (%s) has no at::rms_norm: the chain against "
                "itself (the check's dry run)\n",
                TORCH_VERSION);
  struct NormCase {
    const char *name;
    std::vector<int64_t> shape;
    at::ScalarType dtype;
  };
  const double eps = 1e-6;
  for (const NormCase &c :
       {NormCase{"qwen2.5-0.5b width, f32", {7, 896}, at::kFloat},
        NormCase{"qwen2.5-0.5b width, bf16", {7, 896}, at::kBFloat16},
        NormCase{"llama3-8b width, bf16", {64, 4096}, at::kBFloat16},
        NormCase{"qwen3 heads (per-head norm), bf16", {3, 5, 16, 128}, at::kBFloat16},
        NormCase{"odd width 1003, bf16", {9, 1003}, at::kBFloat16},
        NormCase{"llama3-8b width, f16", {64, 4096}, at::kHalf}}) {
    if (c.dtype == at::kHalf && device == "cpu") { // (no f16 arithmetic in Debian's LibTorch)
      std::printf("skipped: RMSNorm, %s: f16 on a GPU only\n", c.name);
      continue;
    }
    at::manual_seed(11);
    // Rows of different scales, as a residual stream's.
    std::vector<int64_t> perRow(c.shape.size(), 1);
    perRow[0] = c.shape.front();
    const at::Tensor x0 = (at::randn(c.shape, onEngine(at::kFloat)) *
                           at::exp(at::randn(perRow, onEngine(at::kFloat))))
                              .to(c.dtype);
    const at::Tensor w0 =
        (1 + 0.1 * at::randn({c.shape.back()}, onEngine(at::kFloat))).to(c.dtype);
    const at::Tensor g = at::randn(c.shape, onEngine(at::kFloat)).to(c.dtype);
    auto run = [&](bool model) {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor y = model ? rmsNorm(x, w, eps) : rmsNormChain(x, w, eps);
      (y.to(at::kFloat) * g.to(at::kFloat)).sum().backward();
      return std::vector<at::Tensor>{y.detach(), x.grad(), w.grad()};
    };
    const std::vector<at::Tensor> got = run(true), want = run(false);
    // Forward: f32 against the largest value. 16-bit: the share of outputs
    // not bit for bit the chain's (at most 1e-3, f16 4e-3: where the float32
    // statistics differ in their last bit, a normalised value next to a
    // rounding boundary rounds the other way), and the largest difference
    // in units of the last place of the chain's value (2^(e - 7) for bf16,
    // 2^(e - 10) for f16, |value| in [2^e, 2^(e+1)); at most 2: the
    // weight's product rounds again).
    const at::Tensor yw = want[0].to(at::kDouble);
    double eY = 0, tolY = 1e-6, unequalShare = 0, wrongShare = 1;
    auto unequal = [&](const at::Tensor &y) {
      return y.to(at::kDouble).ne(yw).to(at::kDouble).mean().item<double>();
    };
    if (c.dtype == at::kFloat) {
      eY = (got[0].to(at::kDouble) - yw).abs().max().item<double>() / yw.abs().max().item<double>();
    } else {
      tolY = 2.0;
      const double bits = c.dtype == at::kBFloat16 ? 7 : 10;
      const at::Tensor unit = at::exp2(at::floor(at::log2(yw.abs().clamp_min(1e-30))) - bits);
      eY = ((got[0].to(at::kDouble) - yw).abs() / unit).max().item<double>();
      unequalShare = unequal(got[0]);
      // The check must tell apart the weight applied before the rounding
      // (what the fused kernel does given the weight): it rounds once where
      // the chain rounds twice.
      const at::Tensor f = x0.to(at::kFloat);
      wrongShare = unequal(
          (f * at::rsqrt(f.pow(2).mean({-1}, /*keepdim=*/true) + eps) * w0.to(at::kFloat))
              .to(c.dtype));
    }
    // (f16 keeps three more bits than bf16: a boundary within the same
    // float32 distance is eight times as likely.)
    const double tolShare = c.dtype == at::kHalf ? 4e-3 : 1e-3;
    const double tolG = c.dtype == at::kFloat ? 1e-5 : c.dtype == at::kBFloat16 ? 2e-2 : 4e-3;
    auto rel = [](const at::Tensor &a, const at::Tensor &b) {
      const at::Tensor bd = b.to(at::kDouble);
      return (a.to(at::kDouble) - bd).abs().max().item<double>() / bd.abs().max().item<double>();
    };
    const double eX = rel(got[1], want[1]), eW = rel(got[2], want[2]);
    const bool sameType = got[0].scalar_type() == c.dtype;
    const bool ok = sameType && eY <= tolY && unequalShare <= tolShare && wrongShare > tolShare &&
                    eX <= tolG && eW <= tolG;
    (ok ? passed : failed)++;
    char share[160] = "";
    if (c.dtype != at::kFloat)
      std::snprintf(share, sizeof share,
                    ", %.1e of the outputs not the chain's bit for bit (tolerance %.0e; the "
                    "weight before the rounding: %.2f)",
                    unequalShare, tolShare, wrongShare);
    std::printf("%s: RMSNorm, %s: %s: output %.2g %s (tolerance %g)%s, input gradient %.1e, "
                "weight gradient %.1e (tolerance %.0e)%s%s\n",
                ok ? "passed" : "FAILED", c.name,
                kAtenRmsNorm ? "at::rms_norm then the weight" : "the chain", eY,
                c.dtype == at::kFloat ? "of the largest" : "units in the last place", tolY, share,
                eX, eW, tolG, sameType ? "" : "; the output is not in the input's type",
                wrongShare > tolShare ? "" : "; the check cannot tell the weight's place");
  }
  if (!time || device != "cuda")
    return;
  // A packed pass's norm: 16,384 tokens of Llama-3-8B's width, bf16,
  // forward and backward, each way.
  at::manual_seed(12);
  const at::Tensor x0 = at::randn({16384, 4096}, onEngine(at::kBFloat16));
  const at::Tensor w0 = at::ones({4096}, onEngine(at::kBFloat16));
  const at::Tensor g = at::randn({16384, 4096}, onEngine(at::kBFloat16));
  double ms[2] = {0, 0};
  for (int m = 0; m < 2; ++m) {
    auto once = [&] {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      at::Tensor y = m == 1 ? rmsNorm(x, w, eps) : rmsNormChain(x, w, eps);
      y.backward(g);
      return x.grad();
    };
    ms[m] = msPerCall(once, 20);
  }
  std::printf("time: RMSNorm forward and backward, 16384 x 4096 bf16: the model's %.3f ms "
              "(%s), the chain %.3f ms (%.2fx the model's)\n",
              ms[1], kAtenRmsNorm ? "at::rms_norm" : "the chain", ms[0], ms[0] / ms[1]);
}

} // namespace

int main(int argc, char **argv) {
  try {
    std::string device = "cpu";
    std::string which = "all";
    bool time = false;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--device" && i + 1 < argc)
        device = argv[++i];
      else if (arg == "--cases" && i + 1 < argc)
        which = argv[++i];
      else if (arg == "--time")
        time = true;
      else if (arg == "--help" || arg == "-h") {
        std::printf("usage: hflow-gpu-kernels [--device cpu|cuda] "
                    "[--cases paged|packed|optim|norm|all] [--time]\n"
                    "  paged: the paged decode kernel against the ATen path and a float64 "
                    "brute force;\n"
                    "  packed: the packed passes' attention (flash varlen on cuda in 16-bit),\n"
                    "  forward and gradients, against a float64 brute force;\n"
                    "  optim: the fused AdamW (HFLOW_FUSED_OPTIMIZER) against the "
                    "per-operation update;\n"
                    "  norm: the models' RMSNorm (LibTorch's at::rms_norm where it has one)\n"
                    "  against transformers' operation-by-operation chain;\n"
                    "  all (the default): every set;\n"
                    "  --time: each path timed at the benchmarks' shapes (cuda)\n");
        return 0;
      } else
        throw std::invalid_argument("unknown argument '" + arg + "' (--help)");
    }
    if (device != "cpu" && device != "cuda")
      throw std::invalid_argument("--device is cpu or cuda, not '" + device + "'");
    if (which != "paged" && which != "packed" && which != "optim" && which != "norm" &&
        which != "all")
      throw std::invalid_argument("--cases is paged, packed, optim, norm or all, not '" + which +
                                  "'");
    // attendInPlace's gate, read once: set before the first step.
    setenv("HFLOW_ATTENTION", "paged", 1);
    if (device == "cuda") {
      hflow::comm::bindCudaDevice(0);
      setEngineDevice(c10::Device(c10::kCUDA, 0));
    }
    c10::InferenceMode guard;
    int passed = 0, failed = 0;
    if (which == "packed" || which == "optim" || which == "norm") {
      // One set alone: none needs the paged kernel.
      const bool packed = which == "packed", optim = which == "optim";
      std::printf("hflow-gpu-kernels: %s, %s\n", device.c_str(),
                  packed  ? "the packed passes' attention against a brute force"
                  : optim ? "the fused AdamW against the per-operation update"
                          : "the models' RMSNorm against transformers' chain");
      (packed ? packedCases : optim ? optimCases : normCases)(device, time, passed, failed);
      std::printf("%d passed, %d failed\n", passed, failed);
      return failed == 0 ? 0 : 1;
    }
    const bool kernel = device == "cuda" && pagedDecodeBuilt();
    if (device == "cuda" && !kernel) {
      // A GPU build without the kernel (nvcc missing or its build left
      // out): nothing here checks the kernel, which is a failure.
      std::printf("hflow-gpu-kernels: cuda, but this build has no paged decode kernel "
                  "(HFLOW_CUDA_KERNELS off, or no usable nvcc at configuration)\n"
                  "0 passed, 1 failed\n");
      return 1;
    }
    std::printf("hflow-gpu-kernels: %s, %s\n", device.c_str(),
                kernel ? "the paged decode kernel and its reference against the ATen path "
                         "and a brute force"
                       : "no kernel here: the paged path's reference and the ATen path "
                         "against a brute force");
    const Case cases[] = {
        {"llama3-8b heads, f32", 5, 32, 8, 128, 16, 300, 0, at::kFloat},
        {"qwen2.5-0.5b heads, f32", 4, 14, 2, 64, 16, 77, 0, at::kFloat},
        {"one kv head a query head, hd 32, f32", 3, 4, 4, 32, 8, 40, 0, at::kFloat},
        {"8 query heads a kv head, hd 256, f32", 2, 16, 2, 256, 16, 50, 0, at::kFloat},
        {"sliding window 20, f32", 4, 8, 2, 64, 16, 90, 20, at::kFloat},
        {"one key, f32", 2, 4, 2, 64, 16, 1, 0, at::kFloat},
        {"llama3-8b heads, bf16", 5, 32, 8, 128, 16, 300, 0, at::kBFloat16},
        {"qwen2.5-0.5b heads, bf16", 4, 14, 2, 64, 16, 77, 0, at::kBFloat16},
        {"8 query heads a kv head, hd 256, bf16", 2, 16, 2, 256, 16, 50, 0, at::kBFloat16},
        {"qwen2.5-7b heads, bf16", 3, 28, 4, 128, 16, 200, 0, at::kBFloat16},
        {"window 33, f16", 3, 12, 2, 128, 32, 120, 33, at::kHalf},
        {"hd 32, f16", 3, 4, 4, 32, 8, 40, 0, at::kHalf},
        // A batch as wide as the benchmark's, groups of 3 and 5, and the
        // widths and types the cases above leave out.
        {"256 rows, qwen2.5-0.5b heads, bf16", 256, 14, 2, 64, 16, 200, 0, at::kBFloat16},
        {"5 query heads a kv head, f32", 3, 10, 2, 64, 16, 70, 0, at::kFloat},
        {"3 query heads a kv head, window 9, f32", 4, 6, 2, 128, 16, 60, 9, at::kFloat},
        {"hd 32, bf16", 3, 4, 4, 32, 8, 40, 0, at::kBFloat16},
        {"hd 64, f16", 3, 8, 2, 64, 16, 50, 0, at::kHalf},
        {"8 query heads a kv head, hd 256, f16", 2, 16, 2, 256, 16, 50, 0, at::kHalf},
    };
    uint64_t seed = 1;
    for (int windowed = 0; windowed < 2; ++windowed)
    for (const Case &c : cases) {
      ++seed;
      const std::string name = std::string(c.name) + (windowed ? ", a decode window's step" : "");
      if (c.dtype == at::kHalf && device == "cpu") {
        std::printf("skipped: %s: no f16 matmul on this CPU's LibTorch\n", name.c_str());
        continue;
      }
      Setup s = makeSetup(c, seed, /*full=*/false, /*least=*/windowed ? 3 : 1);
      PagedKvStep step = windowed ? windowStepOf(s) : stepOf(s);
      const double scale = 1.0 / std::sqrt((double)c.hd);
      const double tol = c.dtype == at::kFloat ? 1e-5 : 3e-2;
      const at::Tensor want = bruteForce(s, c, scale);
      at::Tensor aten = atenPath(step, s, c, scale);
      const double eAten = relErr(aten, want);
      // The new slots poisoned: the paged path must store them itself.
      const at::Tensor slots = newSlots(s, c).to(s.pool->keys(0).device());
      s.pool->keys(0).index_fill_(0, slots, NAN);
      s.pool->values(0).index_fill_(0, slots, NAN);
      at::Tensor out = step.attendInPlace(0, s.q, s.k, s.v, scale, c.window);
      if (!out.defined())
        throw std::runtime_error(name + ": the paged path did not take the step");
      const double ePaged = relErr(out, want);
      // On a GPU the reference too, on the pool the kernel's step filled.
      double eRef = ePaged;
      if (kernel)
        eRef = relErr(referenceOf(s, c, scale), want);
      const bool ok = eAten <= tol && ePaged <= tol && eRef <= tol;
      (ok ? passed : failed)++;
      if (kernel)
        std::printf("%s: %s: kernel %.2e, reference %.2e, ATen %.2e of the largest output "
                    "(tolerance %.0e)\n",
                    ok ? "passed" : "FAILED", name.c_str(), ePaged, eRef, eAten, tol);
      else
        std::printf("%s: %s: reference %.2e, ATen %.2e of the largest output (tolerance %.0e)\n",
                    ok ? "passed" : "FAILED", name.c_str(), ePaged, eAten, tol);
    }
    if (time && kernel) {
      const Case shapes[] = {{"llama3-8b, 256 rows x 768 keys, bf16", 256, 32, 8, 128, 16, 768, 0,
                              at::kBFloat16},
                             {"qwen2.5-0.5b, 256 rows x 768 keys, bf16", 256, 14, 2, 64, 16, 768,
                              0, at::kBFloat16}};
      for (Case c : shapes) {
        Setup s = makeSetup(c, 99, /*full=*/true); // every row at 768, blocks its own
        PagedKvStep step = stepOf(s);
        const double scale = 1.0 / std::sqrt((double)c.hd);
        const double kv = 2.0 * c.B * c.maxLen * c.nkv * c.hd * 2; // bytes of bf16 K and V
        const double tk = msPerCall(
            [&] { return step.attendInPlace(0, s.q, s.k, s.v, scale, 0); }, 50);
        const double ta = msPerCall([&] { return atenPath(step, s, c, scale); }, 50);
        std::printf("time: %s: kernel %.3f ms (%.0f GB/s of K and V), ATen path %.3f ms "
                    "(%.2fx the kernel)\n",
                    c.name, tk, kv / tk / 1e6, ta, ta / tk);
      }
    }
    if (which == "all") {
      packedCases(device, time, passed, failed);
      optimCases(device, time, passed, failed);
      normCases(device, time, passed, failed);
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "hflow-gpu-kernels: %s\n", e.what());
    return 2;
  }
}
