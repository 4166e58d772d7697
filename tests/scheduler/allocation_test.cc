// The scheduler's allocation of samples to workers: LAIA, refined, adaptive,
// partitioned, per host, and brute force as the bound.
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

// Two-level allocation (--host-allocation): every worker gets its B samples, the same
// plans with any thread count, and the refinement swaps samples only within a host (the
// samples of each host are those the unrefined allocation gave it).
TEST(Scheduler, HostAllocationIsBalancedAndRefinedWithinHosts) {
  Workload wl;
  const std::uint32_t W = 4, B = 8;
  std::vector<std::vector<std::vector<std::uint32_t>>> host_samples(2);  // [refined][iteration] -> host 0's samples
  for (bool refine : {false, true}) {
    SchedulerConfig c = config("herald", W, B, 60, wl);
    c.host_allocation = true;
    c.host_of = {0, 0, 1, 1};
    c.refine_allocation = refine;
    SchedulerConfig c2 = c;
    c2.threads = 2;
    Scheduler s(c), s2(c2);
    Workload w1, w2;
    std::vector<StepPlan> plans, plans2;
    for (int it = 0; it < 40; ++it) {
      s.schedule(w1.next(W * B, static_cast<std::uint64_t>(it)), plans);
      s2.schedule(w2.next(W * B, static_cast<std::uint64_t>(it)), plans2);
      std::vector<std::uint32_t> host0;
      for (std::uint32_t w = 0; w < W; ++w) {
        ASSERT_EQ(plans[w].samples.size(), B) << "worker " << w << " iteration " << it;
        ASSERT_EQ(plans[w].samples, plans2[w].samples) << "thread count changed the allocation";
        if (c.host_of[w] == 0) host0.insert(host0.end(), plans[w].samples.begin(), plans[w].samples.end());
      }
      std::sort(host0.begin(), host0.end());
      host_samples[refine].push_back(host0);
    }
    // Not LAIA: refused.
    SchedulerConfig bad = config("plan", W, B, 60, wl);
    bad.host_allocation = true;
    bad.host_of = c.host_of;
    EXPECT_THROW(Scheduler{bad}, ConfigError);
  }
  // (The caches differ once refined plans differ: compare the first iteration alone.)
  EXPECT_EQ(host_samples[0][0], host_samples[1][0]) << "the refinement moved samples between hosts";
}

// Herald's Figure 5 in miniature: two workers, each holding (dirty) the rows of one
// sample. LAIA sends each sample to its rows' holder: nothing moves. The swapped
// allocation, which a random partition can pick, moves every row.
TEST(Scheduler, LocationAwareAllocationMovesNothingWhereSwappedMovesRows) {
  Workload wl;
  auto make = [&](std::vector<Key> s0, std::vector<Key> s1) {
    GlobalBatch b;
    b.samples = 2;
    b.tables = 3;
    b.keys = s0;
    b.keys.insert(b.keys.end(), s1.begin(), s1.end());
    return b;
  };
  // Iteration 0 places A = {0, 10, 100} on worker 0 and B = {1, 11, 101} on worker 1.
  GlobalBatch warm = make({0, 10, 100}, {1, 11, 101});
  GlobalBatch swapped = make({1, 11, 101}, {0, 10, 100});
  std::vector<StepPlan> plans;
  Scheduler herald(config("herald", 2, 1, 10, wl));
  herald.schedule_with(warm, {0, 1}, plans);
  IterationStats st = herald.schedule(swapped, plans);
  EXPECT_EQ(st.traffic.transmissions(), 0u);
  EXPECT_EQ(st.traffic.hits, 6u);
  EXPECT_EQ(plans[0].samples, (std::vector<std::uint32_t>{1}));  // sample 1 = A's rows, held by worker 0

  Scheduler plan(config("plan", 2, 1, 10, wl));
  plan.schedule_with(warm, {0, 1}, plans);
  st = plan.schedule_with(swapped, {0, 1}, plans);
  // Each dirty owner pushes its 3 values (the other worker needs them), each worker
  // pulls 3 rows.
  EXPECT_EQ(st.traffic.push_value, 6u);
  EXPECT_EQ(st.traffic.pulls, 6u);
  Scheduler vanilla(config("vanilla", 2, 1, 10, wl));
  vanilla.schedule_with(warm, {0, 1}, plans);
  st = vanilla.schedule_with(swapped, {0, 1}, plans);
  EXPECT_EQ(st.traffic.pulls, 6u);
  EXPECT_EQ(st.traffic.push_grad, 6u);  // full-set sync of every trained row
}

