#include "ember/cache/lru_index.h"

#include <gtest/gtest.h>

#include <list>
#include <random>

#include "ember/cache/embedding_cache.h"
#include "ember/cache/location_map.h"
#include "ember/common/error.h"

namespace ember::cache {
namespace {

TEST(LruIndex, MatchesAListBasedLru) {
  const std::uint32_t cap = 50;
  LruIndex lru(cap);
  std::list<Key> ref;  // front = least recently used
  std::mt19937_64 rng(1);
  for (int step = 0; step < 100000; ++step) {
    Key k = rng() % 120;
    auto it = std::find(ref.begin(), ref.end(), k);
    std::uint32_t slot = lru.find(k);
    ASSERT_EQ(slot != LruIndex::kNone, it != ref.end());
    int op = static_cast<int>(rng() % 10);
    if (op == 0 && it != ref.end()) {
      ASSERT_EQ(lru.erase(k), slot);
      ref.erase(it);
    } else if (it != ref.end()) {
      lru.touch(slot);
      ref.splice(ref.end(), ref, it);
    } else {
      if (lru.full()) {
        ASSERT_EQ(lru.lru_key(), ref.front());
        Key e;
        std::uint32_t freed = lru.evict(e);
        ASSERT_EQ(e, ref.front());
        ref.pop_front();
        // The slot just freed is the one reused: deterministic slot assignment.
        ASSERT_EQ(lru.insert(k), freed);
      } else {
        lru.insert(k);
      }
      ref.push_back(k);
    }
    ASSERT_EQ(lru.size(), ref.size());
    ASSERT_LE(lru.size(), cap);
  }
  std::vector<Key> order(ref.begin(), ref.end());
  EXPECT_EQ(lru.keys_lru_order(), order);
}

TEST(LruIndex, SlotsAreDistinctAndStable) {
  LruIndex lru(4);
  std::vector<std::uint32_t> slots;
  for (Key k = 10; k < 14; ++k) slots.push_back(lru.insert(k));
  EXPECT_EQ(slots, (std::vector<std::uint32_t>{0, 1, 2, 3}));
  lru.touch(lru.find(10));  // 11 is now LRU
  Key e;
  EXPECT_EQ(lru.evict(e), 1u);
  EXPECT_EQ(e, 11u);
  EXPECT_EQ(lru.insert(99), 1u);
  EXPECT_EQ(lru.find(10), 0u);
  EXPECT_THROW(lru.insert(100), Error);
  // Copies are independent (the brute-force scheduler relies on it).
  LruIndex copy(lru);
  copy.erase(99);
  EXPECT_EQ(lru.find(99), 1u);
  EXPECT_EQ(copy.find(99), LruIndex::kNone);
}

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

TEST(EmbeddingCache, GatherAndScatterAddSumDuplicates) {
  EmbeddingCache c(4, 3, 1);
  float v0[3] = {1, 2, 3}, v2[3] = {4, 5, 6}, st = 0.5f;
  c.fill(0, 100, v0, &st, RowState::kLatestClean);
  c.fill(2, 102, v2, &st, RowState::kLatestDirty);
  std::uint32_t slots[3] = {2, 0, 2};
  float out[9];
  c.gather(slots, 3, out);
  EXPECT_EQ(std::vector<float>(out, out + 9), (std::vector<float>{4, 5, 6, 1, 2, 3, 4, 5, 6}));
  float g[9] = {1, 1, 1, 2, 2, 2, 10, 10, 10};
  c.scatter_add_grad(slots, 3, g);
  EXPECT_EQ(c.grad(2)[0], 11.0f);
  EXPECT_EQ(c.grad(0)[1], 2.0f);
  EXPECT_EQ(c.key(2), 102u);
  EXPECT_EQ(c.row_state(2), RowState::kLatestDirty);
  EXPECT_EQ(*c.state(0), 0.5f);
}

}  // namespace
}  // namespace ember::cache
