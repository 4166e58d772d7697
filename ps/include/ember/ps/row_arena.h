// RowArena: where a shard's rows live (ShardStore's first job). Row key k is stored at
// local index k div shards, in chunks of 64K rows allocated on first use (by
// compare-and-swap, on huge pages where the host allows) and never moved, each row with
// a state byte: new, being initialized, idle, aggregating. A row is initialized exactly
// once, from (seed, key), whichever thread touches it first. Used by ShardStore only.
// With a disk tier (StoreConfig::tier) there are no chunks: the rows live in the tier
// (disk_tier.h), which keeps a RAM budget of them in memory, and a user pins a row
// (pin(), tier()->unpin()) while it uses it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ember/common/fast_div.h"
#include "ember/common/huge_pages.h"
#include "ember/common/types.h"
#include "ember/ps/disk_tier.h"
#include "ember/ps/sparse_optimizer.h"

namespace ember::ps {

struct StoreConfig;

class RowArena {
 public:
  // A row's lifecycle on the shard (not the design's row states, which are the workers'
  // caches'): its initialization, then whether a gradient aggregation of it
  // waits (partial, or complete until the next commit). A push claims an idle row by
  // compare-and-swap (of two claims one wins); an apply sets it idle again.
  enum Lifecycle : std::uint8_t { kNew = 0, kInitializing = 1, kIdle = 2, kAggregating = 3 };
  static constexpr std::uint64_t kChunkRows = 1 << 16;

  // ConfigError when the row index cannot be allocated.
  RowArena(const StoreConfig& config, std::uint32_t row_floats);
  ~RowArena();
  RowArena(RowArena&&) noexcept;

  // Rows a configuration puts on its shard.
  static std::uint64_t local_rows(const StoreConfig& c);
  std::uint64_t local_rows() const { return local_rows_; }
  std::uint64_t initialized() const { return initialized_count_.load(); }
  // The disk tier under the rows, or null (all in RAM).
  DiskTier* tier() const { return tier_.get(); }

  bool owns(Key key) const { return div_.remainder(key) == shard_; }
  // A key of the tables that this shard owns.
  bool holds(Key key) const { return key < num_keys_ && owns(key); }
  // Index of the key among this shard's rows.
  std::uint64_t local_of(Key key) const { return div_.quotient(key); }
  Key key_of(std::uint64_t local) const { return local * shards_ + shard_; }
  // Throws ProtocolError naming the key unless this shard holds it.
  void check_key(Key key) const {
    if (key >= num_keys_ || !owns(key)) [[unlikely]]
      refuse_key(key);
  }

  // The row of `key`, initialized on first use (not with a tier: pin()). Inline for the
  // common case (a row in place), out of line for a first touch.
  float* row(Key key) {
    const std::uint64_t local = local_of(key);
    float* chunk = chunks_[local / kChunkRows].load(std::memory_order_acquire);
    if (chunk != nullptr && states_[local].load(std::memory_order_acquire) >= kIdle) return chunk + (local % kChunkRows) * row_floats_;
    return first_touch(key);
  }
  // With a tier: the row of `key`, initialized on first use, pinned in memory until
  // tier()->unpin(local_of(key)) (disk_tier.h: `write`, `no_read`). IoError from the tier.
  float* pin(Key key, bool write, bool no_read = false);
  // Where the row at a local index lives; its chunk must exist (the row was touched). Not
  // with a tier.
  float* row_address(std::uint64_t local) const {
    return chunks_[local / kChunkRows].load(std::memory_order_acquire) + (local % kChunkRows) * row_floats_;
  }
  std::atomic<std::uint8_t>& state(std::uint64_t local) { return states_[local]; }
  const std::atomic<std::uint8_t>& state(std::uint64_t local) const { return states_[local]; }
  // Compare-and-swap idle to aggregating; false if the row was not idle.
  bool claim(std::uint64_t local) {
    std::uint8_t idle = kIdle;
    return states_[local].compare_exchange_strong(idle, kAggregating, std::memory_order_acq_rel);
  }

 private:
  float* first_touch(Key key);
  [[noreturn]] void refuse_key(Key key) const;
  std::size_t chunk_bytes() const { return kChunkRows * row_floats_ * sizeof(float); }

  std::uint64_t num_keys_ = 0, seed_ = 0;
  std::uint32_t shard_ = 0, shards_ = 1, dim_ = 0, row_floats_ = 0;
  OptimizerConfig optimizer_;
  std::function<void(const void* addr, std::size_t bytes)> on_chunk_;
  FastDiv div_;  // by the shard count: every key of every request is divided
  std::uint64_t local_rows_ = 0;
  std::unique_ptr<std::atomic<float*>[]> chunks_;
  std::uint64_t chunk_count_ = 0;
  // Per row: its Lifecycle (huge pages: looked up at random, as the rows are).
  std::vector<std::atomic<std::uint8_t>, HugePageAllocator<std::atomic<std::uint8_t>>> states_;
  std::atomic<std::uint64_t> initialized_count_{0};
  std::unique_ptr<DiskTier> tier_;
};

}  // namespace ember::ps
