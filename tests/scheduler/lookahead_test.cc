// Lookahead: eviction by next use within the window, the window's checks, and prefetch.
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

// Lookahead eviction against the plain model: every iteration's counts and every cache's
// rows agree, for full-set and on-demand sync, windows of 1 and 3 batches, and a window
// of the whole run (Belady).
class LookaheadAgainstReference : public ::testing::TestWithParam<std::tuple<std::string, std::uint32_t>> {};

TEST_P(LookaheadAgainstReference, CountsAndCachedRowsAgreeEveryIteration) {
  const auto [policy, L] = GetParam();
  const int iterations = 200;
  for (std::uint32_t cache : {30u, 60u}) {
    Workload wl;
    const std::uint32_t W = 4, B = 6;
    std::vector<GlobalBatch> batches;
    for (int it = 0; it < iterations; ++it) batches.push_back(wl.next(W * B, static_cast<std::uint64_t>(it)));
    SchedulerConfig c = config(policy, W, B, cache, wl);
    c.lookahead = L;
    c.eviction = Eviction::kLookahead;
    Scheduler s(c);
    Policy p = parse_policy(policy);
    test::ReferenceModel ref(W, cache, p.sync() == Sync::kOnDemand);
    std::mt19937_64 rng(11);
    std::vector<StepPlan> plans;
    std::size_t shown = 0;
    std::uint64_t evictions = 0;
    for (int it = 0; it < iterations; ++it) {
      for (; shown < batches.size() && shown <= it + L; ++shown) s.look_ahead(batches[shown]);
      const auto end = std::min(batches.size(), static_cast<std::size_t>(it) + 1 + L);
      std::vector<GlobalBatch> window(batches.begin() + it + 1, batches.begin() + static_cast<std::ptrdiff_t>(end));
      auto alloc = random_allocation(W, B, rng);
      TrafficCounts got = s.schedule_with(batches[static_cast<std::size_t>(it)], alloc, plans).traffic;
      TrafficCounts want = ref.step(batches[static_cast<std::size_t>(it)], alloc, &window);
      expect_same_counts(got, want, it);
      for (const StepPlan& plan : plans)
        evictions += std::count_if(plan.pulls.begin(), plan.pulls.end(), [](const PullEntry& e) { return e.kind != EvictKind::kNone; });
      for (std::uint32_t w = 0; w < W; ++w) {
        std::set<Key> got_rows, want_rows;
        for (std::uint32_t slot = 0; slot < cache; ++slot) {
          if (s.cache_of(w).occupied(slot)) got_rows.insert(s.cache_of(w).key_at(slot));
        }
        for (const auto& [k, copy] : ref.copies(static_cast<int>(w))) want_rows.insert(k);
        ASSERT_EQ(got_rows, want_rows) << "worker " << w << " iteration " << it;
      }
    }
    EXPECT_GT(evictions, 100u) << "the workload must fill the caches";
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, LookaheadAgainstReference,
                         ::testing::Combine(::testing::Values("vanilla", "plan"), ::testing::Values(1u, 3u, 200u)));

// Looking ahead never costs rows against LRU on this workload, and Belady's window (the
// whole run) moves no more rows than a short one.
TEST(Scheduler, LookaheadEvictionMovesNoMoreRowsThanLru) {
  auto run = [](Eviction e, std::uint32_t L) {
    Workload wl;
    std::vector<GlobalBatch> batches;
    for (int it = 0; it < 300; ++it) batches.push_back(wl.next(24, static_cast<std::uint64_t>(it)));
    SchedulerConfig c = config("herald", 4, 6, 30, wl);
    c.lookahead = L;
    c.eviction = e;
    Scheduler s(c);
    std::vector<StepPlan> plans;
    TrafficCounts sum;
    std::size_t shown = 0;
    for (std::size_t it = 0; it < batches.size(); ++it) {
      for (; L > 0 && shown < batches.size() && shown <= it + L; ++shown) s.look_ahead(batches[shown]);
      sum += s.schedule(batches[it], plans).traffic;
    }
    return sum.transmissions();
  };
  const auto lru = run(Eviction::kLru, 0), l4 = run(Eviction::kLookahead, 4), belady = run(Eviction::kBelady, 300);
  EXPECT_LT(l4, lru);
  EXPECT_LE(belady, l4);
}

TEST(Scheduler, LookaheadWindowIsCheckedAgainstTheBatchScheduled) {
  Workload wl;
  SchedulerConfig c = config("herald", 4, 6, 60, wl);
  c.lookahead = 1;
  c.eviction = Eviction::kLookahead;
  Scheduler s(c);
  GlobalBatch a = wl.next(24, 0), b = wl.next(24, 1), x = wl.next(24, 2);
  std::vector<StepPlan> plans;
  s.look_ahead(a);
  s.look_ahead(b);
  EXPECT_THROW(s.look_ahead(x), Error);       // a window of 1 beyond the batch scheduled
  EXPECT_THROW(s.schedule(b, plans), Error);  // not the first batch shown
  EXPECT_NO_THROW(s.schedule(a, plans));
  EXPECT_EQ(s.window_size(), 1u);
}

// Prefetch, against the contract stated on its own: a pull of iteration t+1 is marked
// exactly when no worker pushes its row to the PS after t's pulls and before t+1's
// (t's evictions and end pushes, a flush between, t+1's sync pushes), so the PS copy the
// worker reads during t is the one t+1 would read. Nothing else in the plans changes.
TEST(Scheduler, PrefetchMarksExactlyTheRowsNoPushChangesBeforeTheirPull) {
  for (const char* policy : {"herald", "vanilla", "plan", "laia", "fae:0.02"}) {
    for (std::uint32_t L : {0u, 2u}) {
      Workload a, b;
      const std::uint32_t W = 4, B = 6, cache = 40;
      SchedulerConfig on = config(policy, W, B, cache, a), off = config(policy, W, B, cache, b);
      if (parse_policy(policy).replicates_frequent_rows()) {
        on.replicated.assign(a.num_keys, 0);
        for (Key k = 0; k < 4; ++k) on.replicated[k] = 1;  // the tiny table
        off.replicated = on.replicated;
      }
      on.prefetch = true;
      on.lookahead = off.lookahead = L;
      on.eviction = off.eviction = L > 0 ? Eviction::kLookahead : Eviction::kLru;
      Scheduler s(on), plain(off);
      std::vector<GlobalBatch> batches;
      for (int it = 0; it < 160; ++it) batches.push_back(a.next(W * B, static_cast<std::uint64_t>(it)));
      std::vector<StepPlan> plans, plain_plans, flushed;
      std::set<Key> pushed;  // since the last iteration's pulls
      std::uint64_t marked = 0, unmarked = 0, evictions = 0;
      std::size_t shown = 0;
      for (std::size_t it = 0; it < batches.size(); ++it) {
        for (; L > 0 && shown < batches.size() && shown <= it + L; ++shown) {
          s.look_ahead(batches[shown]);
          plain.look_ahead(batches[shown]);
        }
        const TrafficCounts got = s.schedule(batches[it], plans).traffic;
        const TrafficCounts want = plain.schedule(batches[it], plain_plans).traffic;
        expect_same_counts(got, want, static_cast<int>(it));
        for (const StepPlan& p : plans) {
          for (const KeySlot& g : p.push_grads) pushed.insert(g.key);
          for (const KeySlot& v : p.push_values) pushed.insert(v.key);
        }
        std::uint64_t here = 0;
        for (std::uint32_t w = 0; w < W; ++w) {
          ASSERT_EQ(plans[w].pulls.size(), plain_plans[w].pulls.size());
          for (std::size_t j = 0; j < plans[w].pulls.size(); ++j) {
            const PullEntry& e = plans[w].pulls[j];
            ASSERT_EQ(e.key, plain_plans[w].pulls[j].key);
            ASSERT_EQ(e.slot, plain_plans[w].pulls[j].slot);
            ASSERT_FALSE(plain_plans[w].pulls[j].prefetch);
            const bool want_mark = it > 0 && pushed.count(e.key) == 0;
            ASSERT_EQ(e.prefetch, want_mark) << policy << " L=" << L << " iteration " << it << " worker " << w << " key " << e.key;
            here += e.prefetch;
          }
        }
        ASSERT_EQ(got.prefetched, here);
        marked += here;
        unmarked += got.pulls - here;
        pushed.clear();
        for (const StepPlan& p : plans) {
          for (const PullEntry& e : p.pulls) {
            evictions += e.kind == EvictKind::kDirty || e.kind == EvictKind::kPartial;
            if (e.kind == EvictKind::kDirty || e.kind == EvictKind::kPartial) pushed.insert(e.evicted);
          }
          for (const KeySlot& e : p.end_pushes) pushed.insert(e.key);
        }
        if (it % 25 == 24) {
          s.flush(flushed);
          plain.flush(plain_plans);
          for (const StepPlan& p : flushed) {
            for (const KeySlot& g : p.push_grads) pushed.insert(g.key);
            for (const KeySlot& v : p.push_values) pushed.insert(v.key);
          }
        }
      }
      EXPECT_GT(marked, 100u) << policy;
      EXPECT_GT(unmarked, 100u) << policy << ": the workload must push rows that are pulled next";
      if (parse_policy(policy).sync() == Sync::kOnDemand) {
        EXPECT_GT(evictions, 10u) << policy;
      }
    }
  }
}

}  // namespace
}  // namespace ember::scheduler
