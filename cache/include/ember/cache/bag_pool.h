// The fused embedding path's kernels: a batch's rows gathered and pooled bag by bag
// straight into the model's input, and the bags' gradients added straight into the
// rows' gradient accumulators. No per-id copies: each id names one of the batch's
// distinct rows, and each distinct row is a pointer (a cache slot, a replica row, a
// table row), so the same kernels serve the worker, the evaluation, the one-process
// reference and ember-predict, and all of them pool in the same order.
//
// Deterministic: a bag's sum runs over its ids in order, and a row's gradient adds its
// bags' gradients in id order, whatever the number of threads (the backward goes row by
// row, over a list of each row's bags: no two threads add into the same row).
// CUDA twins of these kernels: bag_pool_cuda.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ember::cache {

// A batch's embedding input: `bags` bags (samples x tables), bag b holding ids
// [offsets[b], offsets[b + 1]), each id its distinct row rows[id]. Empty offsets: one id a
// bag (one-hot). Mean pooling weighs each id of a bag of n by 1 / n.
struct BagBatch {
  std::span<const std::uint32_t> rows;     // per id: a distinct row, < the row count
  std::span<const std::uint32_t> offsets;  // bags + 1 entries, or empty
  bool mean = false;

  std::size_t ids() const { return rows.size(); }
  std::size_t bags() const { return offsets.empty() ? rows.size() : offsets.size() - 1; }
  std::uint32_t begin(std::size_t b) const { return offsets.empty() ? static_cast<std::uint32_t>(b) : offsets[b]; }
  std::uint32_t end(std::size_t b) const { return offsets.empty() ? static_cast<std::uint32_t>(b + 1) : offsets[b + 1]; }
};

// Runs f(begin, end) over disjoint ranges covering [0, n), in parallel or not; ranges
// hold at least `grain` items where n allows. The worker passes LibTorch's thread pool
// (one pool per process); empty: one thread.
using ParallelFor = std::function<void(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f)>;

// Each distinct row's bags, in id order (a CSR list): row r's are
// bag[start[r] .. start[r + 1]). A bag listing a row twice lists it twice.
struct RowBags {
  std::vector<std::uint32_t> start, bag;
  void build(const BagBatch& batch, std::size_t distinct_rows);
};

// out[b] = the sum (or mean) of bag b's rows, [bags, dim] row-major; an empty bag is 0.
void pool_forward(const BagBatch& batch, std::span<const float* const> rows, std::uint32_t dim, float* out,
                  const ParallelFor& parallel = {});

// grads[rows[i]] += weight(i) * grad_out[bag of i] for every id i, in id order per row.
// `scratch` keeps the row lists between calls (no allocation per batch once warm).
void pool_backward(const BagBatch& batch, const float* grad_out, std::span<float* const> grads, std::uint32_t dim, RowBags& scratch,
                   const ParallelFor& parallel = {});

}  // namespace ember::cache
