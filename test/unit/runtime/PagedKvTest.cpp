//===- PagedKvTest.cpp - the KV block pool and a step through its tables ---===//
#include "runtime/models/AttentionPaths.h"
#include "runtime/models/Layers.h"
#include "runtime/models/PagedKv.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hflow::models;

TEST(PagedKv, PoolCountsReferencesAndCopiesOnWrite) {
  KvGeometry g{2, 2, 8, at::kFloat};
  EXPECT_EQ(g.bytesPerBlock(4), 2 * 2 * 4 * 2 * 8 * 4);
  KvBlockPool pool(g, 3, 4);
  EXPECT_EQ(pool.bytes(), 3 * g.bytesPerBlock(4));
  int a = pool.allocate(), b = pool.allocate();
  EXPECT_EQ(pool.freeBlocks(), 1);
  pool.keys(1).narrow(0, a * 4, 4).fill_(7);
  pool.copyBlock(a, b);
  EXPECT_EQ(pool.keys(1).narrow(0, b * 4, 4).sum().item<float>(), 7.f * 4 * 2 * 8);
  pool.retain(a);
  pool.release(a);
  EXPECT_EQ(pool.refs(a), 1);
  pool.release(a);
  EXPECT_EQ(pool.freeBlocks(), 2);
  pool.allocate();
  pool.allocate();
  EXPECT_EQ(pool.peakUsedBlocks(), 3);
  EXPECT_THROW(pool.allocate(), std::logic_error);
  KvBlockPool other(g, 2, 4);
  EXPECT_THROW(other.release(0), std::logic_error); // never allocated
  EXPECT_THROW(other.retain(1), std::logic_error);
  EXPECT_THROW(KvBlockPool(g, 0, 4), std::invalid_argument);
}

// A step of two sequences through their block tables against a brute force:
// row 0 continues a sequence with 3 positions in its blocks by 1 new token,
// row 1 starts with 3 new tokens; blocks of 2 positions, tables out of
// order. The new tokens' keys land in their slots, each row reads its
// positions in order right-aligned to the widest (4 keys), with the
// masks and RoPE positions that alignment implies.
TEST(PagedKv, StepReadsAndWritesThroughTheTables) {
  KvGeometry g{1, 2, 3, at::kFloat}; // 1 layer, 2 kv heads, head dim 3
  KvBlockPool pool(g, 6, 2);
  const std::vector<int> a{4, 1}, b{0, 5}; // blocks of row 0 and row 1
  for (int i = 0; i < 6; ++i)
    pool.allocate(); // every block in use (the tables use four)
  // Row 0's 3 past positions: key value 100 + position in every element.
  auto slot = [&](const std::vector<int> &t, int64_t pos) { return t[(size_t)(pos / 2)] * 2 + pos % 2; };
  for (int64_t pos = 0; pos < 3; ++pos) {
    pool.keys(0)[slot(a, pos)].fill_(100.0 + pos);
    pool.values(0)[slot(a, pos)].fill_(-100.0 - pos);
  }
  PagedKvStep step(pool, {&a, &b}, {3, 0}, {1, 3});
  EXPECT_EQ(step.rows(), 2);
  EXPECT_EQ(step.width(), 3);
  EXPECT_EQ(step.past(), 1); // 4 key columns, 3 new
  EXPECT_TRUE(at::equal(step.newMask().to(at::kFloat),
                        at::tensor({0.f, 0.f, 1.f, 1.f, 1.f, 1.f}).view({2, 3})));
  EXPECT_TRUE(at::equal(step.positions(),
                        at::tensor({0L, 0L, 3L, 0L, 1L, 2L}).view({2, 3})));
  // New keys [B, kv, T, hd]: row r's token t is 10 r + t (padding -1).
  at::Tensor k = at::full({2, 2, 3, 3}, -1.f);
  k[0].narrow(1, 2, 1).fill_(0.f); // row 0's one new token (its column 2)
  for (int t = 0; t < 3; ++t)
    k[1].narrow(1, t, 1).fill_(10.f + t);
  auto [keys, values] = step.append(0, k, -k);
  ASSERT_EQ(keys.sizes(), (std::vector<int64_t>{2, 2, 4, 3}));
  // Brute force: row 0 reads positions 0-3 (100, 101, 102, then its new 0);
  // row 1 is right-aligned: a padding column, then 10, 11, 12.
  const float want0[4] = {100, 101, 102, 0}, want1[3] = {10, 11, 12};
  for (int c = 0; c < 4; ++c)
    EXPECT_TRUE(at::equal(keys[0].select(1, c), at::full({2, 3}, want0[c]))) << "row 0 key " << c;
  for (int c = 1; c < 4; ++c) {
    EXPECT_TRUE(at::equal(keys[1].select(1, c), at::full({2, 3}, want1[c - 1]))) << "row 1 key " << c;
    EXPECT_TRUE(at::equal(values[1].select(1, c), at::full({2, 3}, -want1[c - 1])));
  }
  at::Tensor real = step.keyReal(step.newMask());
  EXPECT_TRUE(at::equal(real.to(at::kFloat),
                        at::tensor({1.f, 1.f, 1.f, 1.f, 0.f, 1.f, 1.f, 1.f}).view({2, 4})));
  // The new keys are in the pool, in the rows' own slots.
  EXPECT_TRUE(at::equal(pool.keys(0)[slot(a, 3)], at::zeros({2, 3})));
  EXPECT_TRUE(at::equal(pool.keys(0)[slot(b, 2)], at::full({2, 3}, 12.f)));
  // A table too short for its positions is refused.
  const std::vector<int> one{3};
  EXPECT_THROW(PagedKvStep(pool, {&one}, {1}, {2}), std::logic_error);
  EXPECT_THROW(PagedKvStep(pool, {&one}, {0}, {0}), std::invalid_argument);
}

