//===- Attention.cpp - attention over keys and values, and its masks ------===//
//
// The attention every form of the model runs (Layers.h): the dense and
// blocked forms, the grouped-query form generation uses, LibTorch's fused
// kernel where it is asked for, and the additive masks (causal, window,
// padded keys).
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Layers.h"
#include "runtime/models/AttentionPaths.h"
#include "runtime/models/Packing.h"
#include "runtime/models/Safetensors.h"

#include "runtime/schema/ActivationModel.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::models {

namespace {
at::Tensor attendDense(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                       const at::Tensor &bias, double scale) {
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * scale;
  att = at::softmax(att.to(at::kFloat) + bias, -1).to(q.scalar_type());
  return at::matmul(att, v);
}
/// Queries per block of a long sequence's attention, and the length from
/// which it is cut into blocks (the activation model counts the same).
constexpr int64_t kQueryBlock = shape::kAttentionQueryBlock,
                  kBlockedFrom = shape::kAttentionBlockedFrom;
/// Queries per block while building a mask (its comparisons' temporaries
/// are [block, K] bools).
constexpr int64_t kMaskQueryBlock = 256;
} // namespace

namespace {
/// A ScopedAttentionPaths' paths, while one lives.
const std::vector<std::string> *overridden = nullptr;

/// The paths a set names (HFLOW_ATTENTION's form), or why it is not a set
/// of them.
std::vector<std::string> parsePaths(const std::string &all, std::string &why) {
  std::vector<std::string> paths;
  if (all.empty())
    return paths;
  size_t at = 0;
  while (at <= all.size()) {
    const size_t comma = std::min(all.find(',', at), all.size());
    const std::string p = all.substr(at, comma - at);
    if (p != "dense" && p != "paged" && p != "sdpa") {
      why = "HFLOW_ATTENTION='" + all + "': '" + p +
            "' is not an attention path (dense, paged or sdpa; several with commas, as "
            "sdpa,paged)";
      return {};
    }
    paths.push_back(p);
    at = comma + 1;
  }
  return paths;
}

/// HFLOW_ATTENTION's paths, or why it is not a set of them.
std::vector<std::string> attentionPaths(std::string &why) {
  const char *e = std::getenv("HFLOW_ATTENTION");
  return parsePaths(e ? e : "", why);
}

bool named(const std::vector<std::string> &paths, const std::string &path) {
  return std::find(paths.begin(), paths.end(), path) != paths.end();
}
} // namespace

bool attentionPathRequested(const std::string &path) {
  if (overridden)
    return named(*overridden, path);
  static const std::vector<std::string> paths = [] {
    std::string why;
    return attentionPaths(why);
  }();
  return named(paths, path);
}

ScopedAttentionPaths::ScopedAttentionPaths(const std::string &paths)
    : previous_(overridden) {
  std::string why;
  paths_ = parsePaths(paths, why);
  if (!why.empty())
    throw std::invalid_argument(why);
  overridden = &paths_;
}

ScopedAttentionPaths::~ScopedAttentionPaths() { overridden = previous_; }

void checkAttentionEnvironment() {
  std::string why;
  attentionPaths(why);
  if (!why.empty())
    throw std::invalid_argument(why);
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define HFLOW_HAVE_SDPA 1 // at::scaled_dot_product_attention with its scale argument
/// HFLOW_ATTENTION=sdpa: attend() on a GPU through LibTorch's fused kernel.
static bool fusedAttention() { return attentionPathRequested("sdpa"); }
#endif

bool fusedAttentionOn(const at::Tensor &like) {
#ifdef HFLOW_HAVE_SDPA
  return like.is_cuda() && fusedAttention();
#else
  (void)like;
  return false;
#endif
}

at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const at::Tensor &bias, double scale) {
#ifdef HFLOW_HAVE_SDPA
  // LibTorch's fused attention on a GPU (its memory-efficient kernel takes
  // the additive mask; the scores never reach memory). Opt-in until a lent
  // GPU has checked it against the CPU (tools/hflow-dev gpu-test) and timed
  // it (bench/gpu_bench.sh runs the rollout both ways).
  if (q.is_cuda() && fusedAttention())
    return at::scaled_dot_product_attention(q, k, v, bias.to(q.scalar_type()), 0.0,
                                            /*is_causal=*/false, scale);
#endif
  const int64_t T = q.size(2);
  if (T < kBlockedFrom || k.size(2) != T)
    return attendDense(q, k, v, bias, scale);
  // A long sequence attending to itself (a training pass, a prefill): the
  // queries in blocks, each over the keys up to its last query only (the
  // mask is causal: later keys are -inf for every query of the block). Half
  // the products and softmax of the dense form, and blocks of scores small
  // enough for the heap to reuse (the dense [B, n, T, T] scores of a
  // 1,500-token row are 36 MB, mapped and faulted in afresh every pass).
  // Short sequences, every test's and the demo's, keep the dense form.
  // Keys and values contiguous once: a strided k or v (the heads a
  // transposed view of [B, T, heads, hd], as the projections leave them
  // without GQA's repeat) would make each block's product copy its narrowed
  // keys again, and autograd keep every copy (w hd T^2 / 256 a row and head
  // more, a third of a bf16 layer's scores). Narrowed along T, the
  // contiguous ones fold into the batched product as views. The values are
  // the same, and so is every product.
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  std::vector<at::Tensor> out;
  for (int64_t a = 0; a < T; a += kQueryBlock) {
    const int64_t n = std::min(kQueryBlock, T - a), keys = a + n;
    out.push_back(attendDense(q.narrow(2, a, n), kc.narrow(2, 0, keys), vc.narrow(2, 0, keys),
                              bias.narrow(2, a, n).narrow(3, 0, keys), scale));
  }
  return at::cat(out, 2);
}

