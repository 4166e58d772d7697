// One worker's cache as the scheduler models it: one LRU (the default), or several when a
// placement gives tables cache shares of their own (plan_file.h): group 0, the pool the
// other cached tables share, then one LRU per table with a share, each over its own range
// of slots (group g's slots follow group g - 1's). Operations on a key go to its group's
// LRU; operations on a slot to the group whose range holds it. Slots are the worker's
// (what the plans name).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ember/cache/lru_index.h"
#include "ember/common/types.h"

namespace ember::scheduler {

class WorkerCache {
 public:
  static constexpr std::uint32_t kNone = cache::LruIndex::kNone;

  // capacities[g]: group g's rows; group_of_key[k]: key k's group (null: one group). The
  // map is never changed once made: copies of the cache share it, so the default copy
  // is a full, independent copy of the cache.
  WorkerCache(const std::vector<std::uint32_t>& capacities, bool by_next_use, std::shared_ptr<const std::vector<std::uint8_t>> group_of_key)
      : group_of_key_(capacities.size() > 1 ? std::move(group_of_key) : nullptr) {
    groups_.reserve(capacities.size());
    std::uint32_t off = 0;
    for (std::uint32_t c : capacities) {
      groups_.emplace_back(c, by_next_use);
      offset_.push_back(off);
      off += c;
    }
    total_ = off;
  }

  std::uint32_t capacity() const { return total_; }
  std::uint32_t size() const {
    std::uint32_t n = 0;
    for (const auto& g : groups_) n += g.size();
    return n;
  }
  std::uint32_t groups() const { return static_cast<std::uint32_t>(groups_.size()); }
  std::uint32_t group_capacity(std::uint32_t g) const { return groups_[g].capacity(); }
  std::uint32_t group(Key k) const { return group_of_key_ == nullptr ? 0 : (*group_of_key_)[k]; }

  // By key: the key's group.
  std::uint32_t find(Key k) const { return global(group(k), groups_[group(k)].find(k)); }
  bool contains(Key k) const { return groups_[group(k)].contains(k); }
  void prefetch(Key k) const { groups_[group(k)].prefetch(k); }
  // Group 0's coming victims (LruIndex::prefetch_victim): with one group, the cache's.
  Key prefetch_victim(std::size_t ahead) const { return groups_[0].prefetch_victim(ahead); }
  void prefetch_victim_slot(std::size_t ahead) const { groups_[0].prefetch_victim_slot(ahead); }
  std::uint32_t erase(Key k) { return global(group(k), groups_[group(k)].erase(k)); }
  // Whether k's group is full; evicts from it (its LRU row; by next use as LruIndex).
  bool full(Key k) const { return groups_[group(k)].full(); }
  // The row evict(k, ...) would take from k's group, left in place.
  Key victim(Key k) { return groups_[group(k)].victim(); }
  std::uint32_t evict(Key k, Key& evicted) { return global(group(k), groups_[group(k)].evict(evicted)); }
  std::uint32_t insert(Key k) { return global(group(k), groups_[group(k)].insert(k)); }
  std::uint32_t insert_held(Key k) { return global(group(k), groups_[group(k)].insert_held(k)); }

  // By slot: the group whose range holds it.
  void touch(std::uint32_t slot) {
    at(slot, [](cache::LruIndex& g, std::uint32_t s) { g.touch(s); });
  }
  void hold(std::uint32_t slot) {
    at(slot, [](cache::LruIndex& g, std::uint32_t s) { g.hold(s); });
  }
  void release(std::uint32_t slot, std::uint32_t next_use) {
    at(slot, [next_use](cache::LruIndex& g, std::uint32_t s) { g.release(s, next_use); });
  }
  void keep_until(std::uint32_t slot, std::uint32_t next_use) {
    at(slot, [next_use](cache::LruIndex& g, std::uint32_t s) { g.keep_until(s, next_use); });
  }
  void prefetch_slot(std::uint32_t slot) const {
    const std::uint32_t g = group_of_slot(slot);
    groups_[g].prefetch_slot(slot - offset_[g]);
  }
  bool occupied(std::uint32_t slot) const {
    const std::uint32_t g = group_of_slot(slot);
    return groups_[g].occupied(slot - offset_[g]);
  }
  Key key_at(std::uint32_t slot) const {
    const std::uint32_t g = group_of_slot(slot);
    return groups_[g].key_at(slot - offset_[g]);
  }

  // Group 0's keys in LRU order (tests: with one group, the whole cache's).
  std::vector<Key> keys_lru_order() const { return groups_[0].keys_lru_order(); }
  std::size_t memory_bytes() const {
    std::size_t b = 0;
    for (const auto& g : groups_) b += g.memory_bytes();
    return b;
  }

 private:
  std::uint32_t global(std::uint32_t g, std::uint32_t local) const { return local == kNone ? kNone : local + offset_[g]; }
  std::uint32_t group_of_slot(std::uint32_t slot) const {
    std::uint32_t g = 0;
    while (g + 1 < offset_.size() && slot >= offset_[g + 1]) ++g;
    return g;
  }
  template <typename F>
  void at(std::uint32_t slot, F&& f) {
    const std::uint32_t g = group_of_slot(slot);
    f(groups_[g], slot - offset_[g]);
  }

  std::shared_ptr<const std::vector<std::uint8_t>> group_of_key_;
  std::vector<cache::LruIndex> groups_;
  std::vector<std::uint32_t> offset_;
  std::uint32_t total_ = 0;
};

// Every worker's cache as one scheduler models it: empty for the workers it does not
// model (SchedulerConfig::model_host).
using WorkerCaches = std::vector<std::optional<WorkerCache>>;

}  // namespace ember::scheduler
