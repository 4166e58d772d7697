// LocationMap: for every row of the global key space, which worker holds its latest
// copy (and whether that copy is dirty: newer than the PS), and which workers hold an
// un-aggregated partial gradient of it. LAIA scores a sample with one lookup per row.
//
// Invariant between iterations (DESIGN.md, row states): a row has at most one latest
// holder (clean or dirty), or a set of partial holders, or neither (the PS holds the
// latest). Flat arrays over the dense key space: 9 bytes per row, no hashing.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "ember/common/types.h"

namespace ember::cache {

class LocationMap {
 public:
  static constexpr std::uint32_t kMaxWorkers = 64;
  static constexpr std::uint8_t kNoOwner = 0x7f;

  LocationMap(std::uint64_t num_keys, std::uint32_t workers);

  std::uint64_t num_keys() const { return owner_.size(); }
  // The latest holder of `key`, or kNoOwner. Accesses are relaxed atomics: the
  // scheduler updates different workers' rows from parallel threads.
  std::uint8_t owner(Key key) const { return load(key) & 0x7f; }
  bool dirty(Key key) const { return (load(key) & 0x80) != 0; }
  void set_owner(Key key, WorkerId w, bool dirty) { store(key, static_cast<std::uint8_t>(w | (dirty ? 0x80 : 0))); }
  void clear_owner(Key key) { store(key, kNoOwner); }
  void set_clean(Key key) { store(key, load(key) & 0x7f); }

  // Workers holding a partial gradient of `key` (bit w). The HET-style policy keeps
  // its set of copy holders here instead.
  std::uint64_t partial(Key key) const { return std::atomic_ref<const std::uint64_t>(partial_[key]).load(std::memory_order_relaxed); }
  void set_partial(Key key, std::uint64_t mask) { std::atomic_ref<std::uint64_t>(partial_[key]).store(mask, std::memory_order_relaxed); }
  void set_partial_bit(Key key, WorkerId w) {
    std::atomic_ref<std::uint64_t>(partial_[key]).fetch_or(std::uint64_t{1} << w, std::memory_order_relaxed);
  }
  // Clears worker w's bit; returns the mask left.
  std::uint64_t clear_partial_bit(Key key, WorkerId w) {
    const std::uint64_t b = std::uint64_t{1} << w;
    return std::atomic_ref<std::uint64_t>(partial_[key]).fetch_and(~b, std::memory_order_relaxed) & ~b;
  }

  std::size_t memory_bytes() const { return owner_.size() * (sizeof(std::uint8_t) + sizeof(std::uint64_t)); }

 private:
  std::uint8_t load(Key key) const { return std::atomic_ref<const std::uint8_t>(owner_[key]).load(std::memory_order_relaxed); }
  void store(Key key, std::uint8_t v) { std::atomic_ref<std::uint8_t>(owner_[key]).store(v, std::memory_order_relaxed); }

  std::vector<std::uint8_t> owner_;    // bit 7 dirty, bits 0-6 worker (kNoOwner = none)
  std::vector<std::uint64_t> partial_;
};

}  // namespace ember::cache
