#include "ember/cache/location_map.h"

#include <gtest/gtest.h>

#include "ember/common/error.h"

namespace ember::cache {
namespace {

TEST(LocationMap, OwnersDirtyAndPartialMasks) {
  LocationMap m(100, 8);
  EXPECT_EQ(m.owner(5), LocationMap::kNoOwner);
  m.set_owner(5, 3, true);
  EXPECT_EQ(m.owner(5), 3);
  EXPECT_TRUE(m.dirty(5));
  m.set_clean(5);
  EXPECT_EQ(m.owner(5), 3);
  EXPECT_FALSE(m.dirty(5));
  m.set_partial(7, 0b1011);
  EXPECT_EQ(m.clear_partial_bit(7, 1), 0b1001u);
  EXPECT_EQ(m.partial(7), 0b1001u);
  EXPECT_THROW(LocationMap(10, 65), ConfigError);
}

}  // namespace
}  // namespace ember::cache
