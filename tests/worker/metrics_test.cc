#include "ember/worker/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ember::worker {
namespace {

TEST(Metrics, AucAndLogloss) {
  EXPECT_DOUBLE_EQ(auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(auc({0.5f, 0.5f}, {0, 1}), 0.5);  // a tie counts half
  EXPECT_DOUBLE_EQ(auc({0.2f, 0.9f}, {1, 1}), 0.5);  // one class only
  EXPECT_NEAR(logloss({0.5f, 0.5f}, {0, 1}), std::log(2.0), 1e-12);
  EXPECT_NEAR(logloss({0.9f}, {1}), -std::log(0.9), 1e-6);
}

}  // namespace
}  // namespace ember::worker
