// LocationMap: for every row of the global key space, which worker holds its latest
// copy (and whether that copy is dirty: newer than the PS), and which workers hold an
// un-aggregated partial gradient of it. LAIA scores a sample with one lookup per row.
//
// Invariant between iterations (docs/design.md, row states): a row has at most one latest
// holder (clean or dirty), or a set of partial holders, or neither (the PS holds the
// latest). Flat arrays over the dense key space: 10 bytes per row, no hashing.
//
// A flush (an evaluation, a checkpoint) sends the PS a dirty owner's value or the partial
// holders' gradients without changing these states: the row is then marked flushed, the
// PS already has what the contract would push later, and those pushes are skipped. So
// flushes never change allocation or eviction, and a job resumed from a checkpoint can
// rebuild the exact state an uninterrupted run has (docs/checkpoints.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "ember/common/huge_pages.h"
#include "ember/common/types.h"

namespace ember::cache {

class LocationMap {
 public:
  static constexpr std::uint32_t kMaxWorkers = 64;
  static constexpr std::uint8_t kNoOwner = 0x7f;

  LocationMap(std::uint64_t num_keys, std::uint32_t workers);

  std::uint64_t num_keys() const { return state_.size(); }
  // The latest holder of `key`, or kNoOwner. Accesses are relaxed atomics: the
  // scheduler updates different workers' rows from parallel threads.
  std::uint8_t owner(Key key) const { return load(key) & 0x7f; }
  bool dirty(Key key) const { return (load(key) & 0x80) != 0; }
  // A new state (set_owner, set_partial, set_clean) ends a flushed mark.
  void set_owner(Key key, WorkerId w, bool dirty) {
    store_owner(key, static_cast<std::uint8_t>(w | (dirty ? 0x80 : 0)));
    set_flushed(key, false);
  }
  void clear_owner(Key key) { store_owner(key, kNoOwner); }
  void set_clean(Key key) {
    store_owner(key, static_cast<std::uint8_t>(load(key) & 0x7f));
    set_flushed(key, false);
  }
  // The PS holds the row's pending update (the dirty owner's value, or the aggregate of
  // every partial holder's gradient): it was flushed, and the copies stay as they were.
  bool flushed(Key key) const { return (flags(key) & kFlushed) != 0; }
  void set_flushed(Key key, bool on) { store_flags(key, static_cast<std::uint8_t>((flags(key) & ~kFlushed) | (on ? kFlushed : 0))); }
  // Prefetches the row's entry (the scheduler reads it for every distinct row), and its
  // partial mask (for writing).
  void prefetch(Key key) const { __builtin_prefetch(&state_[key]); }
  void prefetch_partial(Key key) const { __builtin_prefetch(&partial_[key], 1); }
  // Whether the row has partial holders (without reading the mask).
  bool has_partial(Key key) const { return flag(key); }

  // Workers holding a partial gradient of `key` (bit w). A flag beside the owner says
  // whether the mask is non-zero, so rows without partials cost one memory access.
  std::uint64_t partial(Key key) const { return flag(key) ? relaxed_load(partial_[key]) : 0; }
  void set_partial(Key key, std::uint64_t mask) {
    relaxed_store(partial_[key], mask);
    store_flags(key, mask != 0 ? kHasPartial : 0);
  }
  // Clears worker w's bit; returns the mask left. Safe when several workers clear bits
  // of one row concurrently (evictions); not concurrently with set_partial.
  std::uint64_t clear_partial_bit(Key key, WorkerId w) {
    const std::uint64_t b = std::uint64_t{1} << w;
    std::uint64_t left = std::atomic_ref<std::uint64_t>(partial_[key]).fetch_and(~b, std::memory_order_relaxed) & ~b;
    if (left == 0) set_flag(key, false);
    return left;
  }

  // A plain per-row worker mask for policies that track every copy (het), without the
  // flag; safe to set and clear bits concurrently.
  std::uint64_t holders(Key key) const { return relaxed_load(partial_[key]); }
  void set_holders(Key key, std::uint64_t mask) { relaxed_store(partial_[key], mask); }
  void add_holder(Key key, WorkerId w) {
    std::atomic_ref<std::uint64_t>(partial_[key]).fetch_or(std::uint64_t{1} << w, std::memory_order_relaxed);
  }
  void remove_holder(Key key, WorkerId w) {
    std::atomic_ref<std::uint64_t>(partial_[key]).fetch_and(~(std::uint64_t{1} << w), std::memory_order_relaxed);
  }

  std::size_t memory_bytes() const { return state_.size() * (sizeof(Entry) + sizeof(std::uint64_t)); }

 private:
  static constexpr std::uint8_t kHasPartial = 1, kFlushed = 2;
  // Owner and flags are separate bytes, so updates are plain (relaxed) stores: no locked
  // read-modify-write on the hot path. Only the partial masks need atomic bit clears.
  struct Entry {
    std::uint8_t owner;  // bit 7 dirty, bits 0-6 worker (kNoOwner = none)
    std::uint8_t flags;  // kHasPartial: the partial mask is non-zero; kFlushed
  };
  template <typename T>
  static T relaxed_load(const T& x) {
    return std::atomic_ref<T>(const_cast<T&>(x)).load(std::memory_order_relaxed);
  }
  template <typename T>
  static void relaxed_store(T& x, T v) {
    std::atomic_ref<T>(x).store(v, std::memory_order_relaxed);
  }
  std::uint8_t load(Key key) const { return relaxed_load(state_[key].owner); }
  void store_owner(Key key, std::uint8_t v) { relaxed_store(state_[key].owner, v); }
  std::uint8_t flags(Key key) const { return relaxed_load(state_[key].flags); }
  void store_flags(Key key, std::uint8_t v) { relaxed_store(state_[key].flags, v); }
  bool flag(Key key) const { return (flags(key) & kHasPartial) != 0; }
  // Concurrent callers (evictions clearing bits of one row) store the same value.
  void set_flag(Key key, bool on) { store_flags(key, static_cast<std::uint8_t>((flags(key) & ~kHasPartial) | (on ? kHasPartial : 0))); }

  std::vector<Entry, HugePageAllocator<Entry>> state_;
  std::vector<std::uint64_t, HugePageAllocator<std::uint64_t>> partial_;
};

}  // namespace ember::cache
