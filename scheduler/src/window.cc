#include "window.h"

#include <xxhash.h>

#include "ember/common/error.h"

namespace ember::scheduler {

Window::Window(std::uint64_t num_keys, std::uint64_t first_iteration)
    : front_(static_cast<std::uint32_t>(first_iteration)), next_use_(num_keys, kNever) {
  if (first_iteration >= kNever) throw ConfigError("lookahead: iteration numbers beyond 2^32 are not supported");
}

std::uint64_t Window::digest(const GlobalBatch& b) {
  const std::uint64_t keys = XXH3_64bits_withSeed(b.keys.data(), b.keys.size() * sizeof(Key), b.samples);
  return b.bags.empty() ? keys : XXH3_64bits_withSeed(b.bags.data(), b.bags.size() * sizeof(std::uint32_t), keys);
}

void Window::pop(const GlobalBatch& b) {
  if (batches_.empty() || batches_.front().digest != digest(b)) {
    throw Error("scheduler: batch of iteration " + std::to_string(front_) + " is not the first batch of the lookahead window");
  }
  const Batch& batch = batches_.front();
  for (std::size_t p = 0; p < batch.keys.size(); ++p) {
    const Key k = batch.keys[p];
    next_use_[k] = batch.next[p];
    if (batch.next[p] == kNever) last_.erase(k);
  }
  batches_.pop_front();
  ++front_;
}

std::size_t Window::memory_bytes() const {
  std::size_t b = next_use_.capacity() * sizeof(std::uint32_t) + last_.memory_bytes();
  for (const Batch& x : batches_) b += x.keys.capacity() * sizeof(Key) + x.next.capacity() * sizeof(std::uint32_t);
  return b;
}

}  // namespace ember::scheduler
