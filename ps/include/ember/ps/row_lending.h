// RowLending: rows lent ahead for a prefetch (ShardStore::lend_ahead, protocol.h
// kPrefetch) until the commit of the iteration they were lent for. A flag per local row,
// allocated at the first prefetch; until then the check on pushes is one atomic load.
// Used by ShardStore only.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "ember/common/types.h"

namespace ember::ps {

class RowArena;

class RowLending {
 public:
  RowLending() = default;
  RowLending(RowLending&& o) noexcept : lent_(std::move(o.lent_)), lending_(o.lending_.load()), lent_rows_(std::move(o.lent_rows_)) {}

  // Flags the rows at these local indices as lent for `iteration`. `check` runs first,
  // under the lending lock (ShardStore: no update of them may be in flight).
  template <class Check>
  void lend(const RowArena& arena, std::span<const Key> keys, std::uint64_t iteration, std::uint64_t local_rows, Check check);
  // commit(iteration) is in: rows lent for it (or earlier) may be updated again.
  void end(std::uint64_t iteration);
  // ProtocolError (naming `what`) if one of the keys this shard owns is lent.
  void check_not_lent(const RowArena& arena, std::span<const Key> keys, const char* what) const {
    if (lending_.load(std::memory_order_acquire)) [[unlikely]]
      check_slow(arena, keys, what);
  }

 private:
  void check_slow(const RowArena& arena, std::span<const Key> keys, const char* what) const;
  void flag(const RowArena& arena, std::span<const Key> keys, std::uint64_t iteration);

  std::mutex mu_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> lent_;
  std::atomic<bool> lending_{false};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> lent_rows_;  // (local row, iteration)
};

template <class Check>
void RowLending::lend(const RowArena& arena, std::span<const Key> keys, std::uint64_t iteration, std::uint64_t local_rows, Check check) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lent_) {
    lent_ = std::make_unique<std::atomic<std::uint8_t>[]>(local_rows);
    lending_.store(true, std::memory_order_release);
  }
  check();
  flag(arena, keys, iteration);
}

}  // namespace ember::ps
