// Window: the batches the scheduler sees beyond the one it schedules (lookahead), and
// for every row of the key space its next use among them. The row-state contract's
// lookahead extension (docs/design.md) asks one question of it: which iteration next
// uses a row, if any batch of the window does.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "ember/cache/lru_index.h"
#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/scheduler/global_batch.h"

namespace ember::scheduler {

class Window {
 public:
  static constexpr std::uint32_t kNever = cache::LruIndex::kNever;

  Window(std::uint64_t num_keys, std::uint64_t first_iteration);

  // Adds the batch of iteration end(). Calls needed(key, iteration) for every row the
  // window did not use before (its next use was kNever and is now `iteration`).
  template <typename F>
  void add(const GlobalBatch& b, F&& needed) {
    const std::uint32_t j = end();
    Batch& batch = batches_.emplace_back();
    batch.digest = digest(b);
    for (Key k : b.keys) {
      auto [last, fresh] = last_.try_emplace(k, pack(j, 0));
      if (!fresh) {
        const std::uint32_t i = static_cast<std::uint32_t>(*last >> 32);
        if (i == j) continue;  // again in this batch
        if (i >= front_) batches_[i - front_].next[static_cast<std::uint32_t>(*last)] = j;
      }
      *last = pack(j, static_cast<std::uint32_t>(batch.keys.size()));
      batch.keys.push_back(k);
      batch.next.push_back(kNever);
      if (next_use_[k] == kNever) {
        next_use_[k] = j;
        needed(k, j);
      }
    }
  }
  // Consumes the first batch (the one scheduled now, iteration front()): its rows' next
  // uses move past it. Throws Error when `b` is not that batch (a caller out of step).
  void pop(const GlobalBatch& b);

  std::uint32_t next_use(Key k) const { return next_use_[k]; }
  std::uint32_t front() const { return front_; }
  std::uint32_t end() const { return front_ + static_cast<std::uint32_t>(batches_.size()); }
  std::size_t size() const { return batches_.size(); }
  std::size_t memory_bytes() const;

 private:
  struct Batch {
    std::vector<Key> keys;            // distinct, first-appearance order
    std::vector<std::uint32_t> next;  // per key: the next iteration using it, or kNever
    std::uint64_t digest = 0;
  };
  static std::uint64_t pack(std::uint32_t iteration, std::uint32_t pos) { return static_cast<std::uint64_t>(iteration) << 32 | pos; }
  static std::uint64_t digest(const GlobalBatch& b);

  std::deque<Batch> batches_;
  std::uint32_t front_;
  std::vector<std::uint32_t> next_use_;  // key -> next iteration using it (front() or later), or kNever
  U64Map<std::uint64_t> last_;           // key -> (iteration, position) of its last use in the window
};

}  // namespace ember::scheduler
