#include "ember/cache/embedding_cache.h"

#include <gtest/gtest.h>

#include <vector>

#include "ember/common/error.h"

namespace ember::cache {
namespace {

TEST(EmbeddingCache, GatherAndScatterAddSumDuplicates) {
  EmbeddingCache c(4, 3, 1);
  float v0[3] = {1, 2, 3}, v2[3] = {4, 5, 6}, st = 0.5f;
  c.fill(0, 100, v0, &st);
  c.fill(2, 102, v2, &st);
  std::uint32_t slots[3] = {2, 0, 2};
  float out[9];
  c.gather(slots, 3, out);
  EXPECT_EQ(std::vector<float>(out, out + 9), (std::vector<float>{4, 5, 6, 1, 2, 3, 4, 5, 6}));
  float g[9] = {1, 1, 1, 2, 2, 2, 10, 10, 10};
  c.scatter_add_grad(slots, 3, g);
  EXPECT_EQ(c.grad(2)[0], 11.0f);
  EXPECT_EQ(c.grad(0)[1], 2.0f);
  EXPECT_EQ(c.key(2), 102u);
  EXPECT_EQ(*c.state(0), 0.5f);
}

}  // namespace
}  // namespace ember::cache
