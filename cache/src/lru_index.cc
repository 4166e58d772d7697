#include "ember/cache/lru_index.h"

#include <algorithm>

#include "ember/common/error.h"

namespace ember::cache {

LruIndex::LruIndex(std::uint32_t capacity, bool lookahead) : capacity_(capacity), map_(capacity), keys_(capacity), stamp_(capacity, 0) {
  if (lookahead) {
    released_.assign(capacity, 0);
    generation_.assign(capacity, 0);
  }
  queue_.reserve(2 * static_cast<std::size_t>(capacity) + 1024);
  // A stack of free slots, 0 on top: deterministic, O(1).
  free_.reserve(capacity);
  for (std::uint32_t s = capacity; s > 0; --s) free_.push_back(s - 1);
}

void LruIndex::append(std::uint32_t slot) {
  if (queue_.size() >= 2 * static_cast<std::size_t>(capacity_) + 1024 || next_stamp_ >= kKept) compact();
  stamp_[slot] = next_stamp_;
  queue_.push_back({slot, next_stamp_++});
}

void LruIndex::compact() {
  // Keep the live entries in order and renumber their stamps from 1.
  std::size_t out = 0;
  std::uint32_t stamp = 1;
  for (std::size_t i = head_; i < queue_.size(); ++i) {
    Entry e = queue_[i];
    if (stamp_[e.slot] != e.stamp) continue;
    stamp_[e.slot] = stamp;
    queue_[out++] = {e.slot, stamp++};
  }
  queue_.resize(out);
  head_ = 0;
  next_stamp_ = stamp;
}

void LruIndex::skip_stale() {
  while (head_ < queue_.size() && stamp_[queue_[head_].slot] != queue_[head_].stamp) ++head_;
}

std::uint32_t LruIndex::insert(Key key) {
  if (full()) throw Error("LruIndex::insert into a full cache");
  std::uint32_t s = free_.back();
  free_.pop_back();
  keys_[s] = key;
  map_[key] = s;
  append(s);
  ++size_;
  return s;
}

std::uint32_t LruIndex::insert_held(Key key) {
  if (full()) throw Error("LruIndex::insert_held into a full cache");
  std::uint32_t s = free_.back();
  free_.pop_back();
  keys_[s] = key;
  map_[key] = s;
  stamp_[s] = kHeld;
  ++size_;
  return s;
}

void LruIndex::hold(std::uint32_t slot) {
  if (stamp_[slot] == kKept) {
    --kept_;
    ++generation_[slot];
  }
  stamp_[slot] = kHeld;
}

void LruIndex::release(std::uint32_t slot, std::uint32_t next_use) {
  released_[slot] = ++clock_;
  if (next_use == kNever) {
    append(slot);
  } else {
    push_kept(slot, next_use);
  }
}

void LruIndex::keep_until(std::uint32_t slot, std::uint32_t next_use) {
  if (stamp_[slot] == kKept) return;
  push_kept(slot, next_use);
}

void LruIndex::push_kept(std::uint32_t slot, std::uint32_t next_use) {
  if (heap_.size() >= 2 * static_cast<std::size_t>(capacity_) + 1024) {
    // Drop the dead entries (their slots left the heap since).
    std::erase_if(heap_, [&](const KeptEntry& e) { return e.generation != generation_[e.slot] || stamp_[e.slot] != kKept; });
    std::make_heap(heap_.begin(), heap_.end(), heap_less);
  }
  stamp_[slot] = kKept;
  ++kept_;
  heap_.push_back({next_use, slot, released_[slot], ++generation_[slot]});
  std::push_heap(heap_.begin(), heap_.end(), heap_less);
}

void LruIndex::freed(std::uint32_t slot) {
  if (stamp_[slot] == kKept) {
    --kept_;
    ++generation_[slot];
  }
  stamp_[slot] = 0;
  free_.push_back(slot);
  --size_;
}

std::uint32_t LruIndex::victim_slot() {
  skip_stale();
  if (head_ < queue_.size()) return queue_[head_].slot;
  // Every row left is kept or held: the kept row needed last goes (dead heap entries,
  // whose slots left the heap since, are dropped on the way).
  for (;;) {
    if (heap_.empty()) throw Error("LruIndex: every row is held, none can be evicted");
    const KeptEntry& e = heap_.front();
    if (e.generation == generation_[e.slot] && stamp_[e.slot] == kKept) return e.slot;
    std::pop_heap(heap_.begin(), heap_.end(), heap_less);
    heap_.pop_back();
  }
}

Key LruIndex::victim() { return keys_[victim_slot()]; }

std::uint32_t LruIndex::evict(Key& key) {
  const std::uint32_t s = victim_slot();
  if (head_ < queue_.size()) {
    ++head_;  // the LRU queue's front (victim_slot skipped its stale entries)
  } else {
    std::pop_heap(heap_.begin(), heap_.end(), heap_less);
    heap_.pop_back();
  }
  key = keys_[s];
  map_.erase(key);
  freed(s);
  return s;
}

std::uint32_t LruIndex::erase(Key key) {
  std::uint32_t s;
  if (!map_.erase(key, s)) return kNone;
  freed(s);
  return s;
}

std::vector<Key> LruIndex::keys_lru_order() const {
  std::vector<Key> out;
  for (std::size_t i = head_; i < queue_.size(); ++i) {
    if (stamp_[queue_[i].slot] == queue_[i].stamp) out.push_back(keys_[queue_[i].slot]);
  }
  return out;
}

std::size_t LruIndex::memory_bytes() const {
  return map_.memory_bytes() + keys_.capacity() * sizeof(Key) + stamp_.capacity() * sizeof(std::uint32_t) +
         queue_.capacity() * sizeof(Entry) + free_.capacity() * sizeof(std::uint32_t) + released_.capacity() * sizeof(std::uint64_t) +
         generation_.capacity() * sizeof(std::uint32_t) + heap_.capacity() * sizeof(KeptEntry);
}

}  // namespace ember::cache
