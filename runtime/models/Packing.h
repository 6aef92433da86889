//===- Packing.h - a pass's rows packed into one sequence, no padding -------===//
//
// A training or scoring pass over B rows of T columns computes B x T
// positions, however many of them are padding. Packed, the pass computes
// only the rows' real tokens: they go one row after the other into a single
// sequence of N tokens ([1, N]), each keeps its own RoPE position, and
// attention runs within each row only (a row is a segment: its tokens see
// the earlier tokens of their own row, never another row's). On a GPU in
// 16-bit that attention is LibTorch's flash kernel on variable-length
// segments (at::_flash_attention_forward with the segments' cumulative
// lengths, LibTorch 2.5 or later); elsewhere each segment attends through
// attendGrouped() with its own causal mask. The final hidden states are put
// back in the rows' [B, T] layout (zeros at padding) for the pass's head.
//
// HFLOW_PACKED_PASSES=1 turns it on for the forms that can pack
// (CausalLM::packsRows: a whole, tensor-parallel or fully sharded dense
// model without latent attention, and no context parallelism). Off by
// default until a lent GPU has measured it: packing changes the shapes of
// every product, so its sums round in another order than the padded pass's
// (equal within 1e-5 in float32, PackingTest and packed-passes.test).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PACKING_H
#define HFLOW_RUNTIME_MODELS_PACKING_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace hflow::models {

/// Whether HFLOW_PACKED_PASSES asks for packed passes ("1"; unset or "0":
/// padded passes). Read once.
bool packedPassesRequested();
/// Throws std::invalid_argument, naming it, for an HFLOW_PACKED_PASSES
/// other than unset, "0" or "1" (hflow-run checks it before any work).
void checkPackingEnvironment();

/// Tests: while one lives, packed passes are on (or off) whatever the
/// environment says. Not for use while another thread runs a pass.
class ScopedPackedPasses {
public:
  explicit ScopedPackedPasses(bool on);
  ~ScopedPackedPasses();
  ScopedPackedPasses(const ScopedPackedPasses &) = delete;
  ScopedPackedPasses &operator=(const ScopedPackedPasses &) = delete;

private:
  int previous_;
};

/// Where a pass's real tokens go when packed.
struct PackedRows {
  int64_t B = 0, T = 0; ///< the rows and columns of the padded pass
  int64_t N = 0;        ///< real tokens: the packed sequence's length
  /// int64 [N]: each packed token's flat position b * T + t, row after row.
  at::Tensor index;
  /// int64 [B * T]: 1 + the packed slot of each position, 0 at padding.
  at::Tensor unpackIndex;
  /// Each row with a real token is a segment: starts[s] its first packed
  /// slot, starts[S] = N.
  std::vector<int64_t> starts;
  /// int32 [S + 1] on the rows' device: `starts` (the flash kernel's
  /// cumulative sequence lengths).
  at::Tensor cuSeq;
  int64_t maxLen = 0; ///< the longest segment
  /// Every row's real tokens stand in adjacent columns (left-padded
  /// prompt, response right after it): a sliding window then counts the
  /// same keys packed as padded.
  bool contiguous = true;
};

/// The packing of rows whose real tokens `keyMask` [B, T] marks (any
/// dtype, nonzero = real). Reads the rows' lengths on the host once.
PackedRows packRows(const at::Tensor &keyMask);
/// `x` [B, T, ...] to its real positions, [1, N, ...].
at::Tensor packTokens(const at::Tensor &x, const PackedRows &p);
/// Packed `x` [1, N, ...] back to [B, T, ...], zeros at padding.
/// Differentiable.
at::Tensor unpackRows(const at::Tensor &x, const PackedRows &p);

/// The positions a pass's head reads. Under packed passes (`on`: the
/// caller's form packs and HFLOW_PACKED_PASSES=1) the head's logits are
/// taken only where `mask` [b, r] is nonzero (the response tokens a loss
/// or a stored log-prob reads; its other positions are zeroed by the same
/// mask wherever they are used): in() takes the hidden states (or the
/// tokens) there, [1, n, ...], and out() puts the head's per-token result
/// back, [b, r] with zeros elsewhere. Off, or with every position read or
/// none, both return their argument.
class HeadPositions {
public:
  HeadPositions(bool on, const at::Tensor &mask);
  bool sparse() const { return rows_ != nullptr; }
  /// x [b, r, ...] at the read positions, [1, n, ...].
  at::Tensor in(const at::Tensor &x) const;
  /// x [1, n, ...] back to [b, r, ...], zeros elsewhere. Differentiable.
  at::Tensor out(const at::Tensor &x) const;

private:
  std::shared_ptr<const PackedRows> rows_;
};

/// While one lives on this thread, a forward over [1, N] tokens (N the
/// packing's) reads them as the packing's segments (detail::attnContext).
/// Scopes nest.
class PackedRowsScope {
public:
  explicit PackedRowsScope(std::shared_ptr<const PackedRows> rows);
  ~PackedRowsScope();
  PackedRowsScope(const PackedRowsScope &) = delete;
  PackedRowsScope &operator=(const PackedRowsScope &) = delete;
  /// The innermost live scope's packing, or null.
  static const std::shared_ptr<const PackedRows> &current();

private:
  std::shared_ptr<const PackedRows> previous_;
};

/// The causal masks a packing's segments attend under on the ATen path:
/// one [1, 1, L, L] float32 mask per distinct segment length L
/// (attentionBias's rule, sliding `window`), on `like`'s device. Empty on
/// a GPU whose flash kernel takes the packing (packedFlashFor).
std::map<int64_t, at::Tensor> packedMasks(const PackedRows &p, int64_t window,
                                          const at::Tensor &like);
/// Whether attendPacked takes LibTorch's flash kernel for queries like
/// `q` (CUDA, bf16 or f16, head width a multiple of 8 up to 256, LibTorch
/// 2.5 or later).
bool packedFlashFor(const at::Tensor &q);
/// Attention within each segment of a packing: q [1, nq, N, hd] over
/// k [1, nkv, N, hd] and v [1, nkv, N, vd] (nq a multiple of nkv, grouped
/// as repeat_interleave maps them), each token over its own row's tokens
/// at or before it (and within `window` of it when > 0). `masks`:
/// packedMasks' (unused on the flash path). Returns [1, nq, N, vd].
/// Differentiable.
at::Tensor attendPacked(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                        const PackedRows &p, const std::map<int64_t, at::Tensor> &masks,
                        double scale, int64_t window);
/// How many attendPacked calls took the flash kernel in this process.
int64_t packedFlashAttends();

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_PACKING_H
