// Worker sets as 64-bit masks (bit w: worker w), as the scheduler keeps U(k) and the
// partial holders of a row.
#pragma once

#include <bit>
#include <cstdint>

namespace ember::scheduler {

inline std::uint64_t bit(std::uint32_t w) { return std::uint64_t{1} << w; }

// std::popcount without -mpopcnt is a library call; this one inlines.
inline int popcount64(std::uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
}

// Calls f(w) for each set bit w of mask, in increasing order.
template <typename F>
void for_each_bit(std::uint64_t mask, F&& f) {
  while (mask != 0) {
    f(static_cast<std::uint32_t>(std::countr_zero(mask)));
    mask &= mask - 1;
  }
}

}  // namespace ember::scheduler