at::Tensor attendGrouped(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const at::Tensor &bias, double scale) {
  const int64_t B = q.size(0), nq = q.size(1), T = q.size(2), hd = q.size(3);
  const int64_t nkv = k.size(1), K = k.size(2), vd = v.size(3);
  if (nkv <= 0 || nq % nkv != 0 || v.size(1) != nkv)
    throw std::invalid_argument("attendGrouped: " + std::to_string(nq) + " query heads over " +
                                std::to_string(nkv) + " key and " + std::to_string(v.size(1)) +
                                " value heads");
  const int64_t g = nq / nkv;
  if (g == 1)
    return attend(q, k, v, bias, scale);
#ifdef HFLOW_HAVE_SDPA
  if (q.is_cuda() && fusedAttention()) {
    // One kv head (latent attention's one latent key): a view for every
    // query head; more: repeated as the training forward does.
    if (nkv == 1)
      return attend(q, k.expand({B, nq, K, hd}), v.expand({B, nq, K, vd}), bias, scale);
    return attend(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), bias, scale);
  }
#endif
  // Query head kv * g + j is row j of kv head kv's group: [B, nkv, g, T, hd].
  const at::Tensor q5 = q.reshape({B, nkv, g, T, hd});
  const at::Tensor b5 = bias.unsqueeze(1); // [B, 1, 1, T, K]
  auto part = [&](const at::Tensor &qb, const at::Tensor &kb, const at::Tensor &vb,
                  const at::Tensor &bb) { // qb [B, nkv, g, n, hd] -> [B, nkv, g, n, vd]
    const int64_t n = qb.size(3), keys = kb.size(2);
    at::Tensor att = at::matmul(qb.reshape({B, nkv, g * n, hd}), kb.transpose(-2, -1)) * scale;
    att = at::softmax(att.view({B, nkv, g, n, keys}).to(at::kFloat) + bb, -1)
              .to(q.scalar_type());
    return at::matmul(att.view({B, nkv, g * n, keys}), vb).view({B, nkv, g, n, vd});
  };
  at::Tensor o;
  if (T < kBlockedFrom || K != T) {
    o = part(q5, k, v, b5);
  } else {
    // The queries in blocks as attend() does, each over its keys up to its
    // last query (contiguous keys narrow into views).
    const at::Tensor kc = k.contiguous(), vc = v.contiguous();
    std::vector<at::Tensor> out;
    for (int64_t a = 0; a < T; a += kQueryBlock) {
      const int64_t n = std::min(kQueryBlock, T - a), keys = a + n;
      out.push_back(part(q5.narrow(3, a, n), kc.narrow(2, 0, keys), vc.narrow(2, 0, keys),
                         b5.narrow(3, a, n).narrow(4, 0, keys)));
    }
    o = at::cat(out, 3);
  }
  return o.reshape({B, nq, T, vd});
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
// at::_flash_attention_forward with its scale and sliding-window arguments
// (its autograd formula is LibTorch's: derivatives.yaml's
// _flash_attention_backward).
#define HFLOW_HAVE_VARLEN_FLASH 1
#endif

namespace {
std::atomic<int64_t> flashAttends{0};
} // namespace

int64_t packedFlashAttends() { return flashAttends.load(); }

bool packedFlashFor(const at::Tensor &q) {
#ifdef HFLOW_HAVE_VARLEN_FLASH
  const auto t = q.scalar_type();
  const int64_t hd = q.size(-1);
  return q.is_cuda() && (t == at::kBFloat16 || t == at::kHalf) && hd % 8 == 0 && hd <= 256;
#else
  (void)q;
  return false;
#endif
}

