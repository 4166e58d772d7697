// Placements: replicated, uncached and cached tables, fae's hot rows, cache shares.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>
#include <set>

#include "ember/common/error.h"
#include "ember/data/zipf.h"
#include "ember/scheduler/host_schedulers.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/simulator.h"
#include "reference_model.h"
#include "scheduler_fixture.h"

namespace ember::scheduler {
namespace {

TEST(Scheduler, FaeKeepsHotRowsOffThePs) {
  Workload wl;
  SchedulerConfig c = config("fae:0.01", 4, 6, 100, wl);
  c.replicated.assign(wl.num_keys, 0);
  for (Key k = 0; k < 4; ++k) c.replicated[k] = 1;  // the tiny table is hot
  Scheduler s(c);
  std::vector<StepPlan> plans;
  for (int it = 0; it < 50; ++it) {
    IterationStats st = s.schedule(wl.next(24, static_cast<std::uint64_t>(it)), plans);
    EXPECT_GT(st.traffic.hot_sync, 0u);
    for (const auto& p : plans) {
      for (const auto& pull : p.pulls) ASSERT_GE(pull.key, 4u) << "a hot row went through the PS";
    }
  }
  EXPECT_EQ(s.cache_of(0).capacity(), 96u);  // hot rows take their share of the cache
}

// A placement: the tiny table replicated, the middle one uncached, the long tail cached.
// Replicated rows never reach the PS or the cache, and every worker's plan lists the
// global batch's alike; an uncached row is pulled by each of its trainers into a staging
// slot (without state: the PS applies its optimizer), end-pushed and dropped, every
// iteration, and never enters the LRU; a flush hands worker 0 the replicated rows
// trained since the last one. With prefetch and lookahead, for vanilla and herald.
TEST(Scheduler, PlacementReplicatesStagesAndCaches) {
  for (const char* policy : {"vanilla", "herald"}) {
    Workload wl;
    SchedulerConfig c = config(policy, 4, 6, 100, wl);
    c.treatments = {Treatment::kReplicated, Treatment::kUncached, Treatment::kCache};
    c.replicated.assign(wl.num_keys, 0);
    c.uncached.assign(wl.num_keys, 0);
    for (Key k = 0; k < 4; ++k) c.replicated[k] = 1;
    for (Key k = 4; k < 44; ++k) c.uncached[k] = 1;
    c.prefetch = true;
    c.lookahead = 2;
    c.eviction = Eviction::kLookahead;
    ASSERT_EQ(c.staging_rows(), 6u);  // one uncached table, 6 samples per worker
    Scheduler s(c);
    EXPECT_EQ(s.cache_of(0).capacity(), 100u) << policy << ": a replicated table takes no cache slot";
    Workload ahead = wl;
    std::vector<StepPlan> plans, flushed;
    std::set<Key> trained_replicated;
    std::uint64_t it = 0;
    for (; it < 40; ++it) {
      const GlobalBatch b = wl.next(24, it);
      s.look_ahead_through(it, 1000, [&](GlobalBatch& next) { next = ahead.next(24, s.shown_until()); });
      const IterationStats st = s.schedule(b, plans);
      std::vector<Key> replicated;
      for (Key k : b.keys) {
        if (k < 4 && std::find(replicated.begin(), replicated.end(), k) == replicated.end()) replicated.push_back(k);
      }
      trained_replicated.insert(replicated.begin(), replicated.end());
      EXPECT_EQ(st.traffic.hot_sync, 4 * replicated.size()) << policy;
      std::uint64_t staged_pulls = 0, staged_pushes = 0;
      for (const StepPlan& p : plans) {
        EXPECT_EQ(p.replicated, replicated) << policy << ": every worker all-reduces the batch's replicated rows, in its order";
        std::set<Key> mine;
        for (std::uint32_t i : p.samples) mine.insert(b.keys[i * 3 + 1]);
        for (const PullEntry& e : p.pulls) {
          ASSERT_GE(e.key, 4u) << policy << ": a replicated row was pulled";
          if (e.key < 44) {
            ++staged_pulls;
            EXPECT_GE(e.slot, 100u) << policy;
            EXPECT_LT(e.slot, 106u) << policy;
            EXPECT_FALSE(e.with_state) << policy << ": the PS applies an uncached row's optimizer";
            EXPECT_EQ(e.kind, EvictKind::kNone);
          }
          if (e.kind != EvictKind::kNone) {
            EXPECT_GE(e.evicted, 44u) << policy << ": only cached rows are evicted";
          }
        }
        for (const KeySlot& g : p.end_pushes) staged_pushes += g.key >= 4 && g.key < 44;
        std::uint64_t dropped = 0;
        for (const KeySlot& d : p.drops) dropped += d.key >= 4 && d.key < 44;
        EXPECT_EQ(dropped, mine.size()) << policy << ": every staged row is dropped";
        for (const RowRef& r : p.rows) {
          EXPECT_GE(r.key, 4u);
          EXPECT_EQ(r.uncached, r.key < 44) << policy;
        }
        for (const KeySlot& g : p.push_grads) EXPECT_GE(g.key, 44u);
        for (const KeySlot& v : p.push_values) EXPECT_GE(v.key, 44u);
        std::uint64_t staged_rows = 0;
        for (const RowRef& r : p.rows) staged_rows += r.uncached;
        EXPECT_EQ(staged_rows, mine.size()) << policy << ": each uncached row of the micro-batch, once";
      }
      EXPECT_EQ(staged_pulls, staged_pushes) << policy << ": each staged row's gradient goes back";
      for (std::uint32_t w = 0; w < 4; ++w) {
        const auto& lru = s.cache_of(w);
        for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
          if (lru.occupied(slot)) {
            ASSERT_GE(lru.key_at(slot), 44u) << policy << ": only the cached table enters the LRU";
          }
        }
      }
      if (it % 10 == 9) {
        const TrafficCounts f = s.flush(flushed);
        std::set<Key> written(flushed[0].replicated_flush.begin(), flushed[0].replicated_flush.end());
        EXPECT_EQ(written, trained_replicated) << policy << ": the replicated rows trained since the last flush go back";
        EXPECT_EQ(f.hot_flush, written.size());
        for (std::uint32_t w = 1; w < 4; ++w) EXPECT_TRUE(flushed[w].replicated_flush.empty());
        trained_replicated.clear();
        EXPECT_EQ(s.flush(flushed).hot_flush, 0u) << policy << ": nothing trained since";
      }
    }
  }
}

TEST(Scheduler, PlacementRefusesHetAndPartialPlacements) {
  Workload wl;
  SchedulerConfig c = config("het:2", 4, 6, 100, wl);
  c.treatments = {Treatment::kCache, Treatment::kUncached, Treatment::kCache};
  c.uncached.assign(wl.num_keys, 0);
  EXPECT_THROW(Scheduler{c}, ConfigError);
  c = config("herald", 4, 6, 100, wl);
  c.treatments = {Treatment::kCache, Treatment::kCache};  // 2 of 3 tables
  EXPECT_THROW(Scheduler{c}, ConfigError);
  c = config("herald", 4, 6, 100, wl);
  c.uncached.assign(10, 0);  // not every key
  EXPECT_THROW(Scheduler{c}, ConfigError);
}

// Cache shares: the long-tail table gets an LRU of its own (slots 70..99), the others
// share the pool (slots 0..69). Every row stays in its group's slots, a pull evicts only
// from its own group, each group stays within its rows, and a group too small for a
// micro-batch's rows is a ConfigError naming it. With lookahead eviction too.
TEST(Scheduler, CacheSharesKeepEachTableInItsOwnLru) {
  for (const char* policy : {"vanilla", "herald"}) {
    for (bool lookahead : {false, true}) {
      Workload wl;
      SchedulerConfig c = config(policy, 4, 6, 100, wl);
      c.treatments = {Treatment::kCache, Treatment::kCache, Treatment::kCache};
      c.cache_shares = {0, 0, 30};
      if (lookahead) {
        c.lookahead = 2;
        c.eviction = Eviction::kLookahead;
      }
      Scheduler s(c);
      ASSERT_EQ(s.cache_of(0).groups(), 2u);
      EXPECT_EQ(s.cache_of(0).group_capacity(0), 70u);
      EXPECT_EQ(s.cache_of(0).group_capacity(1), 30u);
      Workload ahead = wl;
      std::vector<StepPlan> plans;
      std::uint64_t evictions = 0;
      for (std::uint64_t it = 0; it < 60; ++it) {
        const GlobalBatch b = wl.next(24, it);
        s.look_ahead_through(it, 1000, [&](GlobalBatch& next) { next = ahead.next(24, s.shown_until()); });
        s.schedule(b, plans);
        for (const StepPlan& p : plans) {
          for (const PullEntry& e : p.pulls) {
            EXPECT_EQ(e.slot >= 70, e.key >= 44) << policy << ": a row in its group's slots";
            if (e.kind != EvictKind::kNone) {
              ++evictions;
              EXPECT_EQ(e.evicted >= 44, e.key >= 44) << policy << ": a pull evicts from its own group";
            }
          }
          for (const RowRef& r : p.rows) EXPECT_EQ(r.slot >= 70, r.key >= 44) << policy;
        }
        for (std::uint32_t w = 0; w < 4; ++w) {
          const WorkerCache& lru = s.cache_of(w);
          for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
            if (lru.occupied(slot)) {
              ASSERT_EQ(slot >= 70, lru.key_at(slot) >= 44) << policy << " slot " << slot;
            }
          }
        }
      }
      EXPECT_GT(evictions, 0u) << policy << ": the long tail's share must be small enough to evict";
    }
  }
  Workload wl;
  SchedulerConfig c = config("herald", 4, 6, 100, wl);
  c.treatments = {Treatment::kCache, Treatment::kCache, Treatment::kCache};
  c.cache_shares = {0, 0, 3};  // below a micro-batch's 6 rows of the long tail
  Scheduler s(c);
  std::vector<StepPlan> plans;
  try {
    for (std::uint64_t it = 0; it < 10; ++it) s.schedule(wl.next(24, it), plans);
    FAIL() << "a share smaller than a micro-batch's rows was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cache share 1 (3 rows)"), std::string::npos) << e.what();
  }
  c.cache_shares = {0, 0, 100};  // no pool left
  EXPECT_THROW(Scheduler{c}, ConfigError);
}

}  // namespace
}  // namespace ember::scheduler
