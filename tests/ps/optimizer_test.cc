#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ember/common/error.h"
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"

namespace ember::ps {
namespace {

TEST(SparseOptimizer, HandComputedSteps) {
  const float g[2] = {0.5f, -1.0f};
  {
    OptimizerConfig c{OptimizerKind::kSgd, 0.1f, 0.01f};
    float w[2] = {1.0f, 2.0f};
    apply(c, 0.1f, 2, w, nullptr, g);
    EXPECT_FLOAT_EQ(w[0], 1.0f - 0.1f * (0.5f + 0.01f * 1.0f));
    EXPECT_FLOAT_EQ(w[1], 2.0f - 0.1f * (-1.0f + 0.01f * 2.0f));
  }
  {
    OptimizerConfig c{OptimizerKind::kAdagrad, 0.1f};
    float w[2] = {1.0f, 2.0f}, s[2];
    init_state(c, 2, s);
    apply(c, 0.1f, 2, w, s, g);
    apply(c, 0.1f, 2, w, s, g);
    EXPECT_FLOAT_EQ(s[0], 0.5f);
    EXPECT_NEAR(w[0], 1.0f - 0.1f * 0.5f / 0.5f - 0.1f * 0.5f / std::sqrt(0.5f), 1e-6);
  }
  {
    OptimizerConfig c{OptimizerKind::kRowWiseAdagrad, 0.1f};
    float w[2] = {1.0f, 2.0f}, s[1];
    init_state(c, 2, s);
    apply(c, 0.1f, 2, w, s, g);
    EXPECT_FLOAT_EQ(s[0], (0.25f + 1.0f) / 2);
    EXPECT_NEAR(w[1], 2.0f + 0.1f / std::sqrt(0.625f), 1e-6);
  }
  {
    OptimizerConfig c{OptimizerKind::kAdam, 0.1f};
    float w[2] = {1.0f, 2.0f}, s[5];
    init_state(c, 2, s);
    apply(c, 0.1f, 2, w, s, g);
    // First Adam step moves each weight by about lr against the gradient's sign.
    EXPECT_NEAR(w[0], 0.9f, 1e-5);
    EXPECT_NEAR(w[1], 2.1f, 1e-5);
    EXPECT_EQ(s[4], 1.0f);  // per-row step count
  }
  EXPECT_EQ(state_floats(OptimizerKind::kAdam, 16), 33u);
  EXPECT_THROW(parse_optimizer("lamb"), ConfigError);
}

}  // namespace
}  // namespace ember::ps
