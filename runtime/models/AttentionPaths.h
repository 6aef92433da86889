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

namespace hflow::models {

/// Whether HFLOW_ATTENTION names `path` ("paged" or "sdpa"). Read once.
bool attentionPathRequested(const std::string &path);
/// Throws std::invalid_argument, naming it, for an HFLOW_ATTENTION that is
/// not such a set (hflow-run checks it before any work).
void checkAttentionEnvironment();

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_ATTENTIONPATHS_H
