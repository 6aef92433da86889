//===- MemoryMeterTest.cpp - the counting CPU allocator and the KV cache --===//
#include "runtime/models/Llama.h"
#include "runtime/models/MemoryMeter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace {

using hflow::models::Generation;
using hflow::models::Llama;
using hflow::models::LlamaConfig;
using hflow::models::MemoryMeter;
using hflow::models::PeakScope;
using hflow::models::SamplingOptions;

TEST(MemoryMeter, CountsEveryCpuTensorUntilFreed) {
  MemoryMeter::install();
  MemoryMeter::install(); // once
  ASSERT_TRUE(MemoryMeter::installed());
  const int64_t before = MemoryMeter::live();
  {
    at::Tensor a = at::empty({1000}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor b = at::zeros({10, 10}, at::TensorOptions().dtype(at::kDouble));
    EXPECT_EQ(MemoryMeter::live() - before, 4000 + 800);
    at::Tensor view = a.narrow(0, 10, 10); // no storage of its own
    EXPECT_EQ(MemoryMeter::live() - before, 4800);
  }
  EXPECT_EQ(MemoryMeter::live(), before);
  // Raw allocations (a context equal to the data pointer) work and count.
  c10::Allocator *alloc = c10::GetCPUAllocator();
  void *raw = alloc->raw_allocate(256);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(MemoryMeter::live() - before, 256);
  alloc->raw_deallocate(raw);
  EXPECT_EQ(MemoryMeter::live(), before);
}

TEST(MemoryMeter, PeakScopeMeasuresWhatAPassNeededOnTop) {
  MemoryMeter::install();
  at::Tensor kept = at::ones({100}, at::TensorOptions().dtype(at::kFloat));
  PeakScope scope;
  {
    at::Tensor t1 = at::empty({500}, at::TensorOptions().dtype(at::kFloat)); // 2000 B
    at::Tensor t2 = at::empty({250}, at::TensorOptions().dtype(at::kFloat)); // 1000 B
  }
  at::Tensor t3 = at::empty({100}, at::TensorOptions().dtype(at::kFloat)); // 400 B
  EXPECT_EQ(scope.rise(), 3000);
  PeakScope again; // a new high-water mark starts at what is live
  EXPECT_EQ(again.rise(), 0);
}

LlamaConfig small() {
  LlamaConfig c;
  c.name = "small";
  c.layers = 3, c.hidden = 32, c.heads = 4, c.kvHeads = 2, c.ffn = 64, c.vocab = 50;
  return c;
}

// The cache holds every layer's keys and values of each row's prompt and of
// every token but the last (which is sampled, never fed back): 2 L B kv
// (P + R - 1) hd float32 bytes, and under a token budget the largest batch
// of rows it keeps at once.
TEST(MemoryMeter, GenerationReportsItsKVCacheBytes) {
  const LlamaConfig c = small();
  Llama m(c, 3);
  const int64_t B = 6, P = 5, R = 7, hd = c.hidden / c.heads;
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor prompts = at::randint(1, c.vocab, {B, P}, g, at::TensorOptions().dtype(at::kLong));
  SamplingOptions o;
  o.maxTokens = (int)R;
  o.stopToken = -1; // every row runs R steps
  Generation out = m.generate(prompts, at::Tensor(), o, g);
  EXPECT_EQ(out.kvCacheBytes, 2 * c.layers * B * c.kvHeads * (P + R - 1) * hd * 4);
  o.maxBatchTokens = 2 * (P + R); // two rows at a time
  out = m.generate(prompts, at::Tensor(), o, g);
  EXPECT_EQ(out.kvCacheBytes, 2 * c.layers * 2 * c.kvHeads * (P + R - 1) * hd * 4);
  o.maxBatchTokens = 0;
  o.maxTokens = 0;
  EXPECT_EQ(m.generate(prompts, at::Tensor(), o, g).kvCacheBytes, 0);
}

} // namespace
