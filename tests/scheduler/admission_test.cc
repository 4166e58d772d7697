// Cache admission (--cache-admission tinylfu): the frequency sketch counts recent
// appearances and forgets old ones; in the scheduler a row seen once does not push a
// frequent row out of a full cache, is staged for its iteration instead (pulled, its
// gradient pushed at the end, dropped), and the plans do not depend on the thread count.
#include "admission.h"

#include <gtest/gtest.h>

#include <vector>

#include "ember/common/error.h"
#include "ember/scheduler/scheduler.h"

namespace ember::scheduler {
namespace {

TEST(FrequencySketch, CountsRecentAppearancesAndForgetsOldOnes) {
  FrequencySketch f(1024);
  std::vector<Key> frequent{1, 2, 3};
  for (int i = 0; i < 6; ++i) f.record(frequent);
  f.record(std::vector<Key>{98, 99});
  EXPECT_EQ(f.estimate(99), 1u) << "the doorkeeper takes a first appearance";
  EXPECT_EQ(f.estimate(12345), 0u);
  for (Key k : frequent) EXPECT_GE(f.estimate(k), 6u) << k;  // count-min never undercounts (before aging)
  EXPECT_TRUE(f.admits(1, 99));
  EXPECT_FALSE(f.admits(99, 1));
  EXPECT_FALSE(f.admits(99, 98)) << "a tie keeps the cached row";
  // 10,240 appearances (10 x its rows; 10,232 more) halve every counter and clear the doorkeeper.
  std::vector<Key> once;
  for (Key k = 1000; k < 1000 + 10232; ++k) once.push_back(k);
  f.record(once);
  for (Key k : frequent) EXPECT_LE(f.estimate(k), 5u) << k;
  EXPECT_EQ(f.estimate(99), 0u);
}

// Two workers, a cache of 6 rows each. Every third batch repeats the same rows in
// samples 0 and 2 (workers 0 and 1 train them by the allocation below); every other
// sample is of rows seen once. Between two uses of a repeated row 10 one-time rows pass
// through its worker's cache: LRU has evicted it by then.
struct Stream {
  std::uint64_t next = 100;
  GlobalBatch batch(std::uint64_t index) {
    GlobalBatch b;
    b.index = index;
    b.samples = 4;
    b.tables = 2;
    for (std::uint32_t i = 0; i < 4; ++i) {
      if (i % 2 == 0 && index % 3 == 0) {
        b.keys.push_back(i);
        b.keys.push_back(1000 + i);
      } else {
        b.keys.push_back(next++);
        b.keys.push_back(1000 + next++);
      }
    }
    return b;
  }
};

SchedulerConfig config(const std::string& admission, const std::string& policy) {
  SchedulerConfig c;
  c.workers = 2;
  c.batch_per_worker = 2;
  c.cache_rows = 6;
  c.table_offsets = {0, 1000};
  c.num_keys = 100000;
  c.policy = parse_policy(policy);
  c.admission = parse_admission(admission);
  return c;
}

TEST(Admission, OneTimeRowsDoNotEvictFrequentOnes) {
  for (const char* policy : {"vanilla", "herald"}) {
    Scheduler none(config("none", policy)), lfu(config("tinylfu", policy));
    Stream a, b;
    std::vector<StepPlan> plans;
    const std::vector<std::uint32_t> alloc{0, 0, 1, 1};
    TrafficCounts without, with;
    for (std::uint64_t t = 0; t < 40; ++t) {
      without += none.schedule_with(a.batch(t), alloc, plans).traffic;
      with += lfu.schedule_with(b.batch(t), alloc, plans).traffic;
      if (t < 5) continue;
      // Worker 0's frequent rows (0, 1000) stay cached under admission: hits.
      for (const RowRef& r : plans[0].rows) {
        if (r.key == 0 || r.key == 1000) {
          EXPECT_FALSE(r.uncached) << policy << " iteration " << t;
        }
        if (r.key >= 100 && r.key < 1000) {
          EXPECT_TRUE(r.uncached) << policy << ": a one-time row is staged, iteration " << t;
        }
      }
      // A staged row: pushed at the end, dropped, never held.
      for (const RowRef& r : plans[0].rows) {
        if (!r.uncached) continue;
        EXPECT_GE(r.slot, 6u) << "a staging slot";
        EXPECT_TRUE(std::ranges::any_of(plans[0].end_pushes, [&](const KeySlot& e) { return e.key == r.key; })) << r.key;
        EXPECT_TRUE(std::ranges::any_of(plans[0].drops, [&](const KeySlot& e) { return e.key == r.key; })) << r.key;
        EXPECT_FALSE(lfu.cache_of(0).contains(r.key));
      }
    }
    EXPECT_GT(with.not_admitted, 0u) << policy;
    EXPECT_EQ(without.not_admitted, 0u) << policy;
    EXPECT_GT(with.hits, without.hits) << policy << ": admission keeps the rows that repeat";
  }
}

TEST(Admission, PlansDoNotDependOnTheThreadCount) {
  SchedulerConfig one = config("tinylfu", "herald"), four = one;
  four.threads = 4;
  Scheduler s1(one), s4(four);
  Stream a, b;
  std::vector<StepPlan> p1, p4;
  for (std::uint64_t t = 0; t < 30; ++t) {
    s1.schedule(a.batch(t), p1);
    s4.schedule(b.batch(t), p4);
    for (std::uint32_t w = 0; w < 2; ++w) {
      ASSERT_EQ(p1[w].samples, p4[w].samples) << t;
      ASSERT_EQ(p1[w].pulls.size(), p4[w].pulls.size()) << t;
      for (std::size_t j = 0; j < p1[w].rows.size(); ++j) {
        ASSERT_EQ(p1[w].rows[j].slot, p4[w].rows[j].slot) << t;
        ASSERT_EQ(p1[w].rows[j].uncached, p4[w].rows[j].uncached) << t;
      }
    }
  }
}

TEST(Admission, RefusedWhereItDoesNotApplyYet) {
  SchedulerConfig peer = config("tinylfu", "herald");
  peer.peer_sync = true;
  peer.host_of = {0, 0};
  EXPECT_THROW(Scheduler{peer}, ConfigError);
  EXPECT_THROW(Scheduler{config("tinylfu", "het:2")}, ConfigError);
  EXPECT_THROW(parse_admission("lfu"), ConfigError);
}

}  // namespace
}  // namespace ember::scheduler
