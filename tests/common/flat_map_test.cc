#include "ember/common/flat_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace ember {
namespace {

TEST(U64Map, InsertFindEraseAgainstStdMap) {
  U64Map<std::uint32_t> m;
  std::unordered_map<std::uint64_t, std::uint32_t> ref;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    // A small key space so inserts, hits and erases all happen often.
    std::uint64_t key = rng() % 5000;
    if (i % 1000 == 0) key = ~std::uint64_t{0};  // the map's internal empty marker
    switch (rng() % 3) {
      case 0: {
        auto [v, inserted] = m.try_emplace(key, 7);
        auto [it, ref_inserted] = ref.try_emplace(key, 7);
        ASSERT_EQ(inserted, ref_inserted);
        *v += 1;
        it->second += 1;
        break;
      }
      case 1:
        ASSERT_EQ(m.erase(key), ref.erase(key) == 1);
        break;
      default: {
        auto* v = m.find(key);
        auto it = ref.find(key);
        ASSERT_EQ(v != nullptr, it != ref.end());
        if (v) {
          ASSERT_EQ(*v, it->second);
        }
      }
    }
    ASSERT_EQ(m.size(), ref.size());
  }
  std::size_t seen = 0;
  m.for_each([&](std::uint64_t k, std::uint32_t v) {
    ++seen;
    ASSERT_EQ(ref.at(k), v);
  });
  EXPECT_EQ(seen, ref.size());
}

TEST(U64Map, GrowsAndKeepsEveryKey) {
  U64Map<std::uint64_t> m;
  for (std::uint64_t k = 0; k < 100000; ++k) m[k * 0x10000] = k;
  EXPECT_EQ(m.size(), 100000u);
  EXPECT_LE(m.size() * 8, m.capacity() * 7);  // load factor bound
  for (std::uint64_t k = 0; k < 100000; ++k) ASSERT_EQ(*m.find(k * 0x10000), k);
  EXPECT_EQ(m.find(1), nullptr);
}

TEST(U64Map, HashedLookupEqualsPlainLookup) {
  U64Map<int> m;
  for (int i = 0; i < 1000; ++i) m[static_cast<std::uint64_t>(i) * 977] = i;
  for (int i = 0; i < 1000; ++i) {
    std::uint64_t k = static_cast<std::uint64_t>(i) * 977;
    m.prefetch(U64Map<int>::hash(k));
    ASSERT_EQ(m.find_hashed(k, U64Map<int>::hash(k)), m.find(k));
  }
}

}  // namespace
}  // namespace ember
