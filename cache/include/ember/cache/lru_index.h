// LruIndex: which rows a worker's cache holds, in which slot, in recency order.
//
// Exact LRU, O(1) amortized find / touch / insert / evict / erase, built for caches of
// millions of rows read at random:
//  - an open-addressing map from row key to slot (no per-entry allocation);
//  - recency as an append-only queue of (slot, stamp): a touch appends the slot with a
//    new stamp and records the stamp at the slot; queue entries whose stamp no longer
//    matches their slot's are stale and skipped when the LRU end is read. A touch costs
//    one sequential append instead of relinking list neighbours (two random accesses);
//    the queue is compacted (stamps renumbered) when it reaches twice the capacity.
// Freed slots are reused last-freed-first, so the same sequence of operations gives the
// same slots in every process: the scheduler's model of a worker's cache and the
// worker's real cache agree slot for slot.
//
// Lookahead eviction (constructed with `lookahead`; docs/scheduler.md): a row can also be
// held (a row of the current iteration: never evicted until released) or kept by its
// next use (a row a coming batch needs: out of the LRU order). evict() takes the least
// recently used row among the rest; only when none is left, the kept row needed last
// (the least recently released on ties). Kept rows sit in a max-heap with lazy
// deletion: an entry is live while its slot's generation is unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/common/huge_pages.h"
#include "ember/common/types.h"

namespace ember::cache {

class LruIndex {
 public:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};

  static constexpr std::uint32_t kNever = ~std::uint32_t{0};  // no next use known

  explicit LruIndex(std::uint32_t capacity, bool lookahead = false);

  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t size() const { return size_; }
  bool full() const { return size_ == capacity_; }

  // Slot of `key`, or kNone. Does not change recency.
  std::uint32_t find(Key key) const {
    const std::uint32_t* s = map_.find(key);
    return s ? *s : kNone;
  }
  bool contains(Key key) const { return map_.find(key) != nullptr; }
  // Makes `slot` the most recently used.
  void touch(std::uint32_t slot) {
    if (stamp_[slot] + 1 != next_stamp_) append(slot);
  }
  // Adds `key` (absent) as most recently used; the cache must not be full.
  std::uint32_t insert(Key key);
  // Removes the least recently used entry (lookahead: see above); returns its slot (now
  // free) and key.
  std::uint32_t evict(Key& key);
  // The key evict() would take now, left in place (an admission policy weighs it
  // against the newcomer first). The cache must not be empty.
  Key victim();

  // Lookahead only. Takes `slot` out of eviction's reach until released.
  void hold(std::uint32_t slot);
  // Adds `key` (absent) held; the cache must not be full.
  std::uint32_t insert_held(Key key);
  // Releases a held row as the most recently used: into the LRU order when no coming
  // batch needs it (next_use == kNever), else kept until `next_use`.
  void release(std::uint32_t slot, std::uint32_t next_use);
  // A row in the LRU order that a batch just seen needs at `next_use`: kept from now on
  // (a row already kept is kept for its earlier use).
  void keep_until(std::uint32_t slot, std::uint32_t next_use);
  // Rows kept by their next use (lookahead).
  std::uint32_t kept() const { return kept_; }
  // Removes `key` if present; returns its former slot or kNone.
  std::uint32_t erase(Key key);
  Key key_at(std::uint32_t slot) const { return keys_[slot]; }
  // Whether `slot` holds a row.
  bool occupied(std::uint32_t slot) const { return stamp_[slot] != 0; }

  // Prefetches the index entry `key` would be found at (batch lookups ahead of use).
  void prefetch(Key key) const { map_.prefetch(U64Map<std::uint32_t>::hash(key)); }
  // The key of the row `ahead` places from the front of the LRU order (the one evict()
  // takes that many evictions from now, unless rows are touched or kept meanwhile; stale
  // queue entries make it approximate), or kNoKey; its index entry prefetched. Pulls
  // look ahead with it so that the rows they evict are in cache when they go.
  static constexpr Key kNoKey = ~Key{0};
  Key prefetch_victim(std::size_t ahead) const {
    const std::size_t i = head_ + ahead;
    if (i >= queue_.size()) return kNoKey;
    const Key k = keys_[queue_[i].slot];
    map_.prefetch(U64Map<std::uint32_t>::hash(k));
    return k;
  }
  // Prefetches the recency stamp and key of the row `ahead` places from the front.
  void prefetch_victim_slot(std::size_t ahead) const {
    const std::size_t i = head_ + ahead;
    if (i < queue_.size()) __builtin_prefetch(&keys_[queue_[i].slot]);
  }
  // Prefetches a slot's recency stamp (before touch).
  void prefetch_slot(std::uint32_t slot) const { __builtin_prefetch(&stamp_[slot], 1); }

  // Keys in the LRU order, least recently used first (kept and held rows excluded;
  // tests, debugging).
  std::vector<Key> keys_lru_order() const;
  // Bytes held by the index.
  std::size_t memory_bytes() const;

 private:
  struct Entry {
    std::uint32_t slot;
    std::uint32_t stamp;
  };
  // A kept row: the heap's top is the latest next use, then the least recently released.
  struct KeptEntry {
    std::uint32_t next_use;
    std::uint32_t slot;
    std::uint64_t released;
    std::uint32_t generation;
  };
  static bool heap_less(const KeptEntry& a, const KeptEntry& b) {
    return a.next_use != b.next_use ? a.next_use < b.next_use : a.released > b.released;
  }
  // Stamps above every real one: held and kept slots have no live queue entry.
  static constexpr std::uint32_t kKept = ~std::uint32_t{0} - 1;
  static constexpr std::uint32_t kHeld = ~std::uint32_t{0};
  void append(std::uint32_t slot);
  void push_kept(std::uint32_t slot, std::uint32_t next_use);
  void freed(std::uint32_t slot);
  // The slot evict() takes now (stale queue and heap entries dropped on the way).
  std::uint32_t victim_slot();
  void compact();
  void skip_stale();

  std::uint32_t capacity_;
  std::uint32_t size_ = 0;
  U64Map<std::uint32_t> map_;
  std::vector<Key, HugePageAllocator<Key>> keys_;                       // slot -> key
  std::vector<std::uint32_t, HugePageAllocator<std::uint32_t>> stamp_;  // slot -> stamp (0 = free)
  std::vector<Entry, HugePageAllocator<Entry>> queue_;                  // recency, oldest first
  std::size_t head_ = 0;                                                // first entry not yet consumed
  std::uint32_t next_stamp_ = 1;
  std::vector<std::uint32_t> free_;  // stack of free slots
  // Lookahead only (empty otherwise).
  std::vector<std::uint64_t> released_;    // slot -> release clock
  std::vector<std::uint32_t> generation_;  // slot -> bumped whenever it leaves the heap
  std::vector<KeptEntry> heap_;
  std::uint64_t clock_ = 0;
  std::uint32_t kept_ = 0;
};

}  // namespace ember::cache
