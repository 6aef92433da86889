//===- AttentionPaths.h - the opt-in attention paths, from HFLOW_ATTENTION -===//
//
// HFLOW_ATTENTION is a comma-separated set of the attention paths a GPU
// may take beside the one hflow ships: "paged" (decode steps through the
// project's paged decode kernel, PagedKv.h) and "sdpa" (every attention
// through LibTorch's fused kernel, Layers.h's attend()); "dense", the
// default, names neither. So "sdpa,paged" takes both.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_ATTENTIONPATHS_H
#define HFLOW_RUNTIME_MODELS_ATTENTIONPATHS_H

#include <string>
#include <vector>

namespace hflow::models {

/// Whether HFLOW_ATTENTION names `path` ("paged" or "sdpa"). Read once.
bool attentionPathRequested(const std::string &path);
/// Throws std::invalid_argument, naming it, for an HFLOW_ATTENTION that is
/// not such a set (hflow-run checks it before any work).
void checkAttentionEnvironment();

/// Tests: while one lives, the paths it names (as HFLOW_ATTENTION would,
/// e.g. "paged") are the ones taken, in place of the environment's. Not for
/// use while another thread runs a forward.
class ScopedAttentionPaths {
public:
  explicit ScopedAttentionPaths(const std::string &paths);
  ~ScopedAttentionPaths();
  ScopedAttentionPaths(const ScopedAttentionPaths &) = delete;
  ScopedAttentionPaths &operator=(const ScopedAttentionPaths &) = delete;

private:
  const std::vector<std::string> *previous_;
  std::vector<std::string> paths_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_ATTENTIONPATHS_H