// A window's step j reads and writes what a step built at past + j does:
// the same key columns (right-aligned to the widest), masks and RoPE
// positions. A row whose slots end inside the window computes on its last
// reserved slot from then on, and no other row's block is ever written.
TEST(PagedKv, WindowStepsAreTheStepsTheyStandFor) {
  KvGeometry g{1, 1, 2, at::kFloat}; // 1 layer, 1 kv head, head dim 2
  KvBlockPool pool(g, 12, 2);
  for (int i = 0; i < 12; ++i)
    pool.allocate();
  // Row 0: 3 positions, 4 more reserved; row 1: 0 and 4; row 2: 5 and 2
  // (its max tokens come first); block 11 is nobody's.
  const std::vector<int> a{4, 1, 7, 9}, b{0, 5}, c{2, 6, 3, 10};
  const std::vector<const std::vector<int> *> tables{&a, &b, &c};
  const std::vector<int64_t> past{3, 0, 5}, span{4, 4, 2};
  auto slot = [&](const std::vector<int> &t, int64_t pos) { return t[(size_t)(pos / 2)] * 2 + pos % 2; };
  pool.keys(0).copy_(at::arange(24 * 2, at::kFloat).view({24, 1, 2}));
  pool.values(0).copy_(-pool.keys(0));
  pool.keys(0)[22].fill_(-7.f), pool.keys(0)[23].fill_(-7.f); // block 11
  PagedKvWindow w(pool, tables, past, span, 4, {5, 6, 7}, std::vector<double>(12, 0.25));
  EXPECT_TRUE(at::equal(w.tokens(), at::tensor({5L, 6L, 7L}).view({3, 1})));
  EXPECT_TRUE(at::equal(w.draws(), at::full({4, 3}, 0.25, at::kDouble)));
  EXPECT_FALSE(PagedKvWindow(pool, tables, past, span, 4, {5, 6, 7}).draws().defined());
  EXPECT_EQ(w.rows(), 3);
  for (int64_t j = 0; j < 4; ++j) {
    PagedKvStep s = w.step(j);
    // What a step at past + j builds (row 2 clamped to its last slot).
    const std::vector<int64_t> at{3 + j, j, std::min<int64_t>(5 + j, 6)};
    PagedKvStep ref(pool, tables, at, {1, 1, 1});
    const std::string step = "step " + std::to_string(j);
    EXPECT_EQ(s.rows(), 3) << step;
    EXPECT_EQ(s.width(), 1) << step;
    EXPECT_EQ(s.past(), 5 + j) << step; // max past + j key columns before the new one
    EXPECT_TRUE(at::equal(s.positions(), at::tensor(at).view({3, 1}))) << step;
    EXPECT_TRUE(at::equal(s.newMask(), at::ones({3, 1}, at::kBool))) << step;
    // The new keys (row r's 100 r + j) into their slots, then every row's
    // keys read back through the tables.
    at::Tensor k = (at::arange(3, at::kFloat) * 100 + (double)j).view({3, 1, 1, 1}).expand({3, 1, 1, 2}).contiguous();
    auto [keys, values] = s.append(0, k, -k);
    ASSERT_EQ(keys.sizes(), (std::vector<int64_t>{3, 1, 6 + j, 2})) << step;
    at::Tensor real = s.keyReal(s.newMask());
    for (int64_t r = 0; r < 3; ++r) {
      const std::vector<int> &t = *tables[(size_t)r];
      const int64_t len = std::min<int64_t>(past[(size_t)r] + j, past[(size_t)r] + span[(size_t)r] - 1) + 1;
      // Row 0's and row 1's columns are their positions 0 .. past + j,
      // right-aligned; row 2 past its slots reads its last one again.
      const int64_t shift = 5 - past[(size_t)r];
      for (int64_t col = 0; col < 6 + j; ++col) {
        const int64_t pos = col - shift;
        EXPECT_EQ(real[r][col].item<bool>(), pos >= 0) << step << " row " << r << " col " << col;
        if (pos < 0)
          continue;
        const int64_t want = slot(t, std::min(pos, len - 1));
        EXPECT_TRUE(at::equal(keys[r][0][col], pool.keys(0)[want][0])) << step << " row " << r << " col " << col;
      }
    }
    // While every row is in its slots, the step built on the host is the
    // same step (after, row 2's clamped columns make it one key wider).
    if (j <= 1) {
      EXPECT_EQ(ref.past(), s.past()) << step;
      EXPECT_TRUE(at::equal(real, ref.keyReal(ref.newMask()))) << step;
      EXPECT_TRUE(at::equal(s.positions(), ref.positions())) << step;
    }
  }
  // Every write went to the rows' own slots: row 2's last reserved slot
  // holds its last step's key, block 11 is untouched.
  EXPECT_TRUE(at::equal(pool.keys(0)[slot(c, 6)], at::full({1, 2}, 203.f)));
  EXPECT_TRUE(at::equal(pool.keys(0)[slot(a, 6)], at::full({1, 2}, 3.f)));
  EXPECT_TRUE(at::equal(pool.keys(0)[slot(b, 3)], at::full({1, 2}, 103.f)));
  EXPECT_TRUE(at::equal(pool.keys(0)[22], at::full({1, 2}, -7.f)));
  EXPECT_TRUE(at::equal(pool.keys(0)[23], at::full({1, 2}, -7.f)));
  // Slots a row does not hold, and spans out of the window, are refused.
  EXPECT_THROW(PagedKvWindow(pool, tables, past, {4, 5, 2}, 4, {0, 0, 0}), std::invalid_argument);
  EXPECT_THROW(PagedKvWindow(pool, tables, {3, 0, 7}, span, 4, {0, 0, 0}), std::logic_error);
  EXPECT_THROW(PagedKvWindow(pool, tables, past, span, 4, {0, 0}), std::invalid_argument);
  EXPECT_THROW(PagedKvWindow(pool, tables, past, span, 4, {0, 0, 0}, {0.5}), std::invalid_argument);
  EXPECT_THROW(w.step(4), std::out_of_range);
}

