// LruIndex: which rows a worker's cache holds, in which slot, in recency order.
//
// Exact LRU with O(1) find / touch / insert / evict / erase: an open-addressing map from
// row key to slot, and a doubly linked recency list threaded through flat slot arrays
// (no per-entry allocation). Freed slots are reused last-freed-first, so the same
// sequence of operations gives the same slots in every process: the scheduler's model
// of a worker's cache and the worker's real cache agree slot for slot.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/common/types.h"

namespace ember::cache {

class LruIndex {
 public:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};

  explicit LruIndex(std::uint32_t capacity);

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
  void touch(std::uint32_t slot);
  // Adds `key` (absent) as most recently used; the cache must not be full.
  std::uint32_t insert(Key key);
  // The least recently used key (cache not empty).
  Key lru_key() const { return keys_[head_]; }
  // Removes the least recently used entry; returns its slot (now free) and key.
  std::uint32_t evict(Key& key);
  // Removes `key` if present; returns its former slot or kNone.
  std::uint32_t erase(Key key);
  Key key_at(std::uint32_t slot) const { return keys_[slot]; }

  // Keys from least to most recently used (tests, debugging).
  std::vector<Key> keys_lru_order() const;
  // Bytes held by the index (map + slot arrays).
  std::size_t memory_bytes() const;

 private:
  void unlink(std::uint32_t slot);
  void push_back(std::uint32_t slot);

  std::uint32_t capacity_;
  std::uint32_t size_ = 0;
  U64Map<std::uint32_t> map_;
  std::vector<Key> keys_;
  std::vector<std::uint32_t> prev_, next_;
  std::uint32_t head_ = kNone, tail_ = kNone;  // LRU end, MRU end
  std::vector<std::uint32_t> free_;  // stack of free slots
};

}  // namespace ember::cache
