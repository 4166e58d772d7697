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
// `groups[i]` (0: none) is contribution i's host: a group's contributions are summed
// first (in the order of their bytes, into its first), then the groups' sums and the
// ungrouped ones. A host's gradients summed there (two a host: a + b rounds as b + a)
// give the same bits as the same gradients pushed one by one.
inline void sum_in_canonical_order(float* c, const std::uint16_t* groups, std::uint32_t n, std::uint32_t dim) {
  std::array<std::uint32_t, ShardStore::kMaxTrainers> order;
  for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
  const std::size_t bytes = dim * sizeof(float);
  auto block = [&](std::uint32_t i) { return c + std::size_t{i} * dim; };
  auto by_bytes = [&](std::uint32_t a, std::uint32_t b) { return std::memcmp(block(a), block(b), bytes) < 0; };
  // Each group summed into its first block (by bytes); `order` keeps one block per group.
  std::sort(order.begin(), order.begin() + n,
            [&](std::uint32_t a, std::uint32_t b) { return groups[a] != groups[b] ? groups[a] < groups[b] : by_bytes(a, b); });
  std::uint32_t kept = 0;
  for (std::uint32_t j = 0; j < n;) {
    std::uint32_t end = j + 1;
    if (groups[order[j]] != 0)
      while (end < n && groups[order[end]] == groups[order[j]]) ++end;
    float* __restrict to = block(order[j]);
    for (std::uint32_t m = j + 1; m < end; ++m) {
      const float* __restrict x = block(order[m]);
      for (std::uint32_t d = 0; d < dim; ++d) to[d] += x[d];
    }
    order[kept++] = order[j];
    j = end;
  }
  std::sort(order.begin(), order.begin() + kept, by_bytes);
  thread_local std::vector<float> sum;
  sum.assign(block(order[0]), block(order[0]) + dim);
  for (std::uint32_t j = 1; j < kept; ++j) {
    const float* __restrict x = block(order[j]);
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
  std::vector<std::uint16_t> partial_groups;            // each block's contribution's group (sum_in_canonical_order)
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
    partial_groups.resize(partial_grads.size() / dim);
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
