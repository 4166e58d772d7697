#include "admission.h"

#include <algorithm>
#include <array>
#include <bit>

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kRows = 4;
constexpr std::uint8_t kMax = 15;

// splitmix64's finalizer: each of the sketch's rows and the doorkeeper's two bits take
// their own bits of one mixed key.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t row_hash(std::uint64_t h, std::uint32_t row) { return mix(h + 0x632be59bd9b4e019ULL * (row + 1)); }

}  // namespace

FrequencySketch::FrequencySketch(std::uint64_t rows)
    : width_(std::bit_ceil(std::max<std::uint64_t>(rows, 1024))), sample_(10 * std::max<std::uint64_t>(rows, 1024)) {
  counters_.assign(kRows * width_, 0);
  // Two bits per appearance of a sample: the doorkeeper stays sparse until it is cleared
  // (a full one would pass one-time rows on to the counters).
  door_.assign((2 * sample_ + 63) / 64, 0);
}

void FrequencySketch::record(std::span<const Key> keys) {
  for (Key k : keys) add(k);
}

std::array<std::uint64_t, 2> FrequencySketch::door_bits(std::uint64_t h) const {
  const std::uint64_t bits = door_.size() * 64;
  return {h % bits, (h >> 32) % bits};
}

bool FrequencySketch::in_door(std::uint64_t h) const {
  return std::ranges::all_of(door_bits(h), [&](std::uint64_t b) { return (door_[b / 64] >> (b % 64) & 1) != 0; });
}

std::size_t FrequencySketch::counter(std::uint64_t h, std::uint32_t row) const { return row * width_ + (row_hash(h, row) & (width_ - 1)); }

void FrequencySketch::add(Key k) {
  const std::uint64_t h = mix(k);
  if (!in_door(h)) {
    for (std::uint64_t b : door_bits(h)) door_[b / 64] |= std::uint64_t{1} << (b % 64);
  } else {
    for (std::uint32_t r = 0; r < kRows; ++r) {
      std::uint8_t& c = counters_[counter(h, r)];
      if (c < kMax) ++c;
    }
  }
  if (++added_ >= sample_) age();
}

void FrequencySketch::age() {
  for (std::uint8_t& c : counters_) c >>= 1;
  std::fill(door_.begin(), door_.end(), 0);
  added_ /= 2;
}

std::uint32_t FrequencySketch::estimate(Key k) const {
  if (width_ == 0) return 0;
  const std::uint64_t h = mix(k);
  std::uint32_t m = kMax;
  for (std::uint32_t r = 0; r < kRows; ++r) m = std::min<std::uint32_t>(m, counters_[counter(h, r)]);
  return m + (in_door(h) ? 1 : 0);
}

}  // namespace ember::scheduler
