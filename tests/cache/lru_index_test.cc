#include "ember/cache/lru_index.h"

#include <gtest/gtest.h>

#include <list>
#include <random>

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
        ASSERT_EQ(lru.victim(), ref.front());
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

}  // namespace
}  // namespace ember::cache
