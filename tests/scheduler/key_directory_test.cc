// KeyDirectory: hashed ids to slots, made on evidence, expired and capped, identically
// wherever the same batches are read.
#include "ember/scheduler/key_directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "ember/common/error.h"

namespace ember::scheduler {
namespace {

// A one-hot batch of `ids` (one table).
GlobalBatch batch_of(std::uint64_t index, const std::vector<std::uint64_t>& ids) {
  GlobalBatch b;
  b.index = index;
  b.samples = static_cast<std::uint32_t>(ids.size());
  b.tables = 1;
  b.keys.assign(ids.begin(), ids.end());
  return b;
}

std::uint64_t id(std::uint64_t n) { return (std::uint64_t{3} << 56) | (n * 0x9e3779b97f4a7c15ULL >> 8); }

TEST(KeyDirectory, RowsAreMadeAtFirstUseOnTheirShardsSlots) {
  KeyDirectory d({.shards = 3}, 100);
  GlobalBatch b = batch_of(0, {id(1), id(2), id(1), id(3)});
  std::vector<SlotAssignment> made;
  d.admit(0, b, &made);
  ASSERT_EQ(made.size(), 3u);  // id(1) once
  EXPECT_TRUE(b.bags.empty());
  EXPECT_EQ(b.keys[0], b.keys[2]);
  for (const SlotAssignment& a : made) {
    EXPECT_EQ(a.slot % 3, shard_of_id(a.id, 3));
    EXPECT_EQ(d.id_of(a.slot), a.id);
    EXPECT_LT(a.slot, d.slot_count());
  }
  EXPECT_EQ(d.totals().live, 3u);
  EXPECT_EQ(d.totals().created, 3u);
  // Seen again: the same slots, nothing made.
  GlobalBatch again = batch_of(1, {id(3), id(2)});
  made.clear();
  d.admit(1, again, &made);
  EXPECT_TRUE(made.empty());
  EXPECT_EQ(again.keys[0], b.keys[3]);
}

TEST(KeyDirectory, CreateAfterCountsBatchesNotLookupsAndRefusedIdsLeaveTheirBags) {
  KeyDirectory d({.shards = 2, .create_after = 3, .create_filter_bytes = 1 << 16}, 100);
  for (std::uint64_t t = 0; t < 3; ++t) {
    // id(7) three times a batch: one appearance a batch.
    GlobalBatch b = batch_of(t, {id(7), id(8 + t), id(7), id(7)});
    std::vector<SlotAssignment> made;
    d.admit(t, b, &made);
    if (t < 2) {
      EXPECT_TRUE(made.empty()) << t;
      // Every key refused: four empty bags.
      ASSERT_EQ(b.bags.size(), 5u);
      EXPECT_TRUE(b.keys.empty());
      for (std::uint32_t i = 0; i < 4; ++i) EXPECT_EQ(b.bag_size(i, 0), 0u);
    } else {
      ASSERT_EQ(made.size(), 1u);
      EXPECT_EQ(made[0].id, id(7));
      // Bags of 1, 0, 1, 1 keys.
      ASSERT_EQ(b.keys.size(), 3u);
      EXPECT_EQ(b.bag_size(1, 0), 0u);
      EXPECT_EQ(b.bag_size(3, 0), 1u);
    }
    d.end_iteration(t);
  }
  // Refusals: id(7) in batches 0 and 1, each id(8 + t) once.
  EXPECT_EQ(d.totals().refused, 2u + 3u);
}

TEST(KeyDirectory, AFullFilterMakesRowsEarlyNeverLate) {
  // 64 counters for 2,000 ids: the sketch counts high, so some rows come early; none late.
  KeyDirectory d({.shards = 1, .create_after = 4, .create_filter_bytes = 64}, 5000);
  std::map<std::uint64_t, int> seen;
  for (std::uint64_t t = 0; t < 8; ++t) {
    std::vector<std::uint64_t> ids;
    for (std::uint64_t n = 0; n < 250; ++n) ids.push_back(id(t * 250 + n));  // new ids
    for (std::uint64_t n = 0; n < 10; ++n) ids.push_back(id(100000 + n));    // ten in every batch
    GlobalBatch b = batch_of(t, ids);
    std::vector<SlotAssignment> made;
    d.admit(t, b, &made);
    for (std::uint64_t n = 0; n < 10; ++n) {
      const bool live = std::any_of(made.begin(), made.end(), [&](const SlotAssignment& a) { return a.id == id(100000 + n); }) ||
                        seen.count(id(100000 + n)) > 0;
      if (t >= 3) {
        EXPECT_TRUE(live) << "row made late: batch " << t;
      }
    }
    for (const SlotAssignment& a : made) seen[a.id] = static_cast<int>(t);
  }
}

TEST(KeyDirectory, IdleRowsExpireAndComeBackAsNewRows) {
  KeyDirectory d({.shards = 1, .expire_after = 2}, 10);
  std::vector<Key> dropped;
  GlobalBatch b0 = batch_of(0, {id(1), id(2)});
  d.admit(0, b0);
  d.end_iteration(0, &dropped);
  GlobalBatch b1 = batch_of(1, {id(2)});
  d.admit(1, b1);
  d.end_iteration(1, &dropped);
  EXPECT_TRUE(dropped.empty());
  GlobalBatch b2 = batch_of(2, {id(2)});
  d.admit(2, b2);
  d.end_iteration(2, &dropped);  // id(1): last seen at 0, 2 iterations idle
  ASSERT_EQ(dropped, std::vector<Key>{b0.keys[0]});
  EXPECT_EQ(d.id_of(b0.keys[0]), KeyDirectory::kNoId);
  EXPECT_EQ(d.totals().expired, 1u);
  std::vector<SlotAssignment> made;
  GlobalBatch b3 = batch_of(3, {id(1)});
  d.admit(3, b3, &made);
  ASSERT_EQ(made.size(), 1u);
  EXPECT_EQ(d.totals().created, 3u);
  EXPECT_EQ(d.totals().live, 2u);
}

TEST(KeyDirectory, TheCapDropsTheLeastRecentButNeverTheBatchsOwnRows) {
  KeyDirectory d({.shards = 1, .shard_max_rows = 3}, KeyDirectory::slots_needed(3, 4));
  std::vector<Key> dropped;
  GlobalBatch a = batch_of(0, {id(1), id(2), id(3)});
  d.admit(0, a);
  d.end_iteration(0, &dropped);
  EXPECT_TRUE(dropped.empty());
  GlobalBatch b = batch_of(1, {id(4), id(2)});  // 4 live: id(1) and id(3) idle, id(1) met first
  d.admit(1, b);
  d.end_iteration(1, &dropped);
  ASSERT_EQ(dropped, std::vector<Key>{a.keys[0]});
  EXPECT_EQ(d.totals().capped, 1u);
  // A batch of four new rows: all four stay (they are the batch's), the rest go.
  dropped.clear();
  GlobalBatch c = batch_of(2, {id(5), id(6), id(7), id(8)});
  d.admit(2, c);
  d.end_iteration(2, &dropped);
  EXPECT_EQ(dropped.size(), 3u);
  EXPECT_EQ(d.totals().live, 4u);
  // A shard without a free slot says so.
  KeyDirectory tight({.shards = 1}, 2);
  GlobalBatch many = batch_of(0, {id(1), id(2), id(3)});
  EXPECT_THROW(tight.admit(0, many), Error);
  EXPECT_THROW(KeyDirectory({.shards = 1, .shard_max_rows = 10}, 5), ConfigError);
  EXPECT_THROW(KeyDirectory({.shards = 1, .create_after = 0}, 5), ConfigError);
}

// Batches with a hot set and a stream of ids seen once or twice.
GlobalBatch stream_batch(std::uint64_t t) {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t n = 0; n < 64; ++n) ids.push_back(id(n % 16));             // hot
  for (std::uint64_t n = 0; n < 64; ++n) ids.push_back(id(1000 + t * 40 + n));  // new, overlapping the next batch
  return batch_of(t, ids);
}

TEST(KeyDirectory, SameBatchesSameDecisionsAndAResumeContinuesExactly) {
  const DynamicTableOptions o{.shards = 4, .create_after = 2, .create_filter_bytes = 4096, .expire_after = 5, .shard_max_rows = 40};
  const std::uint64_t slots = KeyDirectory::slots_needed(40, 128);
  KeyDirectory a(o, slots), b(o, slots);
  std::string half;
  for (std::uint64_t t = 0; t < 60; ++t) {
    GlobalBatch x = stream_batch(t), y = stream_batch(t);
    std::vector<Key> da, db;
    a.admit(t, x);
    b.admit(t, y);
    ASSERT_EQ(x.keys, y.keys);
    ASSERT_EQ(x.bags, y.bags);
    a.end_iteration(t, &da);
    b.end_iteration(t, &db);
    ASSERT_EQ(da, db);
    if (t == 29) half = a.save();
  }
  EXPECT_EQ(a.save(), b.save());
  const DirectoryCounts c = a.totals();
  EXPECT_GT(c.refused, 0u);
  EXPECT_GT(c.expired, 0u);
  EXPECT_GT(c.capped, 0u);
  for (std::uint32_t s = 0; s < 4; ++s) EXPECT_LE(a.shard_counts(s).live, 40u);
  // Resumed at 30 from the save: the same state at 60.
  KeyDirectory r = KeyDirectory::load(half, o, slots, "dir.bin");
  for (std::uint64_t t = 30; t < 60; ++t) {
    GlobalBatch x = stream_batch(t);
    r.admit(t, x);
    r.end_iteration(t);
  }
  EXPECT_EQ(r.save(), a.save());
  DynamicTableOptions other = o;
  other.expire_after = 6;
  EXPECT_THROW(KeyDirectory::load(half, other, slots, "dir.bin"), DataError);
  EXPECT_THROW(KeyDirectory::load(half.substr(0, half.size() - 3), o, slots, "dir.bin"), DataError);
}

// Re-placed on another shard count: the same live ids with their last appearances, each
// on its shard by the new count, its slots taken by ascending id; and then, without a
// cap (rows made and expired by id alone), the same decisions as the directory that
// never moved, batch after batch.
TEST(KeyDirectory, ReshardKeepsEveryRowAndGoesOnDecidingAlike) {
  const DynamicTableOptions o{.shards = 4, .create_after = 2, .create_filter_bytes = 4096, .expire_after = 5};
  KeyDirectory a(o, 512);
  for (std::uint64_t t = 0; t < 30; ++t) {
    GlobalBatch x = stream_batch(t);
    a.admit(t, x);
    a.end_iteration(t);
  }
  DynamicTableOptions three = o;
  three.shards = 3;
  // Through save and load, as a dense checkpoint carries it.
  KeyDirectory b = KeyDirectory::load(a.save(), "dir.bin").reshard(three, 300, 128, 30);
  EXPECT_EQ(a.placed_at(), 0u);
  EXPECT_EQ(KeyDirectory::load(b.save(), "dir.bin").placed_at(), 30u);
  EXPECT_EQ(b.totals().live, a.totals().live);
  EXPECT_EQ(b.totals().created, a.totals().created);
  EXPECT_EQ(b.totals().expired, a.totals().expired);
  std::map<std::uint32_t, std::vector<std::uint64_t>> by_shard;
  for (Key slot = 0; slot < a.slot_count(); ++slot)
    if (a.id_of(slot) != KeyDirectory::kNoId) by_shard[shard_of_id(a.id_of(slot), 3)].push_back(a.id_of(slot));
  for (auto& [shard, ids] : by_shard) {
    std::sort(ids.begin(), ids.end());
    for (std::size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(b.id_of(shard + 3 * j), ids[j]) << "shard " << shard << " slot " << j;
  }
  for (std::uint64_t t = 30; t < 60; ++t) {
    GlobalBatch x = stream_batch(t), y = stream_batch(t);
    std::vector<Key> da, db;
    a.admit(t, x);
    b.admit(t, y);
    ASSERT_EQ(x.bags, y.bags) << t;  // the same ids kept out
    for (std::size_t i = 0; i < x.keys.size(); ++i) ASSERT_EQ(a.id_of(x.keys[i]), b.id_of(y.keys[i])) << t;
    a.end_iteration(t, &da);
    b.end_iteration(t, &db);
    ASSERT_EQ(da.size(), db.size()) << t;  // the same rows expired
  }
  EXPECT_EQ(b.totals().live, a.totals().live);
  // Too few slots for the rows a shard takes, or other decisions: refused.
  EXPECT_THROW(a.reshard(three, 8, 0, 60), ConfigError);
  EXPECT_THROW(a.reshard(three, 300, 300, 60), ConfigError);  // the rows fit (above), a batch's new ones would not
  DynamicTableOptions later = three;
  later.expire_after = 6;
  EXPECT_THROW(a.reshard(later, 300, 128, 60), ConfigError);
}

TEST(KeyDirectory, MemoryStaysFlatWhileIdsKeepComing) {
  KeyDirectory d({.shards = 2, .expire_after = 3, .shard_max_rows = 100}, KeyDirectory::slots_needed(100, 128));
  std::size_t at_100 = 0;
  for (std::uint64_t t = 0; t < 2000; ++t) {
    GlobalBatch b = stream_batch(t);
    d.admit(t, b);
    d.end_iteration(t);
    if (t == 100) at_100 = d.memory_bytes();
  }
  EXPECT_EQ(d.memory_bytes(), at_100);
  EXPECT_GT(d.totals().created, 2000u * 30);
  EXPECT_LE(d.totals().live, 200u);
}

// The rules written plainly: per shard, each live id's last appearance and its place
// among its batch's ids (the order they were met); exact counts of the batches each id
// without a row appeared in.
class PlainDirectory {
 public:
  PlainDirectory(std::uint32_t shards, std::uint32_t create_after, std::uint64_t expire_after, std::uint64_t cap)
      : shards_(shards), create_after_(create_after), expire_(expire_after), cap_(cap) {}

  // The ids made by batch t, in the order met.
  std::vector<std::uint64_t> admit(std::uint64_t t, const std::vector<std::uint64_t>& ids) {
    std::vector<std::uint64_t> made;
    std::set<std::uint64_t> refused;
    for (const std::uint64_t id : ids) {
      const auto it = live_.find(id);
      if (it != live_.end()) {
        if (it->second.last != t) it->second = {t, seq_};
      } else if (refused.count(id) == 0) {
        if (++batches_[id] >= create_after_) {
          live_.emplace(id, Seen{t, seq_});
          made.push_back(id);
        } else {
          refused.insert(id);
        }
      }
      ++seq_;
    }
    return made;
  }
  // The ids dropped at the end of t, shard by shard, least recently appeared first.
  std::vector<std::uint64_t> end_iteration(std::uint64_t t) {
    std::vector<std::uint64_t> dropped;
    for (std::uint32_t s = 0; s < shards_; ++s) {
      std::vector<std::pair<Seen, std::uint64_t>> rows;
      for (const auto& [id, seen] : live_)
        if (shard_of_id(id, shards_) == s) rows.emplace_back(seen, id);
      std::sort(rows.begin(), rows.end());
      std::size_t kept = rows.size();
      for (const auto& [seen, id] : rows) {
        const bool expired = expire_ > 0 && seen.last + expire_ <= t;
        const bool capped = cap_ > 0 && kept > cap_ && seen.last != t;
        if (!expired && !capped) break;
        dropped.push_back(id);
        live_.erase(id);
        --kept;
      }
    }
    return dropped;
  }

 private:
  struct Seen {
    std::uint64_t last, order;
    auto operator<=>(const Seen&) const = default;
  };
  std::uint32_t shards_, create_after_;
  std::uint64_t expire_, cap_, seq_ = 0;
  std::map<std::uint64_t, Seen> live_;
  std::map<std::uint64_t, std::uint32_t> batches_;
};

// Creation, expiry and the cap against the plain rules over many iterations: ids repeated
// within and across batches, a cap that binds in some stretches and not in others, enough
// appearances that the recency log is compacted many times, and a resume from the saved
// state half-way.
TEST(KeyDirectory, DecidesAsThePlainRulesSayOverManyIterations) {
  struct Case {
    std::uint32_t create_after;
    std::uint64_t expire, cap;
  };
  for (const Case c : {Case{1, 6, 150}, Case{1, 0, 150}, Case{1, 9, 0}, Case{2, 6, 150}, Case{1, 0, 0}}) {
    const std::string what =
        "create " + std::to_string(c.create_after) + ", expire " + std::to_string(c.expire) + ", cap " + std::to_string(c.cap);
    const DynamicTableOptions o{.shards = 2, .create_after = c.create_after, .expire_after = c.expire, .shard_max_rows = c.cap};
    KeyDirectory d(o, 6000);
    PlainDirectory plain(2, c.create_after, c.expire, c.cap);
    std::map<Key, std::uint64_t> slot_ids;  // as the made rows name them
    std::uint64_t state = 12345;
    for (std::uint64_t t = 0; t < 1500; ++t) {
      if (t == 750) d = KeyDirectory::load(d.save(), o, 6000, "saved at 750");
      // Stretches of 100 iterations alternate a narrow id range (the cap does not bind)
      // and a wide one (it does).
      const std::uint64_t range = (t / 100) % 2 == 0 ? 120 : 5000;
      std::vector<std::uint64_t> ids;
      for (int i = 0; i < 200; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        ids.push_back(id((state >> 33) % range));
      }
      GlobalBatch b = batch_of(t, ids);
      std::vector<SlotAssignment> made;
      d.admit(t, b, &made);
      std::vector<std::uint64_t> made_ids;
      for (const SlotAssignment& a : made) {
        made_ids.push_back(a.id);
        slot_ids[a.slot] = a.id;
      }
      ASSERT_EQ(made_ids, plain.admit(t, ids)) << "batch " << t << ", " << what;
      std::vector<Key> dropped;
      d.end_iteration(t, &dropped);
      std::vector<std::uint64_t> dropped_ids;
      for (const Key k : dropped) dropped_ids.push_back(slot_ids.at(k));
      ASSERT_EQ(dropped_ids, plain.end_iteration(t)) << "batch " << t << ", " << what;
    }
    if (c.expire > 0 || c.cap > 0) {
      EXPECT_GT(d.totals().capped + d.totals().expired, 1000u) << what;
    }
    EXPECT_EQ(KeyDirectory::load(d.save(), "saved").save(), d.save()) << what;
  }
}

// Without expiry or a cap no appearance is kept: the same history saves the same bytes
// whenever its rows were made.
TEST(KeyDirectory, WithoutRecencyTheSavedStateHoldsNoAppearances) {
  KeyDirectory early({.shards = 1}, 100), late({.shards = 1}, 100);
  GlobalBatch a = batch_of(0, {id(1), id(2)}), b = batch_of(5, {id(1), id(2)});
  early.admit(0, a);
  late.admit(5, b);
  EXPECT_EQ(early.save(), late.save());
}

}  // namespace
}  // namespace ember::scheduler
