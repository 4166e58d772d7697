#include "ember/cache/lru_index.h"

#include "ember/common/error.h"

namespace ember::cache {

LruIndex::LruIndex(std::uint32_t capacity)
    : capacity_(capacity), map_(capacity), keys_(capacity), prev_(capacity), next_(capacity) {
  // A stack of free slots, 0 on top: deterministic, O(1).
  free_.reserve(capacity);
  for (std::uint32_t s = capacity; s > 0; --s) free_.push_back(s - 1);
}

void LruIndex::unlink(std::uint32_t s) {
  std::uint32_t p = prev_[s], n = next_[s];
  if (p != kNone) next_[p] = n; else head_ = n;
  if (n != kNone) prev_[n] = p; else tail_ = p;
}

void LruIndex::push_back(std::uint32_t s) {
  prev_[s] = tail_;
  next_[s] = kNone;
  if (tail_ != kNone) next_[tail_] = s; else head_ = s;
  tail_ = s;
}

void LruIndex::touch(std::uint32_t s) {
  if (s == tail_) return;
  unlink(s);
  push_back(s);
}

std::uint32_t LruIndex::insert(Key key) {
  if (full()) throw Error("LruIndex::insert into a full cache");
  std::uint32_t s = free_.back();
  free_.pop_back();
  keys_[s] = key;
  map_[key] = s;
  push_back(s);
  ++size_;
  return s;
}

std::uint32_t LruIndex::evict(Key& key) {
  std::uint32_t s = head_;
  key = keys_[s];
  unlink(s);
  map_.erase(key);
  free_.push_back(s);
  --size_;
  return s;
}

std::uint32_t LruIndex::erase(Key key) {
  const std::uint32_t* p = map_.find(key);
  if (p == nullptr) return kNone;
  std::uint32_t s = *p;
  unlink(s);
  map_.erase(key);
  free_.push_back(s);
  --size_;
  return s;
}

std::vector<Key> LruIndex::keys_lru_order() const {
  std::vector<Key> out;
  for (std::uint32_t s = head_; s != kNone; s = next_[s]) out.push_back(keys_[s]);
  return out;
}

std::size_t LruIndex::memory_bytes() const {
  return map_.memory_bytes() + keys_.capacity() * sizeof(Key) + (prev_.capacity() + next_.capacity() + free_.capacity()) * sizeof(std::uint32_t);
}

}  // namespace ember::cache
