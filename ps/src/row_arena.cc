#include "ember/ps/row_arena.h"

#include <string>
#include <thread>

#include "ember/common/error.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {

std::uint64_t RowArena::local_rows(const StoreConfig& c) { return c.num_keys > c.shard ? (c.num_keys - 1 - c.shard) / c.shards + 1 : 0; }

RowArena::RowArena(const StoreConfig& c, std::uint32_t row_floats)
    : num_keys_(c.num_keys),
      seed_(c.seed),
      shard_(c.shard),
      shards_(c.shards),
      dim_(c.dim),
      row_floats_(row_floats),
      optimizer_(c.optimizer),
      on_chunk_(c.on_chunk),
      div_(c.shards),
      local_rows_(local_rows(c)) {
  chunk_count_ = (local_rows_ + kChunkRows - 1) / kChunkRows;
  try {
    chunks_ = std::make_unique<std::atomic<float*>[]>(chunk_count_);
    states_ = decltype(states_)(local_rows_);  // all kNew
  } catch (const std::bad_alloc&) {
    throw ConfigError("cannot allocate the row index of shard " + std::to_string(shard_) + " (" + std::to_string(local_rows_) +
                      " rows): add shards");
  }
  for (std::uint64_t i = 0; i < chunk_count_; ++i) chunks_[i].store(nullptr);
  if (!c.tier.dir.empty()) {
    // No chunks, and no on_chunk: rows on the tier move between memory and disk, so
    // replies of them are copied.
    tier_ = std::make_unique<DiskTier>(c.tier, shard_, shards_, local_rows_, std::uint64_t{row_floats_} * sizeof(float));
  }
}

RowArena::~RowArena() {
  if (tier_) return;  // the chunks are the tier's mapping
  for (std::uint64_t i = 0; chunks_ && i < chunk_count_; ++i) huge_free(chunks_[i].load(), chunk_bytes());
}

RowArena::RowArena(RowArena&& o) noexcept
    : num_keys_(o.num_keys_),
      seed_(o.seed_),
      shard_(o.shard_),
      shards_(o.shards_),
      dim_(o.dim_),
      row_floats_(o.row_floats_),
      optimizer_(o.optimizer_),
      on_chunk_(std::move(o.on_chunk_)),
      div_(o.div_),
      local_rows_(o.local_rows_),
      chunks_(std::move(o.chunks_)),
      chunk_count_(o.chunk_count_),
      states_(std::move(o.states_)),
      initialized_count_(o.initialized_count_.load()),
      tier_(std::move(o.tier_)) {
  o.chunk_count_ = 0;
}

void RowArena::refuse_key(Key key) const {
  if (key >= num_keys_) {
    throw ProtocolError("key " + std::to_string(key) + " is beyond the " + std::to_string(num_keys_) + " rows of the tables");
  }
  throw ProtocolError("key " + std::to_string(key) + " belongs to shard " + std::to_string(owner_shard(key, shards_)) + ", not " +
                      std::to_string(shard_));
}

float* RowArena::first_touch(Key key) {
  const std::uint64_t local = local_of(key);
  std::atomic<float*>& slot = chunks_[local / kChunkRows];
  float* chunk = slot.load(std::memory_order_acquire);
  if (chunk == nullptr) {
    // First touch of this chunk: whoever installs it first wins; the others free theirs.
    // On huge pages where the host allows: rows are read at random, and on 4 KiB pages
    // nearly every row would also miss the TLB.
    float* fresh = static_cast<float*>(huge_alloc(chunk_bytes()));
    if (slot.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      chunk = fresh;
      if (on_chunk_) on_chunk_(chunk, chunk_bytes());
    } else {
      huge_free(fresh, chunk_bytes());
    }
  }
  float* p = chunk + (local % kChunkRows) * row_floats_;
  std::atomic<std::uint8_t>& state = states_[local];
  if (state.load(std::memory_order_acquire) < kIdle) {
    std::uint8_t expected = kNew;
    if (state.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
      initial_row(seed_, key, dim_, p);
      init_state(optimizer_, dim_, p + dim_);
      state.store(kIdle, std::memory_order_release);
      initialized_count_.fetch_add(1, std::memory_order_relaxed);
    } else {
      while (state.load(std::memory_order_acquire) < kIdle) std::this_thread::yield();  // another thread is initializing it
    }
  }
  return p;
}

float* RowArena::pin(Key key, bool write, bool no_read) {
  const std::uint64_t local = local_of(key);
  std::atomic<std::uint8_t>& state = states_[local];
  if (state.load(std::memory_order_acquire) < kIdle) {
    std::uint8_t expected = kNew;
    if (state.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
      float* p = nullptr;
      try {
        p = tier_->pin(local, true, true);  // never written: nothing to read
      } catch (...) {
        state.store(kNew, std::memory_order_release);
        throw;
      }
      initial_row(seed_, key, dim_, p);
      init_state(optimizer_, dim_, p + dim_);
      state.store(kIdle, std::memory_order_release);
      initialized_count_.fetch_add(1, std::memory_order_relaxed);
      return p;
    }
    while (state.load(std::memory_order_acquire) < kIdle) {
      if (state.load(std::memory_order_acquire) == kNew) return pin(key, write, no_read);  // its initializer failed
      std::this_thread::yield();                                                           // another thread is initializing it
    }
  }
  return tier_->pin(local, write, no_read);
}

}  // namespace ember::ps