at::Tensor attendPacked(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                        const PackedRows &p, const std::map<int64_t, at::Tensor> &masks,
                        double scale, int64_t window) {
  const int64_t nq = q.size(1), N = q.size(2), nkv = k.size(1), vd = v.size(3);
  if (q.size(0) != 1 || k.size(0) != 1 || v.size(0) != 1 || N != p.N || k.size(2) != N ||
      v.size(2) != N || nkv <= 0 || nq % nkv != 0 || v.size(1) != nkv)
    throw std::invalid_argument("attendPacked: queries " + shapeString(q.sizes()) + ", keys " +
                                shapeString(k.sizes()) + ", values " + shapeString(v.sizes()) +
                                " for a packing of " + std::to_string(p.N) + " tokens");
#ifdef HFLOW_HAVE_VARLEN_FLASH
  if (packedFlashFor(q) && vd == q.size(3)) {
    // The flash kernel's varlen layout: [N, heads, width], the segments
    // given by their cumulative lengths; grouped-query heads as they are.
    ++flashAttends;
    const at::Tensor qf = q.select(0, 0).transpose(0, 1).contiguous();
    const at::Tensor kf = k.select(0, 0).transpose(0, 1).contiguous();
    const at::Tensor vf = v.select(0, 0).transpose(0, 1).contiguous();
    std::optional<int64_t> left, right;
    if (window > 0) // a key j is seen from i when i - j < window
      left = window - 1, right = 0;
    at::Tensor o = std::get<0>(at::_flash_attention_forward(
        qf, kf, vf, p.cuSeq, p.cuSeq, p.maxLen, p.maxLen, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false, scale, left, right));
    return o.transpose(0, 1).unsqueeze(0); // [1, nq, N, vd]
  }
#endif
  // Each segment over its own keys, under its length's causal mask
  // (packedMasks', else made here: a caller that expected the flash kernel
  // for another tensor than q passes none).
  std::vector<at::Tensor> out;
  out.reserve(p.starts.size());
  std::map<int64_t, at::Tensor> made;
  for (size_t s = 0; s + 1 < p.starts.size(); ++s) {
    const int64_t a = p.starts[s], len = p.starts[s + 1] - a;
    auto m = masks.find(len);
    if (m == masks.end()) {
      m = made.find(len);
      if (m == made.end())
        m = made.emplace(len, attentionBias(at::ones({1, len}, q.options().dtype(at::kBool)), 0,
                                            len, window))
                .first;
    }
    out.push_back(attendGrouped(q.narrow(2, a, len), k.narrow(2, a, len), v.narrow(2, a, len),
                                m->second, scale));
  }
  if (out.empty())
    return at::zeros({1, nq, 0, vd}, q.options());
  return out.size() == 1 ? out[0] : at::cat(out, 2);
}

at::Tensor attentionBias(const at::Tensor &keyReal, int64_t past, int64_t T, int64_t window) {
  return attentionMask(at::arange(past, past + T, keyReal.options().dtype(at::kLong)), keyReal,
                       window);
}

at::Tensor attentionMask(const at::Tensor &queryPos, const at::Tensor &keyReal, int64_t window) {
  const int64_t B = keyReal.size(0), K = keyReal.size(1), T = queryPos.size(0);
  const float inf = std::numeric_limits<float>::infinity();
  // 0 where allowed, -inf where not, a block of queries at a time: the
  // causal rule (and the window's), then the padded keys, then each query's
  // own position always. The same values as building the allowed [B, T, K]
  // at once, without its bool temporaries beside the mask (6 bytes an
  // element at the peak before, now the 4 the activation model counts).
  at::Tensor mask = at::zeros({B, 1, T, K}, keyReal.options().dtype(at::kFloat));
  at::Tensor kIdx = at::arange(K, keyReal.options().dtype(at::kLong)).view({1, K});
  const at::Tensor padded = keyReal.logical_not().view({B, 1, 1, K});
  for (int64_t q0 = 0; q0 < T; q0 += kMaskQueryBlock) {
    const int64_t n = std::min(kMaskQueryBlock, T - q0);
    at::Tensor q = queryPos.narrow(0, q0, n).view({n, 1});
    at::Tensor rows = mask.narrow(2, q0, n);
    rows.masked_fill_(kIdx.gt(q), -inf);
    if (window > 0)
      rows.masked_fill_(kIdx.le(q - window), -inf);
    rows.masked_fill_(padded, -inf);
    rows.masked_fill_(kIdx.eq(q), 0.0);
  }
  return mask;
}

} // namespace hflow::models
