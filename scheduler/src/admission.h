// Cache admission (--cache-admission tinylfu): TinyLFU's frequency sketch, as in
// Caffeine's W-TinyLFU. A count-min sketch of 4-bit counters (4 rows) counts in how many
// recent global batches each row appeared; a doorkeeper (a Bloom filter) takes a row's
// first appearance, so that one-time ids never reach the counters; after `sample`
// appearances every counter is halved and the doorkeeper cleared, so the counts follow
// what is recent. A missed row enters a full cache only if the sketch counts it more
// often than the row it would evict.
//
// Every process sees the same global batches and records them in the same order, so
// every worker's scheduler admits the same rows; a resumed job replays the scheduler
// from the first iteration (Loader), which rebuilds the sketch as it was.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ember/common/types.h"

namespace ember::scheduler {

class FrequencySketch {
 public:
  FrequencySketch() = default;
  // Counters for about `rows` rows (a cache's capacity), at least 1024; halved every
  // 10 x that many recorded appearances.
  explicit FrequencySketch(std::uint64_t rows);

  // One global batch's distinct rows, each counted once.
  void record(std::span<const Key> keys);
  // How often `k` appeared recently (0 to 16).
  std::uint32_t estimate(Key k) const;
  // Whether `newcomer` takes the slot of `victim`: strictly more frequent (ties keep the
  // cached row, as Caffeine does).
  bool admits(Key newcomer, Key victim) const { return estimate(newcomer) > estimate(victim); }
  std::size_t memory_bytes() const { return counters_.capacity() + door_.capacity() * sizeof(std::uint64_t); }

 private:
  void add(Key k);
  void age();
  // The doorkeeper's two bits of a mixed key, and whether both are set.
  std::array<std::uint64_t, 2> door_bits(std::uint64_t h) const;
  bool in_door(std::uint64_t h) const;
  // Index in counters_ of a mixed key's counter in sketch row `row`.
  std::size_t counter(std::uint64_t h, std::uint32_t row) const;

  std::vector<std::uint8_t> counters_;  // 4 rows of width_ counters (saturating at 15)
  std::vector<std::uint64_t> door_;     // doorkeeper bits
  std::uint64_t width_ = 0;             // a power of two
  std::uint64_t added_ = 0, sample_ = 0;
};

}  // namespace ember::scheduler