// LAIA: balanced micro-batches, and no sample goes to a worker scoring lower than
// another worker that still had room when the sample was placed.
TEST(Scheduler, LaiaAllocationIsBalancedAndGreedy) {
  Workload wl;
  Scheduler s(config("herald", 4, 6, 60, wl));
  std::vector<StepPlan> plans;
  for (int it = 0; it < 100; ++it) {
    GlobalBatch b = wl.next(24, static_cast<std::uint64_t>(it));
    // Scores from the state before scheduling.
    std::vector<std::array<int, 4>> score(24);
    for (std::uint32_t i = 0; i < 24; ++i) {
      score[i].fill(0);
      for (std::uint32_t t = 0; t < 3; ++t) {
        auto o = s.locations().owner(b.key(i, t));
        if (o != cache::LocationMap::kNoOwner) ++score[i][o];
      }
    }
    s.schedule(b, plans);
    std::vector<std::uint32_t> worker_of(24);
    for (const auto& p : plans) {
      ASSERT_EQ(p.samples.size(), 6u);
      for (auto i : p.samples) worker_of[i] = p.worker;
    }
    std::array<int, 4> room{6, 6, 6, 6};
    for (std::uint32_t i = 0; i < 24; ++i) {
      for (int w = 0; w < 4; ++w) {
        if (room[w] > 0) {
          ASSERT_GE(score[i][worker_of[i]], score[i][w]) << "sample " << i;
        }
      }
      --room[worker_of[i]];
    }
  }
}

// Refined allocation: two pairs of samples, each pair sharing a row nobody holds yet.
// LAIA scores every worker 0 and splits the pairs by its random ties for some seeds; the
// refinement keeps each pair on one worker (each shared row pulled once), whatever the seed.
TEST(Scheduler, RefinedAllocationKeepsSamplesSharingARowTogether) {
  Workload wl;
  GlobalBatch b;
  b.samples = 4;
  b.tables = 3;
  b.keys = {0, 4, 44, 1, 5, 44, 2, 6, 45, 3, 7, 45};  // row 44: samples 0, 1; row 45: 2, 3
  int laia_split = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    for (bool refine : {false, true}) {
      SchedulerConfig c = config("herald", 2, 2, 60, wl);
      c.seed = seed;
      c.refine_allocation = refine;
      Scheduler s(c);
      std::vector<StepPlan> plans;
      const TrafficCounts t = s.schedule(b, plans).traffic;
      if (!refine) {
        laia_split += t.pulls > 10;
        continue;
      }
      EXPECT_EQ(t.pulls, 10u) << "seed " << seed;  // 8 rows of one sample each, 44 and 45 once
      for (const StepPlan& p : plans) {
        ASSERT_EQ(p.samples.size(), 2u);
        EXPECT_EQ(p.samples[0] / 2, p.samples[1] / 2) << "seed " << seed;
      }
    }
  }
  EXPECT_GT(laia_split, 0) << "the case must be one LAIA's ties can get wrong";
}

// Over a run, refined allocation moves fewer rows than Herald's; it refines LAIA only.
TEST(Scheduler, RefinedAllocationMovesFewerRowsThanLaia) {
  for (const char* policy : {"herald", "laia"}) {
    auto run = [&](bool refine) {
      Workload wl;
      SchedulerConfig c = config(policy, 4, 6, 60, wl);
      c.refine_allocation = refine;
      Scheduler s(c);
      std::vector<StepPlan> plans;
      TrafficCounts sum;
      for (int it = 0; it < 300; ++it) {
        sum += s.schedule(wl.next(24, static_cast<std::uint64_t>(it)), plans).traffic;
        for (const StepPlan& p : plans) EXPECT_EQ(p.samples.size(), 6u);
      }
      return sum.transmissions();
    };
    EXPECT_LT(run(true), run(false)) << policy;
  }
  Workload wl;
  for (const char* policy : {"vanilla", "plan", "het:1"}) {
    SchedulerConfig c = config(policy, 4, 6, 60, wl);
    c.refine_allocation = true;
    try {
      Scheduler s(c);
      ADD_FAILURE() << policy;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--refine-allocation refines LAIA's allocation (laia, herald), not ") + policy + "'s");
    }
  }
}