// HFLOW_ATTENTION: a comma-separated set of the opt-in attention paths;
// anything else is refused, naming it.
TEST(PagedKv, AttentionPathsFromTheEnvironment) {
  const char *old = std::getenv("HFLOW_ATTENTION");
  const std::string saved = old ? old : "";
  for (const char *good : {"", "dense", "paged", "sdpa", "sdpa,paged", "paged,sdpa,dense"}) {
    ::setenv("HFLOW_ATTENTION", good, 1);
    EXPECT_NO_THROW(checkAttentionEnvironment()) << good;
  }
  for (const char *bad : {"flash", "sdpa,", "paged;sdpa", " sdpa", "SDPA"}) {
    ::setenv("HFLOW_ATTENTION", bad, 1);
    try {
      checkAttentionEnvironment();
      ADD_FAILURE() << "HFLOW_ATTENTION=" << bad << " was taken";
    } catch (const std::invalid_argument &e) {
      EXPECT_NE(std::string(e.what()).find(std::string("HFLOW_ATTENTION='") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  if (old)
    ::setenv("HFLOW_ATTENTION", saved.c_str(), 1);
  else
    ::unsetenv("HFLOW_ATTENTION");
}

// The paged path on a CPU: attendInPlace under HFLOW_ATTENTION=paged
// stores the step's keys and values and attends through the tables with
// pagedDecodeReference, equal to the ATen path's gathered keys (a sliding
// window, GQA, a row's first key); what it does not take it refuses, and
// outside the scope the step keeps the ATen path.
TEST(PagedKv, ReferencePathOnACpu) {
  KvGeometry g{1, 2, 4, at::kFloat}; // 2 kv heads of 4
  KvBlockPool pool(g, 10, 2);
  for (int i = 0; i < 10; ++i)
    pool.allocate();
  const std::vector<int> a{7, 2, 9}, b{4}, c{1, 8, 0, 3};
  const std::vector<const std::vector<int> *> tables{&a, &b, &c};
  const std::vector<int64_t> past{4, 0, 6};
  pool.keys(0).copy_(at::randn({20, 2, 4}));
  pool.values(0).copy_(at::randn({20, 2, 4}));
  const at::Tensor q = at::randn({3, 6, 1, 4}), k = at::randn({3, 2, 1, 4}),
                   v = at::randn({3, 2, 1, 4});
  for (int64_t window : {0, 3}) {
    const at::Tensor keys0 = pool.keys(0).clone(), values0 = pool.values(0).clone();
    PagedKvStep dense(pool, tables, past, {1, 1, 1});
    EXPECT_FALSE(dense.attendInPlace(0, q, k, v, 0.5, window).defined());
    auto [kk, vv] = dense.append(0, k, v);
    const at::Tensor bias = attentionBias(dense.keyReal(dense.newMask()), dense.past(), 1, window);
    const at::Tensor want = attendGrouped(q, kk, vv, bias, 0.5);
    pool.keys(0).copy_(keys0), pool.values(0).copy_(values0);
    ScopedAttentionPaths paged("paged");
    PagedKvStep step(pool, tables, past, {1, 1, 1});
    const int64_t before = pagedAttends();
    const at::Tensor got = step.attendInPlace(0, q, k, v, 0.5, window);
    ASSERT_TRUE(got.defined()) << window;
    EXPECT_EQ(pagedAttends(), before + 1);
    EXPECT_LT((got - want).abs().max().item<float>(), 1e-6) << window;
    // It stored the new keys in the rows' slots (row 0 at 4: block 9).
    EXPECT_TRUE(at::equal(pool.keys(0)[18], k[0].select(1, 0))) << window;
    EXPECT_TRUE(at::equal(pool.values(0)[8], v[1].select(1, 0))) << window;
  }
  // The reference refuses values narrower than keys, heads that do not
  // group, and shapes not a decode step's.
  const at::Tensor tab = at::zeros({3, 4}, at::kInt), len = at::ones({3}, at::kInt);
  EXPECT_THROW(pagedDecodeReference(q, pool.keys(0), pool.values(0).narrow(2, 0, 2), tab, len, 2,
                                    0, 1.0),
               std::logic_error);
  EXPECT_THROW(pagedDecodeReference(q.narrow(1, 0, 5), pool.keys(0), pool.values(0), tab, len, 2,
                                    0, 1.0),
               std::logic_error);
  EXPECT_THROW(pagedDecodeReference(at::randn({3, 6, 2, 4}), pool.keys(0), pool.values(0), tab,
                                    len, 2, 0, 1.0),
               std::logic_error);
  EXPECT_THROW(pagedDecodeReference(q, pool.keys(0), pool.values(0), tab.narrow(0, 0, 2), len, 2,
                                    0, 1.0),
               std::logic_error);
  EXPECT_THROW(ScopedAttentionPaths("flash"), std::invalid_argument);
  EXPECT_FALSE(attentionPathRequested("paged"));
}
