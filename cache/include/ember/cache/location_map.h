// LocationMap: for every row of the global key space, which worker holds its latest
// copy (and whether that copy is dirty: newer than the PS), and how many workers hold an
// un-aggregated partial gradient of it, with the list of those holders that this process
// models. LAIA scores a sample with one lookup per row.
//
// Invariant between iterations (docs/design.md, row states): a row has at most one latest
// holder (clean or dirty), or a set of partial holders, or neither (the PS holds the
// latest). Flat arrays over the dense key space, 10 bytes per row whatever the worker
// count: the owner (2 bytes), the partial holders' count (2), flags (1, padded to 2) and
// the index of the modelled holders' list (4). The lists live in one pool; their entries
// are bounded by the modelled workers' cache slots, not by the job's worker count.
//
// A scheduler that models only some workers (a host's) keeps the owner, flags and counts
// of every row, as every process must agree on them, but lists only its own workers as
// partial holders: the others' evictions reach it as counts (remove_partial, listed
// false).
//
// A flush (an evaluation, a checkpoint) sends the PS a dirty owner's value or the partial
// holders' gradients without changing these states: the row is then marked flushed, the
// PS already has what the contract would push later, and those pushes are skipped. So
// flushes never change allocation or eviction, and a job resumed from a checkpoint can
// rebuild the exact state an uninterrupted run has (docs/checkpoints.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "ember/common/huge_pages.h"
#include "ember/common/types.h"

namespace ember::cache {

class LocationMap {
 public:
  // Worker ids are 16 bits (kNoOwner excluded).
  static constexpr std::uint32_t kMaxWorkers = 65535;
  static constexpr std::uint16_t kNoOwner = 0xffff;

  LocationMap(std::uint64_t num_keys, std::uint32_t workers);

  std::uint64_t num_keys() const { return state_.size(); }
  // The latest holder of `key`, or kNoOwner. Accesses are relaxed atomics: the
  // scheduler updates different workers' rows from parallel threads.
  std::uint16_t owner(Key key) const { return relaxed_load(state_[key].owner); }
  bool dirty(Key key) const { return (flags(key) & kDirty) != 0; }
  // A new state (set_owner, set_clean, set_partials) ends a flushed mark.
  void set_owner(Key key, WorkerId w, bool dirty) {
    relaxed_store(state_[key].owner, static_cast<std::uint16_t>(w));
    store_flags(key, dirty ? kDirty : 0);
  }
  void clear_owner(Key key) { relaxed_store(state_[key].owner, kNoOwner); }
  void set_clean(Key key) { store_flags(key, 0); }
  // The PS holds the row's pending update (the dirty owner's value, or the aggregate of
  // every partial holder's gradient): it was flushed, and the copies stay as they were.
  bool flushed(Key key) const { return (flags(key) & kFlushed) != 0; }
  void set_flushed(Key key, bool on) { store_flags(key, static_cast<std::uint8_t>((flags(key) & ~kFlushed) | (on ? kFlushed : 0))); }
  // Prefetches the row's entry (the scheduler reads it for every distinct row), and its
  // list of partial holders (for writing).
  void prefetch(Key key) const { __builtin_prefetch(&state_[key]); }
  void prefetch_partial(Key key) const { __builtin_prefetch(&list_[key], 1); }

  // Workers holding a partial gradient of `key`, every worker counted.
  std::uint32_t partials(Key key) const { return relaxed_load(state_[key].partials); }
  bool has_partial(Key key) const { return partials(key) != 0; }
  // f(w) for each listed (modelled) partial holder, in increasing order.
  template <typename F>
  void for_each_partial(Key key, F&& f) const {
    const std::uint32_t at = list_[key];
    if (at == 0) return;
    const std::uint16_t* p = &pool_[at];
    for (std::uint32_t j = 0; j < p[0]; ++j) f(static_cast<WorkerId>(p[2 + j]));
  }
  // Whether w is a listed partial holder.
  bool is_partial(Key key, WorkerId w) const;
  // The row's partial holders become `listed` (increasing worker ids, the modelled ones)
  // out of `total`; set_partials(k, {}, 0) clears them.
  void set_partials(Key key, std::span<const std::uint16_t> listed, std::uint32_t total);
  void clear_partials(Key key) { set_partials(key, {}, 0); }
  // w's partial copy leaves (an eviction); `listed`: w is in the list. Not concurrently
  // with other changes of the same row.
  void remove_partial(Key key, WorkerId w, bool listed);

  // Bytes of the per-row arrays and of the lists' pool.
  std::size_t memory_bytes() const {
    return state_.size() * sizeof(Entry) + list_.size() * sizeof(std::uint32_t) + pool_.capacity() * sizeof(std::uint16_t);
  }

 private:
  static constexpr std::uint8_t kDirty = 1, kFlushed = 2;
  // Owner, count and flags are separate fields, so updates are plain (relaxed) stores:
  // no locked read-modify-write on the hot path.
  struct Entry {
    std::uint16_t owner;     // kNoOwner: none
    std::uint16_t partials;  // partial holders, every worker counted
    std::uint8_t flags;      // kDirty (of the owner's copy), kFlushed
  };
  template <typename T>
  static T relaxed_load(const T& x) {
    return std::atomic_ref<T>(const_cast<T&>(x)).load(std::memory_order_relaxed);
  }
  template <typename T>
  static void relaxed_store(T& x, T v) {
    std::atomic_ref<T>(x).store(v, std::memory_order_relaxed);
  }
  std::uint8_t flags(Key key) const { return relaxed_load(state_[key].flags); }
  void store_flags(Key key, std::uint8_t v) { relaxed_store(state_[key].flags, v); }
  // The pool's blocks: [size, size class c, 2^c worker ids]; free blocks by class.
  std::uint32_t take_block(std::uint32_t cls);
  void give_block(std::uint32_t at) { free_[pool_[at + 1]].push_back(at); }

  std::vector<Entry, HugePageAllocator<Entry>> state_;
  std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>> list_;  // key -> block in pool_ (0: none)
  std::vector<std::uint16_t> pool_;
  std::vector<std::vector<std::uint32_t>> free_;
};

}  // namespace ember::cache
