// EmbeddingCache: the rows a worker caches, slot by slot: value, optimizer state, and a
// gradient accumulator. Slots are assigned by the scheduler's LruIndex model (StepPlan),
// and each row's state (latest, dirty, partial) lives in the scheduler's location map,
// so this class makes no caching decisions and keeps no states.
//
// Host memory here; with CUDA (EMBER_HAVE_CUDA) CudaEmbeddingCache keeps the same layout
// in device memory with gather / scatter kernels (embedding_cache_cuda.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/huge_pages.h"
#include "ember/common/types.h"

namespace ember::cache {

class EmbeddingCache {
 public:
  EmbeddingCache(std::uint32_t capacity, std::uint32_t dim, std::uint32_t state_dim);

  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t dim() const { return dim_; }
  std::uint32_t state_dim() const { return state_dim_; }

  float* value(std::uint32_t slot) { return &values_[static_cast<std::size_t>(slot) * dim_]; }
  const float* value(std::uint32_t slot) const { return &values_[static_cast<std::size_t>(slot) * dim_]; }
  float* state(std::uint32_t slot) { return &states_[static_cast<std::size_t>(slot) * state_dim_]; }
  float* grad(std::uint32_t slot) { return &grads_[static_cast<std::size_t>(slot) * dim_]; }
  Key key(std::uint32_t slot) const { return keys_[slot]; }

  // Puts a row (pulled from the PS) into `slot`: value, optimizer state, zero gradient.
  // `state` null: the state is zeroed (a row whose optimizer runs on the PS).
  void fill(std::uint32_t slot, Key key, const float* value, const float* state);

  // out[i] = value(slots[i]) for i < n: the batch's embedding rows.
  void gather(const std::uint32_t* slots, std::size_t n, float* out) const;
  // grad(slots[i]) += grads[i]: per-row sums of the batch's row gradients.
  void scatter_add_grad(const std::uint32_t* slots, std::size_t n, const float* grads);
  void zero_grad(std::uint32_t slot);

  std::size_t memory_bytes() const;

 private:
  std::uint32_t capacity_, dim_, state_dim_;
  // Gathered and scattered at random slots: on huge pages where the host allows.
  std::vector<float, HugePageAllocator<float>> values_, states_, grads_;
  std::vector<Key, HugePageAllocator<Key>> keys_;
};

}  // namespace ember::cache
