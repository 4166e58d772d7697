#include "ember/cache/location_map.h"

#include <gtest/gtest.h>

#include <vector>

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
  const std::vector<std::uint16_t> holders{0, 1, 3};
  m.set_partials(7, holders, 3);
  m.remove_partial(7, 1, true);
  EXPECT_EQ(m.partials(7), 2u);
  std::vector<WorkerId> left;
  m.for_each_partial(7, [&](WorkerId w) { left.push_back(w); });
  EXPECT_EQ(left, (std::vector<WorkerId>{0, 3}));
  EXPECT_FALSE(m.is_partial(7, 1));
  EXPECT_THROW(LocationMap(10, 65536), ConfigError);
}

// Worker ids past 64 (no mask per row); a scheduler of one host lists only its own
// workers and counts the rest; the lists' blocks are reused.
TEST(LocationMap, PartialHoldersAreListsNotMasks) {
  LocationMap m(100, 1024);
  m.set_owner(5, 1000, true);
  EXPECT_EQ(m.owner(5), 1000);
  EXPECT_TRUE(m.dirty(5));
  m.set_flushed(5, true);
  m.set_clean(5);
  EXPECT_FALSE(m.flushed(5)) << "a new state ends a flushed mark";
  std::vector<std::uint16_t> many(700);
  for (std::uint16_t i = 0; i < 700; ++i) many[i] = static_cast<std::uint16_t>(i + 300);
  m.set_partials(9, many, 700);
  EXPECT_TRUE(m.is_partial(9, 999));
  EXPECT_FALSE(m.is_partial(9, 299));
  const std::size_t bytes = m.memory_bytes();
  m.clear_partials(9);
  m.set_partials(9, many, 700);  // the freed block again
  EXPECT_EQ(m.memory_bytes(), bytes);
  const std::vector<std::uint16_t> mine{16, 17};
  m.set_partials(11, mine, 40);  // 40 holders, two of them modelled here
  m.remove_partial(11, 900, false);
  m.remove_partial(11, 16, true);
  EXPECT_EQ(m.partials(11), 38u);
  EXPECT_FALSE(m.is_partial(11, 16));
  EXPECT_TRUE(m.is_partial(11, 17));
}

}  // namespace
}  // namespace ember::cache
