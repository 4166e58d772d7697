#include "ember/cache/bag_pool.h"

#include <algorithm>
#include <cstring>

// Compiled with -ffp-contract=off (CMakeLists): a multiply then an add, never fused,
// so every clone below and the CUDA kernels round alike.
namespace ember::cache {
namespace {

// Ids ahead whose rows are fetched early: a row is a few cache lines at a random place.
constexpr std::size_t kAhead = 8;

inline void prefetch_row(const float* p, std::uint32_t dim) {
  for (std::uint32_t k = 0; k < dim; k += 16) __builtin_prefetch(p + k, 0, 1);
}
inline void prefetch_row_rw(const float* p, std::uint32_t dim) {
  for (std::uint32_t k = 0; k < dim; k += 16) __builtin_prefetch(p + k, 1, 1);
}

inline float bag_weight(const BagBatch& batch, std::size_t b) { return 1.0f / static_cast<float>(batch.end(b) - batch.begin(b)); }

// Bags [b0, b1). One clone per vector width: the row loops vectorize inside each.
__attribute__((target_clones("avx512f", "avx2", "default"))) void forward_range(const BagBatch& batch, const float* const* rows,
                                                                                std::uint32_t dim, float* out, std::size_t b0,
                                                                                std::size_t b1) {
  const std::uint32_t* ids = batch.rows.data();
  const std::size_t n = batch.ids();
  for (std::size_t b = b0; b < b1; ++b) {
    float* __restrict__ o = out + b * dim;
    const std::uint32_t begin = batch.begin(b), end = batch.end(b);
    std::memset(o, 0, dim * sizeof(float));
    const float w = batch.mean && end > begin ? bag_weight(batch, b) : 1.0f;
    for (std::uint32_t i = begin; i < end; ++i) {
      if (i + kAhead < n) prefetch_row(rows[ids[i + kAhead]], dim);
      const float* __restrict__ v = rows[ids[i]];
      if (batch.mean) {
        for (std::uint32_t k = 0; k < dim; ++k) o[k] += v[k] * w;
      } else {
        for (std::uint32_t k = 0; k < dim; ++k) o[k] += v[k];
      }
    }
  }
}

// Rows [r0, r1), each adding its bags' gradients in id order.
__attribute__((target_clones("avx512f", "avx2", "default"))) void backward_range(const BagBatch& batch, const RowBags& lists,
                                                                                 const float* grad_out, float* const* grads,
                                                                                 std::uint32_t dim, std::size_t r0, std::size_t r1) {
  for (std::size_t r = r0; r < r1; ++r) {
    if (r + 4 < r1) prefetch_row_rw(grads[r + 4], dim);
    float* __restrict__ g = grads[r];
    for (std::uint32_t e = lists.start[r]; e < lists.start[r + 1]; ++e) {
      const std::uint32_t b = lists.bag[e];
      const float* __restrict__ src = grad_out + static_cast<std::size_t>(b) * dim;
      if (batch.mean) {
        const float w = bag_weight(batch, b);
        for (std::uint32_t k = 0; k < dim; ++k) g[k] += src[k] * w;
      } else {
        for (std::uint32_t k = 0; k < dim; ++k) g[k] += src[k];
      }
    }
  }
}

// One thread: id by id, the order the row lists give each row.
__attribute__((target_clones("avx512f", "avx2", "default"))) void backward_serial(const BagBatch& batch, const float* grad_out,
                                                                                  float* const* grads, std::uint32_t dim) {
  const std::uint32_t* ids = batch.rows.data();
  const std::size_t n = batch.ids();
  for (std::size_t b = 0; b < batch.bags(); ++b) {
    const float* __restrict__ src = grad_out + b * dim;
    const std::uint32_t begin = batch.begin(b), end = batch.end(b);
    const float w = batch.mean && end > begin ? bag_weight(batch, b) : 1.0f;
    for (std::uint32_t i = begin; i < end; ++i) {
      if (i + kAhead < n) prefetch_row_rw(grads[ids[i + kAhead]], dim);
      float* __restrict__ g = grads[ids[i]];
      if (batch.mean) {
        for (std::uint32_t k = 0; k < dim; ++k) g[k] += src[k] * w;
      } else {
        for (std::uint32_t k = 0; k < dim; ++k) g[k] += src[k];
      }
    }
  }
}

// Work per parallel range: a few hundred ids' rows.
constexpr std::size_t kGrainIds = 2048;

}  // namespace

void RowBags::build(const BagBatch& batch, std::size_t distinct_rows) {
  start.assign(distinct_rows + 1, 0);
  for (std::uint32_t r : batch.rows) ++start[r + 1];
  for (std::size_t r = 0; r < distinct_rows; ++r) start[r + 1] += start[r];
  bag.resize(batch.ids());
  // Filled bag by bag, so each row's list is in id order; `start` is the next free
  // entry meanwhile and is shifted back after.
  for (std::size_t b = 0; b < batch.bags(); ++b) {
    for (std::uint32_t i = batch.begin(b); i < batch.end(b); ++i) bag[start[batch.rows[i]]++] = static_cast<std::uint32_t>(b);
  }
  for (std::size_t r = distinct_rows; r > 0; --r) start[r] = start[r - 1];
  start[0] = 0;
}

void pool_forward(const BagBatch& batch, std::span<const float* const> rows, std::uint32_t dim, float* out, const ParallelFor& parallel) {
  const std::size_t bags = batch.bags();
  if (bags == 0) return;
  if (!parallel) {
    forward_range(batch, rows.data(), dim, out, 0, bags);
    return;
  }
  const std::size_t per_bag = std::max<std::size_t>(1, batch.ids() / bags);
  parallel(bags, std::max<std::size_t>(1, kGrainIds / per_bag),
           [&](std::size_t b0, std::size_t b1) { forward_range(batch, rows.data(), dim, out, b0, b1); });
}

void pool_backward(const BagBatch& batch, const float* grad_out, std::span<float* const> grads, std::uint32_t dim, RowBags& scratch,
                   const ParallelFor& parallel) {
  if (batch.ids() == 0) return;
  if (!parallel) {
    backward_serial(batch, grad_out, grads.data(), dim);
    return;
  }
  scratch.build(batch, grads.size());
  const std::size_t per_row = std::max<std::size_t>(1, batch.ids() / std::max<std::size_t>(1, grads.size()));
  parallel(grads.size(), std::max<std::size_t>(1, kGrainIds / per_row),
           [&](std::size_t r0, std::size_t r1) { backward_range(batch, scratch, grad_out, grads.data(), dim, r0, r1); });
}

}  // namespace ember::cache
