#include "ember/common/fast_div.h"

#include <gtest/gtest.h>

#include <random>

namespace ember {
namespace {

// Against the hardware divide: every small divisor, powers of two and their neighbours,
// large divisors; numerators at the edges, random ones below 2^32 and beyond it.
TEST(FastDiv, MatchesTheHardwareDivide) {
  std::vector<std::uint64_t> divisors;
  for (std::uint64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int b = 1; b < 64; ++b) {
    for (std::int64_t delta : {-1, 0, 1}) divisors.push_back((std::uint64_t{1} << b) + static_cast<std::uint64_t>(delta));
  }
  divisors.push_back(4294967291u);  // the largest prime below 2^32
  divisors.push_back(~std::uint64_t{0});
  std::mt19937_64 rng(7);
  for (std::uint64_t d : divisors) {
    const FastDiv f(d);
    std::vector<std::uint64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 0xFFFFFFFFu, 0x100000000ull, ~std::uint64_t{0}};
    for (int i = 0; i < 2000; ++i) ns.push_back(rng() >> 32);
    for (int i = 0; i < 200; ++i) ns.push_back(rng());
    for (std::uint64_t n : ns) {
      ASSERT_EQ(f.quotient(n), n / d) << n << " / " << d;
      ASSERT_EQ(f.remainder(n), n % d) << n << " % " << d;
    }
  }
  EXPECT_EQ(FastDiv(0).divisor(), 1u);  // no division by zero
}

}  // namespace
}  // namespace ember
