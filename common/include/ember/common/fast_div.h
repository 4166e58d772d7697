// FastDiv: division and remainder by a divisor fixed at run time (the number of PS
// shards, connections per shard) without a hardware divide: the PS divides every key of
// every request, and a 64-bit divide costs tens of cycles. libdivide does the work; this
// wrapper adds the divisor (for the remainder) and maps 0 to 1.
#pragma once

#include <libdivide.h>

#include <cstdint>

namespace ember {

class FastDiv {
 public:
  explicit FastDiv(std::uint64_t d = 1) : d_(d == 0 ? 1 : d), div_(d_) {}

  std::uint64_t divisor() const { return d_; }
  std::uint64_t quotient(std::uint64_t n) const { return n / div_; }
  std::uint64_t remainder(std::uint64_t n) const { return n - quotient(n) * d_; }

 private:
  std::uint64_t d_;
  libdivide::divider<std::uint64_t> div_;
};

}  // namespace ember