TEST(Scheduler, BruteForceIsNeverWorseThanHeraldPerIteration) {
  Workload wl;
  std::vector<StepPlan> plans;
  for (int it = 0; it < 30; ++it) {
    GlobalBatch b = wl.next(4, static_cast<std::uint64_t>(it));
    Scheduler brute(config("brute", 4, 1, 20, wl)), herald(config("herald", 4, 1, 20, wl));
    // Same history: a few iterations of the same random allocations first.
    Workload hist;
    std::mt19937_64 rng(5);
    for (int h = 0; h < 10; ++h) {
      GlobalBatch hb = hist.next(4, static_cast<std::uint64_t>(h));
      auto alloc = random_allocation(4, 1, rng);
      brute.schedule_with(hb, alloc, plans);
      herald.schedule_with(hb, alloc, plans);
    }
    auto tb = brute.schedule(b, plans).traffic.transmissions();
    auto th = herald.schedule(b, plans).traffic.transmissions();
    ASSERT_LE(tb, th);
  }
}

TEST(Scheduler, AdaptiveLaiaScoresTheHighestDoiTablesWithinBudget) {
  Workload wl;
  SchedulerConfig c = config("herald", 4, 6, 100, wl);
  c.budget_ms = 1e-9;  // room for one table only
  Scheduler s(c);
  std::vector<StepPlan> plans;
  std::uint32_t last_k = 0;
  for (int it = 0; it < 64; ++it) last_k = s.schedule(wl.next(24, static_cast<std::uint64_t>(it)), plans).laia_tables;
  ASSERT_EQ(s.scored_tables().size(), 1u);
  EXPECT_EQ(last_k, 1u);
  // The table scored is the one with the highest DoI.
  const auto& doi = s.table_doi();
  EXPECT_EQ(doi[s.scored_tables()[0]], *std::max_element(doi.begin(), doi.end()));
  // The tiny table (4 rows, trained by every worker) is the least infrequent.
  EXPECT_LE(doi[0], doi[2]);
  SchedulerConfig big = config("herald", 4, 6, 100, wl);
  big.budget_ms = 1e9;  // every table fits
  Scheduler all(big);
  for (int it = 0; it < 32; ++it) all.schedule(wl.next(24, static_cast<std::uint64_t>(it)), plans);
  EXPECT_EQ(all.scored_tables().size(), 3u);
}

// Plain and refined (swaps stay within a partition).
class PartitionedAllocation : public ::testing::TestWithParam<bool> {};

TEST_P(PartitionedAllocation, IsBalancedPerPartitionAndDeterministic) {
  Workload a, b;
  SchedulerConfig c = config("herald", 4, 8, 120, a);
  c.partitions = 2;
  c.threads = 2;
  c.refine_allocation = GetParam();
  SchedulerConfig c1 = c;
  c1.threads = 1;
  Scheduler s2(c), s1(c1);
  std::vector<StepPlan> p2, p1;
  for (int it = 0; it < 50; ++it) {
    s2.schedule(a.next(32, static_cast<std::uint64_t>(it)), p2);
    s1.schedule(b.next(32, static_cast<std::uint64_t>(it)), p1);
    for (int w = 0; w < 4; ++w) {
      ASSERT_EQ(p2[w].samples, p1[w].samples);
      // Each partition (samples 0-15, 16-31) gives every worker 4 samples.
      ASSERT_EQ(std::count_if(p2[w].samples.begin(), p2[w].samples.end(), [](std::uint32_t i) { return i < 16; }), 4);
    }
  }
  SchedulerConfig bad = config("herald", 4, 6, 120, a);
  bad.partitions = 4;  // does not divide 6
  EXPECT_THROW(Scheduler{bad}, ConfigError);
}

INSTANTIATE_TEST_SUITE_P(Refined, PartitionedAllocation, ::testing::Bool());

}  // namespace
}  // namespace ember::scheduler
