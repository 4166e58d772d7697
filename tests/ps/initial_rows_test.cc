#include "ember/ps/initial_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ember/ps/shard_store.h"

namespace ember::ps {
namespace {

TEST(Placement, InitialRowsDependOnlyOnSeedAndKey) {
  std::vector<float> a(16), b(16), c(16);
  initial_row(7, 12345, 16, a.data());
  initial_row(7, 12345, 16, b.data());
  initial_row(7, 12346, 16, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float x : a) EXPECT_LT(std::abs(x), 0.25f);
  // Shards: every key has exactly one owner, and the load is spread.
  std::vector<int> count(3, 0);
  for (Key k = 0; k < 30000; ++k) ++count[owner_shard(k, 3)];
  for (int n : count) EXPECT_NEAR(n, 10000, 500);
}

}  // namespace
}  // namespace ember::ps
