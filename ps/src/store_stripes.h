// ShardStore's stripes (its second job, aggregation): the partial gradient sums of the
// keys that hash to each stripe, behind the stripe's TBB spin lock, and the ready and
// parked rows of the handler thread whose stripe it is. Private to the store's sources.
#pragma once

#include <tbb/spin_mutex.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {

// Blocks of dim floats an aggregation of `trainers` contributions holds while it waits:
// two contributions are summed as they come (a + b and b + a round alike); three or
// more are kept apart and summed once all are in, in an order their bits fix
// (sum_in_canonical_order), so that a row's update never depends on which push came
// first. That holds one block per contribution until the last arrives.
inline std::uint32_t blocks_for(std::uint32_t trainers) { return trainers <= 2 ? 1 : trainers; }

// Sums the n contributions of dim floats at c, c + dim, ... into c[0, dim), in the order
// of their bytes: the same contributions give the same bits whatever order they came in.
inline void sum_in_canonical_order(float* c, std::uint32_t n, std::uint32_t dim) {
  std::array<std::uint32_t, ShardStore::kMaxTrainers> order;
  for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
  const std::size_t bytes = dim * sizeof(float);
  std::sort(order.begin(), order.begin() + n,
            [&](std::uint32_t a, std::uint32_t b) { return std::memcmp(c + std::size_t{a} * dim, c + std::size_t{b} * dim, bytes) < 0; });
  thread_local std::vector<float> sum;
  sum.assign(c + std::size_t{order[0]} * dim, c + std::size_t{order[0]} * dim + dim);
  for (std::uint32_t j = 1; j < n; ++j) {
    const float* __restrict x = c + std::size_t{order[j]} * dim;
    for (std::uint32_t d = 0; d < dim; ++d) sum[d] += x[d];
  }
  std::memcpy(c, sum.data(), bytes);
}

struct ShardStore::Stripe {
  mutable tbb::spin_mutex mu;
  // Aggregations still waiting for contributions, their blocks in `partial_grads` (see
  // blocks_for), and the blocks free for reuse, by count.
  U64Map<Pending> partial;
  std::vector<float> partial_grads;
  std::vector<std::vector<std::uint32_t>> free_blocks;  // by count, grown as counts come
  std::uint32_t take_blocks(std::uint32_t n, std::uint32_t dim) {
    if (free_blocks.size() <= n) free_blocks.resize(n + 1);
    std::vector<std::uint32_t>& free = free_blocks[n];
    if (!free.empty()) {
      const std::uint32_t offset = free.back();
      free.pop_back();
      return offset;
    }
    const auto offset = static_cast<std::uint32_t>(partial_grads.size());
    partial_grads.resize(partial_grads.size() + std::size_t{n} * dim);
    return offset;
  }
  void give_blocks(std::uint32_t offset, std::uint32_t n) { free_blocks[n].push_back(offset); }
  // Complete aggregations, taken by the next commit: appended in arrival order, so the
  // common case (one trainer) is one sequential pass out, its gradients read where the
  // push left them (lent) or copied once.
  std::vector<Ready> ready;
  std::vector<float> ready_grads;                         // the copied gradients of `ready`, in order
  std::vector<std::shared_ptr<const void>> ready_owners;  // the pushes' payloads the lent ones point into
  // Buffers of an applied batch of this stripe, for its next one: they stay with the
  // stripe's thread (a pool shared by every thread moved them between cores).
  std::vector<Ready> spare_rows;
  std::vector<float> spare_grads;
  // Batches a commit_deferred() took from this stripe, not applied yet.
  std::vector<Batch> parked;
  std::atomic<std::size_t> parked_count{0};  // parked.size(), read without the lock
};

}  // namespace ember::ps
