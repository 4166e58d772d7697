// FastDiv: division and remainder by a divisor fixed at run time (the number of PS
// shards) without a hardware divide for numerators below 2^32, which row keys are (a
// 64-bit divide costs tens of cycles, and the PS divides every key of every request).
// Method: Lemire, Kaser and Kurz, "Faster remainder by direct computation" (2019): with
// c = ceil(2^64 / d), n / d = (c * n) >> 64 exactly for all n, d < 2^32. Larger values
// fall back to the hardware divide.
#pragma once

#include <cstdint>

namespace ember {

class FastDiv {
 public:
  explicit FastDiv(std::uint64_t d = 1) : d_(d == 0 ? 1 : d), c_(d_ > 1 ? ~std::uint64_t{0} / d_ + 1 : 0) {}

  std::uint64_t divisor() const { return d_; }
  std::uint64_t quotient(std::uint64_t n) const {
    if (d_ == 1) return n;
    if ((n >> 32) == 0 && (d_ >> 32) == 0) return static_cast<std::uint64_t>((static_cast<unsigned __int128>(c_) * n) >> 64);
    return n / d_;
  }
  std::uint64_t remainder(std::uint64_t n) const { return n - quotient(n) * d_; }

 private:
  std::uint64_t d_, c_;
};

}  // namespace ember
