//===- Defaults.h - the defaults the compiler plans with and the runtime runs -===//
//
// A value a program leaves out is decided once, here: the compiler's memory
// and time models plan with it and the emitter writes it into the plan, so
// the runtime executes exactly what was planned (it never picks a default of
// its own).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_DEFAULTS_H
#define HFLOW_RUNTIME_SCHEMA_DEFAULTS_H

#include <cstdint>

namespace hflow::defaults {

/// Tokens a generate call samples per response when it names no
/// max_tokens (vLLM's SamplingParams default, too).
inline constexpr int64_t kMaxTokens = 16;
/// Tokens of the longest prompt a train block accepts when it names no
/// prompt_len: longer prompts are refused before any work.
inline constexpr int64_t kPromptLen = 512;
/// A plan without a train block runs its flow once on this many synthetic
/// prompts of kSyntheticPromptLen random tokens each (one response per
/// prompt); the memory check and the placement search size it so.
inline constexpr int64_t kSyntheticPrompts = 8;
inline constexpr int64_t kSyntheticPromptLen = 8;

} // namespace hflow::defaults

#endif // HFLOW_RUNTIME_SCHEMA_DEFAULTS_H
