// The fused embedding path's CPU kernels against a plain loop written from their
// definition: one-hot and bags, sum and mean, empty bags, a row in several bags and twice
// in one; and the same bits whatever the threads (the backward goes row by row).
#include "ember/cache/bag_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

namespace ember::cache {
namespace {

struct Case {
  std::uint32_t dim;
  std::size_t distinct;
  std::vector<std::uint32_t> ids, offsets;
  std::vector<float> table, grad_out;
  bool mean;
};

// `bags` bags of 0-9 ids (empty: one-hot) over `distinct` rows, half the ids on 5% of them.
Case make_case(std::uint32_t dim, std::size_t bags, bool multi_hot, bool mean, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Case c{dim, 997, {}, {}, {}, {}, mean};
  if (multi_hot) c.offsets.push_back(0);
  for (std::size_t b = 0; b < bags; ++b) {
    const std::size_t n = multi_hot ? rng() % 10 : 1;
    for (std::size_t i = 0; i < n; ++i) c.ids.push_back(rng() % 2 ? rng() % 50 : rng() % c.distinct);
    if (multi_hot) c.offsets.push_back(static_cast<std::uint32_t>(c.ids.size()));
  }
  c.table.resize(c.distinct * dim);
  for (auto& x : c.table) x = u(rng);
  c.grad_out.resize(bags * dim);
  for (auto& x : c.grad_out) x = u(rng);
  return c;
}

BagBatch batch_of(const Case& c) { return BagBatch{c.ids, c.offsets, c.mean}; }

std::vector<const float*> row_pointers(const Case& c) {
  std::vector<const float*> p(c.distinct);
  for (std::size_t r = 0; r < c.distinct; ++r) p[r] = &c.table[r * c.dim];
  return p;
}

// Splits [0, n) into `threads` ranges run on threads of their own.
ParallelFor threads_of(unsigned threads) {
  return [threads](std::size_t n, std::size_t, const std::function<void(std::size_t, std::size_t)>& f) {
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t) ts.emplace_back([&, t] { f(n * t / threads, n * (t + 1) / threads); });
    for (auto& t : ts) t.join();
  };
}

// The definition: a bag's rows (times 1 / its size when averaged) added in id order;
// each id's weighted bag gradient added to its row in id order.
std::vector<float> forward_by_definition(const Case& c) {
  const BagBatch b = batch_of(c);
  std::vector<float> out(b.bags() * c.dim, 0.0f);
  for (std::size_t bag = 0; bag < b.bags(); ++bag) {
    const float w = 1.0f / static_cast<float>(std::max<std::uint32_t>(1, b.end(bag) - b.begin(bag)));
    for (std::uint32_t i = b.begin(bag); i < b.end(bag); ++i)
      for (std::uint32_t k = 0; k < c.dim; ++k) {
        const float v = c.table[c.ids[i] * c.dim + k];
        const float x = c.mean ? v * w : v;
        out[bag * c.dim + k] += x;
      }
  }
  return out;
}
std::vector<float> backward_by_definition(const Case& c, std::vector<float> grads) {
  const BagBatch b = batch_of(c);
  for (std::size_t bag = 0; bag < b.bags(); ++bag) {
    const float w = 1.0f / static_cast<float>(std::max<std::uint32_t>(1, b.end(bag) - b.begin(bag)));
    for (std::uint32_t i = b.begin(bag); i < b.end(bag); ++i)
      for (std::uint32_t k = 0; k < c.dim; ++k) {
        const float g = c.grad_out[bag * c.dim + k];
        const float x = c.mean ? g * w : g;
        grads[c.ids[i] * c.dim + k] += x;
      }
  }
  return grads;
}

std::vector<float> run_backward(const Case& c, const ParallelFor& parallel, const std::vector<float>& start) {
  std::vector<float> grads = start;
  std::vector<float*> p(c.distinct);
  for (std::size_t r = 0; r < c.distinct; ++r) p[r] = &grads[r * c.dim];
  RowBags scratch;
  pool_backward(batch_of(c), c.grad_out.data(), p, c.dim, scratch, parallel);
  return grads;
}

class BagPoolTest : public ::testing::TestWithParam<std::tuple<std::uint32_t, bool, bool>> {};

TEST_P(BagPoolTest, MatchesTheDefinitionBitForBitOnAnyThreads) {
  const auto [dim, multi_hot, mean] = GetParam();
  const Case c = make_case(dim, 3000, multi_hot, mean, dim * 7 + multi_hot * 3 + mean);
  const auto rows = row_pointers(c);
  const std::vector<float> want = forward_by_definition(c);
  for (unsigned threads : {0u, 1u, 2u, 5u}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    std::vector<float> out(want.size(), -7.0f);  // every entry written, zero for an empty bag
    pool_forward(batch_of(c), rows, dim, out.data(), threads == 0 ? ParallelFor{} : threads_of(threads));
    EXPECT_EQ(out, want);
  }
  // Gradient sums already holding something (a partial row keeps its sum).
  std::vector<float> start(c.distinct * dim);
  for (std::size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(i % 13) * 0.25f;
  const std::vector<float> want_grads = backward_by_definition(c, start);
  for (unsigned threads : {0u, 1u, 2u, 5u}) {
    SCOPED_TRACE("backward, threads " + std::to_string(threads));
    EXPECT_EQ(run_backward(c, threads == 0 ? ParallelFor{} : threads_of(threads), start), want_grads);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BagPoolTest,
                         ::testing::Combine(::testing::Values(1u, 4u, 16u, 24u, 128u), ::testing::Bool(), ::testing::Bool()));

TEST(BagPool, RowListsAreInIdOrder) {
  const std::vector<std::uint32_t> ids = {2, 0, 2, 1, 2}, offsets = {0, 2, 2, 5};
  RowBags lists;
  lists.build(BagBatch{ids, offsets, false}, 4);
  EXPECT_EQ(lists.start, (std::vector<std::uint32_t>{0, 1, 2, 5, 5}));
  EXPECT_EQ(lists.bag, (std::vector<std::uint32_t>{0, 2, 0, 2, 2}));  // row 0: bag 0; row 1: bag 2; row 2: bags 0, 2, 2
}

}  // namespace
}  // namespace ember::cache
