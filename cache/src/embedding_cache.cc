#include "ember/cache/embedding_cache.h"

#include <algorithm>
#include <cstring>

namespace ember::cache {

EmbeddingCache::EmbeddingCache(std::uint32_t capacity, std::uint32_t dim, std::uint32_t state_dim)
    : capacity_(capacity),
      dim_(dim),
      state_dim_(state_dim),
      values_(static_cast<std::size_t>(capacity) * dim),
      states_(static_cast<std::size_t>(capacity) * state_dim),
      grads_(static_cast<std::size_t>(capacity) * dim),
      keys_(capacity, 0) {}

void EmbeddingCache::fill(std::uint32_t slot, Key key, const float* value, const float* state) {
  std::memcpy(this->value(slot), value, sizeof(float) * dim_);
  if (state_dim_ > 0 && state != nullptr) std::memcpy(this->state(slot), state, sizeof(float) * state_dim_);
  if (state_dim_ > 0 && state == nullptr) std::fill_n(this->state(slot), state_dim_, 0.0f);
  zero_grad(slot);
  keys_[slot] = key;
}

void EmbeddingCache::gather(const std::uint32_t* slots, std::size_t n, float* out) const {
  for (std::size_t i = 0; i < n; ++i) std::memcpy(out + i * dim_, value(slots[i]), sizeof(float) * dim_);
}

void EmbeddingCache::scatter_add_grad(const std::uint32_t* slots, std::size_t n, const float* grads) {
  for (std::size_t i = 0; i < n; ++i) {
    float* g = grad(slots[i]);
    const float* src = grads + i * dim_;
    for (std::uint32_t j = 0; j < dim_; ++j) g[j] += src[j];
  }
}

void EmbeddingCache::zero_grad(std::uint32_t slot) { std::fill_n(grad(slot), dim_, 0.0f); }

std::size_t EmbeddingCache::memory_bytes() const {
  return (values_.size() + states_.size() + grads_.size()) * sizeof(float) + keys_.size() * sizeof(Key);
}

}  // namespace ember::cache
