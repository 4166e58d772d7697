#include "ember/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>
#include <set>

#include "ember/common/error.h"
#include "ember/data/zipf.h"
#include "ember/scheduler/host_schedulers.h"
#include "ember/scheduler/simulator.h"
#include "reference_model.h"

namespace ember::scheduler {
namespace {

// Tables of 4, 40 and 400 rows (keys 0..443), skewed draws: tiny tables every worker
// trains, a long tail where placement matters.
struct Workload {
  std::vector<std::uint64_t> offsets{0, 4, 44};
  std::uint64_t num_keys = 444;
  data::ZipfSampler z[3] = {data::ZipfSampler(4, 0.8), data::ZipfSampler(40, 1.0), data::ZipfSampler(400, 1.1)};
  data::SplitMix64 rng{7};
  bool multi_hot = false;  // bags of 0 to 3 ids per table, repeats included

  GlobalBatch next(std::uint32_t n, std::uint64_t index) {
    GlobalBatch b;
    b.index = index;
    b.samples = n;
    b.tables = 3;
    for (std::uint32_t i = 0; i < n; ++i) {
      for (int t = 0; t < 3; ++t) {
        if (!multi_hot) {
          b.keys.push_back(offsets[static_cast<std::size_t>(t)] + z[t](rng));
          continue;
        }
        b.bags.push_back(static_cast<std::uint32_t>(b.keys.size()));
        for (std::uint64_t k = rng.below(4); k > 0; --k) b.keys.push_back(offsets[static_cast<std::size_t>(t)] + z[t](rng));
      }
    }
    if (multi_hot) b.bags.push_back(static_cast<std::uint32_t>(b.keys.size()));
    return b;
  }
};

SchedulerConfig config(const std::string& policy, std::uint32_t W, std::uint32_t B, std::uint32_t cache, const Workload& wl) {
  SchedulerConfig c;
  c.workers = W;
  c.batch_per_worker = B;
  c.cache_rows = cache;
  c.table_offsets = wl.offsets;
  c.num_keys = wl.num_keys;
  c.policy = parse_policy(policy);
  c.seed = 3;
  return c;
}

std::vector<std::uint32_t> random_allocation(std::uint32_t W, std::uint32_t B, std::mt19937_64& rng) {
  std::vector<std::uint32_t> a;
  for (std::uint32_t w = 0; w < W; ++w) a.insert(a.end(), B, w);
  std::shuffle(a.begin(), a.end(), rng);
  return a;
}

void expect_same_counts(const TrafficCounts& a, const TrafficCounts& b, int it) {
  ASSERT_EQ(a.pulls, b.pulls) << "iteration " << it;
  ASSERT_EQ(a.push_grad, b.push_grad) << "iteration " << it;
  ASSERT_EQ(a.push_value, b.push_value) << "iteration " << it;
  ASSERT_EQ(a.push_evict, b.push_evict) << "iteration " << it;
  ASSERT_EQ(a.hits, b.hits) << "iteration " << it;
  ASSERT_EQ(a.peer_value, b.peer_value) << "iteration " << it;
  ASSERT_EQ(a.peer_grad, b.peer_grad) << "iteration " << it;
}

// Runs the scheduler and the plain model over 300 batches of `wl` on random allocations
// (from `seed`): each iteration's counts and every cache's LRU order agree, and
// also(counts, plans) checks more.
template <typename Also>
void run_against_reference(Scheduler& s, test::ReferenceModel& ref, Workload& wl, std::uint32_t W, std::uint32_t B, std::uint64_t seed,
                           Also&& also) {
  std::mt19937_64 rng(seed);
  std::vector<StepPlan> plans;
  for (int it = 0; it < 300; ++it) {
    GlobalBatch b = wl.next(W * B, static_cast<std::uint64_t>(it));
    auto alloc = random_allocation(W, B, rng);
    TrafficCounts got = s.schedule_with(b, alloc, plans).traffic;
    TrafficCounts want = ref.step(b, alloc);
    expect_same_counts(got, want, it);
    for (std::uint32_t w = 0; w < W; ++w) {
      ASSERT_EQ(s.cache_of(w).keys_lru_order(), ref.lru_order(static_cast<int>(w))) << "worker " << w << " iteration " << it;
    }
    also(got, plans);
  }
}

// Each policy is its traits: Herald's Table 2 breakdown (allocation x sync) and the
// baselines.
TEST(Policy, TraitsOfEveryPolicy) {
  struct Want {
    const char* text;
    Allocation allocation;
    Sync sync;
    bool replicates_frequent_rows, simulator_only;
  };
  for (const Want& w :
       {Want{"vanilla", Allocation::kRandom, Sync::kFullSet, false, false}, Want{"laia", Allocation::kLaia, Sync::kFullSet, false, false},
        Want{"plan", Allocation::kRandom, Sync::kOnDemand, false, false}, Want{"herald", Allocation::kLaia, Sync::kOnDemand, false, false},
        Want{"het:2", Allocation::kRandom, Sync::kBoundedStaleness, false, false},
        Want{"fae:0.25", Allocation::kRandom, Sync::kFullSet, true, false},
        Want{"brute", Allocation::kBrute, Sync::kOnDemand, false, true}}) {
    Policy p = parse_policy(w.text);
    EXPECT_EQ(p.name(), w.text);
    EXPECT_EQ(p.allocation(), w.allocation) << w.text;
    EXPECT_EQ(p.sync(), w.sync) << w.text;
    EXPECT_EQ(p.replicates_frequent_rows(), w.replicates_frequent_rows) << w.text;
    EXPECT_EQ(p.simulator_only(), w.simulator_only) << w.text;
  }
  EXPECT_EQ(parse_policy("het:2").staleness(), 2u);
  EXPECT_EQ(parse_policy("het:0").staleness(), 0u);
  EXPECT_EQ(parse_policy("fae:0.25").replicated_fraction(), 0.25);
  EXPECT_EQ(policy_table().size(), 7u);
  Policy none;
  EXPECT_EQ(none.name(), "vanilla");
  EXPECT_EQ(none.allocation(), Allocation::kRandom);
  EXPECT_EQ(none.sync(), Sync::kFullSet);
}

TEST(Policy, ParseErrorsSayWhatIsAccepted) {
  auto message = [](const std::string& text) {
    try {
      parse_policies(text);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message("fastest"), "unknown policy 'fastest' (vanilla, laia, plan, herald, het:S, fae:F, brute)");
  EXPECT_EQ(message("het:x"), "policy 'het:x': het:S needs a staleness S >= 0");
  EXPECT_EQ(message("het"), "policy 'het': het:S needs a staleness S >= 0");
  EXPECT_EQ(message("het:-1"), "policy 'het:-1': het:S needs a staleness S >= 0");
  EXPECT_EQ(message("fae:1"), "policy 'fae:1': fae:F needs a hot fraction F in [0, 1)");
  EXPECT_EQ(message("fae"), "policy 'fae': fae:F needs a hot fraction F in [0, 1)");
  EXPECT_EQ(message("vanilla:3"), "policy 'vanilla:3' takes no argument");
  EXPECT_EQ(message("brute:"), "policy 'brute:' takes no argument");
  EXPECT_EQ(message(","), "no policy given");
  EXPECT_EQ(message("vanilla,,herald,"), "(accepted)");
  EXPECT_EQ(parse_policies("vanilla,,het:3,").size(), 2u);
  EXPECT_EQ(trainable_policies(), "vanilla, laia, plan, herald, het:S or fae:F");
}

// The scheduler against the plain model, on random allocations, for each kind of sync.
class AgainstReference : public ::testing::TestWithParam<std::string> {};

TEST_P(AgainstReference, CountsAndCachesAgreeEveryIteration) {
  const std::string policy = GetParam();
  for (std::uint32_t cache : {30u, 60u, 200u}) {
    Workload wl;
    const std::uint32_t W = 4, B = 6;
    Scheduler s(config(policy, W, B, cache, wl));
    Policy p = parse_policy(policy);
    test::ReferenceModel ref(W, cache, p.sync() == Sync::kOnDemand, p.sync() == Sync::kBoundedStaleness, p.staleness());
    run_against_reference(s, ref, wl, W, B, 11, [](const TrafficCounts&, const std::vector<StepPlan>&) {});
    // Row states agree too.
    for (std::uint32_t w = 0; w < W && p.sync() != Sync::kBoundedStaleness; ++w) {
      for (const auto& [k, copy] : ref.copies(static_cast<int>(w))) {
        const auto& loc = s.locations();
        if (copy.state == test::ReferenceModel::kPartial) {
          EXPECT_TRUE(loc.is_partial(k, w)) << k;
        } else {
          EXPECT_EQ(loc.owner(k), w) << k;
          EXPECT_EQ(loc.dirty(k), copy.state == test::ReferenceModel::kDirty) << k;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, AgainstReference, ::testing::Values("vanilla", "plan", "het:0", "het:2"));

// Multi-hot batches (bags of 0 to 3 ids, repeated ids within a bag, a sample and the
// batch): a sample's rows are the set of its ids, so the counts and caches are the
// plain model's, which reads the ids one by one; and LAIA's scores count a repeated id once.
TEST(Scheduler, MultiHotBatchesAgainstReference) {
  for (const std::string policy : {"vanilla", "plan", "het:1"}) {
    Workload wl;
    wl.multi_hot = true;
    const std::uint32_t W = 4, B = 6, cache = 80;
    Scheduler s(config(policy, W, B, cache, wl));
    Policy p = parse_policy(policy);
    test::ReferenceModel ref(W, cache, p.sync() == Sync::kOnDemand, p.sync() == Sync::kBoundedStaleness, p.staleness());
    run_against_reference(s, ref, wl, W, B, 5, [](const TrafficCounts&, const std::vector<StepPlan>&) {});
  }
  // A sample whose bags repeat one id holds it once: LAIA sends it where the row is.
  Workload wl;
  SchedulerConfig c = config("herald", 2, 1, 10, wl);
  Scheduler s(c);
  std::vector<StepPlan> plans;
  GlobalBatch first;
  first.samples = 2;
  first.tables = 3;
  first.keys = {0, 4, 5, 44, 1, 6};
  first.bags = {0, 1, 3, 4, 5, 6, 6};
  s.schedule_with(first, {0, 1}, plans);  // worker 0 holds 0, 4, 5, 44; worker 1 holds 1, 6
  GlobalBatch second;
  second.index = 1;
  second.samples = 2;
  second.tables = 3;
  // Sample 0: row 6 three times (worker 1's), rows 0 and 4 once (worker 0's): two rows
  // are worker 0's, one is worker 1's, whatever the repeats.
  second.keys = {0, 6, 6, 6, 4, 100};
  second.bags = {0, 1, 4, 5, 5, 6, 6};
  s.schedule(second, plans);
  EXPECT_EQ(plans[0].samples, (std::vector<std::uint32_t>{0}));
  // Keys and bags that disagree are refused with the batch named.
  GlobalBatch bad = second;
  bad.bags.back() = 5;
  EXPECT_THROW(s.schedule(bad, plans), ConfigError);
}

// Peer sync against the plain model: 4 workers on 2 hosts, random allocations. The
// handed rows, the rows that still travel through the PS and every cache agree each
// iteration; a row handed leaves its giver and is its taker's (dirty once trained).
TEST(Scheduler, PeerSyncAgainstReference) {
  for (std::uint32_t cache : {30u, 60u, 200u}) {
    Workload wl;
    const std::uint32_t W = 4, B = 6;
    SchedulerConfig c = config("plan", W, B, cache, wl);
    c.peer_sync = true;
    c.host_of = {0, 0, 1, 1};
    Scheduler s(c);
    test::ReferenceModel ref(W, cache, true);
    ref.peer_sync({0, 0, 1, 1});
    std::uint64_t handed = 0, applied = 0;
    run_against_reference(s, ref, wl, W, B, 13, [&](const TrafficCounts& got, const std::vector<StepPlan>& plans) {
      handed += got.peer_value;
      applied += got.peer_grad;
      for (std::uint32_t w = 0; w < W; ++w) {
        std::uint64_t taken = 0;
        for (const PullEntry& e : plans[w].pulls) taken += e.peer;
        for (const HandValue& v : plans[w].hand_values) {
          EXPECT_EQ(c.host_of[v.to], c.host_of[w]) << "handed within its host";
          EXPECT_NE(v.to, w);
        }
        EXPECT_LE(taken, got.peer_value);
      }
    });
    EXPECT_GT(handed, 0u) << "cache " << cache << ": peer sync never handed a row, the test proves nothing";
    EXPECT_GT(applied, 0u) << "cache " << cache << ": no row was applied in its host";
    // Refused without hosts, and for full-set sync.
    SchedulerConfig bad = config("plan", W, B, cache, wl);
    bad.peer_sync = true;
    EXPECT_THROW(Scheduler{bad}, ConfigError);
    bad = config("vanilla", W, B, cache, wl);
    bad.peer_sync = true;
    bad.host_of = {0, 0, 1, 1};
    EXPECT_THROW(Scheduler{bad}, ConfigError);
  }
}

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

TEST(Scheduler, HetWithZeroStalenessIsVanilla) {
  Workload a, b;
  Scheduler v(config("vanilla", 4, 6, 60, a)), h(config("het:0", 4, 6, 60, b));
  std::vector<StepPlan> pv, ph;
  for (int it = 0; it < 200; ++it) {
    GlobalBatch ba = a.next(24, static_cast<std::uint64_t>(it)), bb = b.next(24, static_cast<std::uint64_t>(it));
    expect_same_counts(v.schedule(ba, pv).traffic, h.schedule(bb, ph).traffic, it);
  }
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

// A row trained by two workers becomes partial on both; when a third needs it, both
// push their gradients and the third pulls the aggregated row.
TEST(Scheduler, PartialGradientsArePushedWhenTheRowIsNextNeeded) {
  Workload wl;
  std::vector<StepPlan> plans;
  Scheduler s(config("plan", 3, 1, 10, wl));
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};  // row 0 shared by workers 0 and 1
  s.schedule_with(b, {0, 1, 2}, plans);
  EXPECT_EQ(s.locations().partials(0), 2u);
  EXPECT_TRUE(s.locations().is_partial(0, 0) && s.locations().is_partial(0, 1) && !s.locations().is_partial(0, 2));
  EXPECT_TRUE(plans[0].rows[0].shared());
  EXPECT_EQ(plans[0].rows[0].trainers, 2u);
  EXPECT_FALSE(plans[0].rows[1].shared());
  GlobalBatch c = b;
  c.keys = {2, 13, 103, 3, 14, 104, 0, 15, 105};  // worker 2 needs row 0
  IterationStats st = s.schedule_with(c, {0, 1, 2}, plans);
  EXPECT_EQ(st.traffic.push_grad, 2u);
  ASSERT_EQ(plans[0].push_grads.size(), 1u);
  EXPECT_EQ(plans[0].push_grads[0].key, 0u);
  EXPECT_EQ(s.locations().partials(0), 0u);
  EXPECT_FALSE(s.locations().is_partial(0, 0));
  EXPECT_EQ(s.locations().owner(0), 2);
  EXPECT_TRUE(s.locations().dirty(0));
}

// flush() leaves the PS with every update: dirty rows pushed as values, partial
// gradients pushed; the copies and their states stay, marked flushed, and the pushes the
// contract would make of them later are skipped. A second flush pushes nothing.
TEST(Scheduler, FlushPushesDirtyValuesAndPartialGradients) {
  Workload wl;
  std::vector<StepPlan> plans;
  Scheduler s(config("plan", 3, 1, 10, wl));
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};  // row 0 shared by workers 0 and 1
  s.schedule_with(b, {0, 1, 2}, plans);
  TrafficCounts c = s.flush(plans);
  EXPECT_EQ(c.push_grad, 2u);   // row 0 from workers 0 and 1
  EXPECT_EQ(c.push_value, 7u);  // every other row, by its sole trainer
  ASSERT_EQ(plans[0].push_grads.size(), 1u);
  EXPECT_EQ(plans[0].push_grads[0].key, 0u);
  EXPECT_EQ(s.locations().partials(0), 2u) << "the partial copies stay (flushes change no state)";
  EXPECT_TRUE(s.locations().flushed(0));
  EXPECT_TRUE(s.cache_of(0).contains(0));
  EXPECT_TRUE(s.cache_of(2).contains(102));
  EXPECT_TRUE(s.locations().dirty(102));
  EXPECT_TRUE(s.locations().flushed(102));
  EXPECT_EQ(s.flush(plans).transmissions(), 0u);
  // Row 0 needed by worker 2, row 102 by worker 0: the contract's pushes of them (the
  // partials' gradients, 102's value) are skipped; the copies go as they would have.
  b.keys = {102, 13, 103, 14, 15, 104, 0, 16, 105};
  const TrafficCounts next = s.schedule_with(b, {0, 1, 2}, plans).traffic;
  EXPECT_EQ(next.push_grad, 0u);
  EXPECT_EQ(next.push_value, 0u);
  EXPECT_TRUE(plans[0].push_grads.empty());
  EXPECT_TRUE(plans[2].push_values.empty());
  EXPECT_FALSE(s.cache_of(0).contains(0));
  EXPECT_EQ(s.locations().owner(102), 0u);
  EXPECT_FALSE(s.locations().flushed(102)) << "trained again: dirty for real";
}

// An evaluation's flush pushes only the rows the evaluation reads (evaluated_rows): a
// partial row and a dirty one among them, nothing else; a full flush then pushes the
// rest, so that the two together push what one full flush pushes.
TEST(Scheduler, AnEvaluationFlushPushesOnlyTheEvaluatedRows) {
  Workload wl;
  std::vector<StepPlan> plans;
  SchedulerConfig c = config("plan", 3, 1, 10, wl);
  c.evaluated_rows = {0, 102, 102, 7};  // repeats and a row never trained are fine
  Scheduler s(c);
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};  // row 0 shared by workers 0 and 1
  s.schedule_with(b, {0, 1, 2}, plans);
  Scheduler whole = s;
  const TrafficCounts all = whole.flush(plans);
  const TrafficCounts eval = s.flush(plans, true);
  EXPECT_EQ(eval.push_grad, 2u);   // row 0's partials, from workers 0 and 1
  EXPECT_EQ(eval.push_value, 1u);  // row 102, by worker 2
  for (const StepPlan& p : plans) {
    for (const KeySlot& e : p.push_values) EXPECT_EQ(e.key, 102u);
    for (const KeySlot& e : p.push_grads) EXPECT_EQ(e.key, 0u);
  }
  EXPECT_TRUE(s.locations().flushed(0));
  EXPECT_TRUE(s.locations().flushed(102));
  EXPECT_FALSE(s.locations().flushed(100)) << "not evaluated: waits for a full flush";
  EXPECT_TRUE(s.locations().dirty(100));
  const TrafficCounts rest = s.flush(plans);
  EXPECT_EQ(eval.push_grad + rest.push_grad, all.push_grad);
  EXPECT_EQ(eval.push_value + rest.push_value, all.push_value);
  EXPECT_EQ(rest.push_value, 6u);
  EXPECT_EQ(s.flush(plans, true).transmissions(), 0u);
}

// Flushes (evaluations, checkpoints) change no allocation, slot, hit or eviction: a
// scheduler that flushes every few iterations plans exactly what one that never flushes
// does, except for the pushes the flushes made early. A scheduler replayed from
// iteration 0 and flushed, as a resumed worker's loader does, holds the same rows in
// the same slots as the one that ran. So a job resumed from a checkpoint meets the same
// rows on the same workers as the uninterrupted job, and its floating-point sums add up
// in the same order (Adagrad magnifies any other order).
TEST(Scheduler, FlushesChangeNoPlanAndAReplayRebuildsTheCaches) {
  for (const char* policy : {"vanilla", "laia", "plan", "herald"}) {
    for (const std::uint32_t L : {0u, 3u}) {
      Workload wl;
      SchedulerConfig cfg = config(policy, 4, 8, 30, wl);
      cfg.lookahead = L;
      cfg.eviction = L > 0 ? Eviction::kLookahead : Eviction::kLru;
      cfg.refine_allocation = std::string(policy) == "herald";
      Scheduler flushing(cfg), plain(cfg);
      std::vector<GlobalBatch> batches;
      for (std::uint32_t it = 0; it < 80 + L; ++it) batches.push_back(wl.next(32, it));
      std::vector<StepPlan> a, b, f;
      std::uint64_t flushed = 0, skipped = 0;
      auto transmissions = [](const TrafficCounts& c) { return c.push_grad + c.push_value + c.push_evict; };
      for (std::uint32_t it = 0; it < 80; ++it) {
        for (Scheduler* s : {&flushing, &plain}) {
          s->look_ahead_through(it, 80, [&, s](GlobalBatch& next) { next = batches[s->shown_until()]; });
        }
        const TrafficCounts ca = flushing.schedule(batches[it], a).traffic;
        const TrafficCounts cb = plain.schedule(batches[it], b).traffic;
        ASSERT_EQ(ca.pulls, cb.pulls) << policy << " L=" << L << " iteration " << it;
        ASSERT_EQ(ca.hits, cb.hits) << policy << " iteration " << it;
        skipped += transmissions(cb) - transmissions(ca);
        for (std::uint32_t w = 0; w < 4; ++w) {
          ASSERT_EQ(a[w].samples, b[w].samples) << policy << " L=" << L << " iteration " << it << " worker " << w;
          ASSERT_EQ(a[w].pulls.size(), b[w].pulls.size());
          for (std::size_t j = 0; j < a[w].pulls.size(); ++j) {
            ASSERT_EQ(a[w].pulls[j].key, b[w].pulls[j].key);
            ASSERT_EQ(a[w].pulls[j].slot, b[w].pulls[j].slot);
            ASSERT_EQ(a[w].pulls[j].evicted, b[w].pulls[j].evicted);
          }
        }
        if (it % 7 == 6) flushed += flushing.flush(f).transmissions();
        if (it == 40 || it == 61) {
          // A replay of 0 .. it, flushed: the same rows in the same slots.
          Scheduler replay(cfg);
          std::vector<StepPlan> r;
          for (std::uint32_t t = 0; t <= it; ++t) {
            replay.look_ahead_through(t, 80, [&](GlobalBatch& next) { next = batches[replay.shown_until()]; });
            replay.schedule(batches[t], r);
          }
          replay.flush(r);
          for (std::uint32_t w = 0; w < 4; ++w) {
            const auto want = plain.latest_rows(w);
            const auto got = replay.latest_rows(w);
            ASSERT_EQ(got.size(), want.size()) << policy << " iteration " << it;
            for (std::size_t j = 0; j < got.size(); ++j) {
              ASSERT_EQ(got[j].key, want[j].key);
              ASSERT_EQ(got[j].slot, want[j].slot);
            }
          }
        }
      }
      if (std::string(policy) == "plan" || std::string(policy) == "herald") {  // full-set sync leaves nothing to flush
        EXPECT_GT(flushed, 0u) << policy;
        EXPECT_GT(skipped, 0u) << policy << ": flushed rows are not pushed again";
        EXPECT_LE(skipped, flushed) << policy;
      }
    }
  }
}

// Algorithm 2 is minimal: every value pushed is needed by another worker in the same
// iteration; every gradient pushed belongs to a row someone trains now.
TEST(Scheduler, OnDemandPlanPushesOnlyWhatOthersNeed) {
  Workload wl;
  Scheduler s(config("herald", 4, 6, 60, wl));
  std::vector<StepPlan> plans;
  for (int it = 0; it < 300; ++it) {
    GlobalBatch b = wl.next(24, static_cast<std::uint64_t>(it));
    s.schedule(b, plans);
    std::vector<std::set<Key>> used(4);
    for (const auto& p : plans) {
      for (const auto& r : p.rows) used[p.worker].insert(r.key);
    }
    for (const auto& p : plans) {
      for (const auto& v : p.push_values) {
        bool other = false;
        for (std::uint32_t w = 0; w < 4; ++w) other |= w != p.worker && used[w].count(v.key);
        ASSERT_TRUE(other) << "value of row " << v.key << " pushed that no other worker needs";
      }
      for (const auto& g : p.push_grads) {
        bool someone = false;
        for (std::uint32_t w = 0; w < 4; ++w) someone |= used[w].count(g.key) > 0;
        ASSERT_TRUE(someone) << "gradient of row " << g.key << " pushed that nobody needs";
      }
      ASSERT_TRUE(p.end_pushes.empty());
    }
  }
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

TEST(Scheduler, SameInputsGiveIdenticalPlansWithAnyThreadCount) {
  for (const char* policy : {"herald", "vanilla", "het:1", "herald refined", "herald refined P2"}) {
    const std::string name(policy);
    Workload a, b;
    SchedulerConfig ca = config(name.substr(0, name.find(' ')), 8, 4, 120, a);
    ca.refine_allocation = name.find("refined") != std::string::npos;
    ca.partitions = name.find("P2") != std::string::npos ? 2 : 1;
    SchedulerConfig cb = ca;
    cb.threads = 2;
    Scheduler sa(ca), sb(cb);
    std::vector<StepPlan> pa, pb;
    for (int it = 0; it < 100; ++it) {
      sa.schedule(a.next(32, static_cast<std::uint64_t>(it)), pa);
      sb.schedule(b.next(32, static_cast<std::uint64_t>(it)), pb);
      for (int w = 0; w < 8; ++w) {
        ASSERT_EQ(pa[w].samples, pb[w].samples);
        ASSERT_EQ(pa[w].pulls.size(), pb[w].pulls.size());
        for (std::size_t j = 0; j < pa[w].pulls.size(); ++j) {
          ASSERT_EQ(pa[w].pulls[j].key, pb[w].pulls[j].key);
          ASSERT_EQ(pa[w].pulls[j].slot, pb[w].pulls[j].slot);
        }
      }
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

TEST(Scheduler, ImpossibleConfigurationsAreConfigErrors) {
  Workload wl;
  std::vector<StepPlan> plans;
  Scheduler tiny(config("herald", 2, 4, 3, wl));  // 3 rows < a micro-batch's distinct rows
  try {
    tiny.schedule(wl.next(8, 0), plans);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_policy("fastest"), ConfigError);
  EXPECT_THROW(parse_policy("het:x"), ConfigError);
  EXPECT_THROW(parse_policy("fae:1.5"), ConfigError);
  EXPECT_THROW(Scheduler(config("brute", 4, 2, 20, wl)), ConfigError);
  SchedulerConfig het = config("het:1", 4, 2, 20, wl);
  het.prefetch = true;  // its pulls refresh stale copies: not planned by pushes
  EXPECT_THROW(Scheduler{het}, ConfigError);
  Scheduler ok(config("vanilla", 2, 4, 30, wl));
  EXPECT_THROW(ok.schedule(wl.next(6, 0), plans), ConfigError);  // not W x B samples
}

}  // namespace
}  // namespace ember::scheduler

namespace ember::scheduler {
namespace {

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

}  // namespace
}  // namespace ember::scheduler

namespace ember::scheduler {
namespace {

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

}  // namespace
}  // namespace ember::scheduler

namespace ember::scheduler {
namespace {

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

// Past 64 workers (no worker mask anywhere): 96 workers against the plain model, on
// demand and full-set, and peer sync on 12 hosts of 8; counts and every cache agree each
// iteration.
TEST(Scheduler, MoreThan64WorkersAgainstReference) {
  const std::uint32_t W = 96, B = 2, cache = 24;
  std::vector<std::uint32_t> host_of(W);
  std::vector<int> ref_hosts(W);
  for (std::uint32_t w = 0; w < W; ++w) host_of[w] = w / 8, ref_hosts[w] = static_cast<int>(w / 8);
  for (const char* policy : {"plan", "vanilla", "peer"}) {
    Workload wl;
    const bool peer = std::string(policy) == "peer";
    SchedulerConfig c = config(peer ? "plan" : policy, W, B, cache, wl);
    test::ReferenceModel ref(static_cast<int>(W), cache, std::string(policy) != "vanilla");
    if (peer) {
      c.peer_sync = true;
      c.host_of = host_of;
      ref.peer_sync(ref_hosts);
    }
    Scheduler s(c);
    std::uint64_t shared = 0, high = 0;
    run_against_reference(s, ref, wl, W, B, 17, [&](const TrafficCounts&, const std::vector<StepPlan>& plans) {
      for (const StepPlan& p : plans) {
        for (const RowRef& r : p.rows) {
          shared += r.trainers > 64;
          high += p.worker >= 64 && r.shared();
        }
      }
    });
    EXPECT_GT(shared, 0u) << policy << ": no row had more than 64 trainers";
    EXPECT_GT(high, 0u) << policy << ": workers past 64 shared no row";
  }
  SchedulerConfig over = config("plan", Scheduler::kMaxWorkers + 1, 1, 8, Workload{});
  EXPECT_THROW(Scheduler{over}, ConfigError);
  over = config("het:1", 65, 1, 8, Workload{});
  EXPECT_THROW(Scheduler{over}, ConfigError) << "het keeps a 64-bit mask per row";
}

// A scheduler per host (each modelling its own host's caches, the other hosts'
// evictions applied after each iteration) plans every worker exactly as one scheduler of
// the whole job: 80 workers on 10 hosts, LAIA (each host allocates on its own), on
// demand with lookahead and prefetch, peer sync with two-level allocation refined, and
// full-set; flushes in between. Its state is a fraction of the whole job's.
TEST(Scheduler, HostSchedulersPlanAsOneSchedulerOfTheJob) {
  const std::uint32_t W = 80, B = 3, cache = 10;
  std::vector<std::uint32_t> host_of(W);
  for (std::uint32_t w = 0; w < W; ++w) host_of[w] = w / 8;
  struct Case {
    const char* name;
    const char* policy;
    bool window, peer;
  };
  for (const Case& k : {Case{"herald", "herald", false, false}, Case{"herald+window", "herald", true, false},
                        Case{"peer+host-allocation", "herald", false, true}, Case{"vanilla+window", "vanilla", true, false}}) {
    Workload wl;
    SchedulerConfig c = config(k.policy, W, B, cache, wl);
    c.host_of = host_of;
    if (k.window) {
      c.lookahead = 2;
      c.eviction = Eviction::kLookahead;
      c.prefetch = true;
    }
    if (k.peer) {
      c.peer_sync = c.host_allocation = c.refine_allocation = true;
    }
    Scheduler whole(c);
    HostSchedulers hosts(c);
    std::vector<GlobalBatch> batches;
    for (std::uint64_t t = 0; t < 60 + c.lookahead; ++t) batches.push_back(wl.next(W * B, t));
    for (std::uint32_t t = 0; t < c.lookahead; ++t) {
      whole.look_ahead(batches[t]);
      hosts.look_ahead(batches[t]);
    }
    std::vector<StepPlan> a, b;
    std::uint64_t evicted = 0;
    for (std::uint32_t t = 0; t < 60; ++t) {
      if (c.lookahead > 0) {
        whole.look_ahead(batches[t + c.lookahead]);
        hosts.look_ahead(batches[t + c.lookahead]);
      }
      const TrafficCounts ta = whole.schedule(batches[t], a).traffic;
      const TrafficCounts tb = hosts.schedule(batches[t], b).traffic;
      ASSERT_EQ(ta.transmissions(), tb.transmissions()) << k.name << " iteration " << t;
      ASSERT_EQ(ta.hits, tb.hits) << k.name << " iteration " << t;
      for (std::uint32_t w = 0; w < W; ++w)
        ASSERT_EQ(plan_hash(a[w], 0), plan_hash(b[w], 0)) << k.name << " worker " << w << " iteration " << t;
      for (std::uint32_t h = 0; h < hosts.hosts(); ++h) evicted += hosts.host(h).evictions().size();
      if (t % 9 == 8) {
        const TrafficCounts fa = whole.flush(a), fb = hosts.flush(b);
        ASSERT_EQ(fa.push_grad + fa.push_value, fb.push_grad + fb.push_value) << k.name << " flush after " << t;
        for (std::uint32_t w = 0; w < W; ++w) ASSERT_EQ(plan_hash(a[w], 0), plan_hash(b[w], 0)) << k.name << " flush, worker " << w;
      }
    }
    EXPECT_GT(evicted, 500u) << k.name << ": too few evictions to exchange, the test proves little";
    for (std::uint32_t w = 0; w < W; ++w) {
      const auto x = whole.latest_rows(w), y = hosts.host(host_of[w]).latest_rows(w);
      ASSERT_EQ(x.size(), y.size()) << k.name;
      for (std::size_t j = 0; j < x.size(); ++j) EXPECT_TRUE(x[j].key == y[j].key && x[j].slot == y[j].slot) << k.name;
    }
    EXPECT_LT(hosts.memory_bytes() * 4, whole.memory_bytes()) << k.name << ": a host's scheduler holds the whole job's state";
  }
}

// A scheduler of one host refuses to go on before the other hosts' evictions are in, and
// refuses evictions outside the job or when none are awaited.
TEST(Scheduler, HostSchedulerWaitsForTheOtherHostsEvictions) {
  Workload wl;
  SchedulerConfig c = config("herald", 16, 2, 20, wl);
  c.host_of.assign(16, 0);
  for (std::uint32_t w = 8; w < 16; ++w) c.host_of[w] = 1;
  c.model_host = 1;
  Scheduler s(c);
  std::vector<StepPlan> plans;
  EXPECT_THROW(s.apply_evictions({}), Error) << "nothing scheduled yet";
  s.schedule(wl.next(32, 0), plans);
  EXPECT_TRUE(plans[0].rows.empty()) << "host 0's plans are not this scheduler's";
  EXPECT_FALSE(plans[8].rows.empty());
  EXPECT_THROW(s.schedule(wl.next(32, 1), plans), Error);
  EXPECT_THROW(s.flush(plans), Error);
  EXPECT_THROW(s.apply_evictions({RowEviction{1, 99, false, false}}), Error) << "worker 99 is not in the job";
  s.apply_evictions({});
  EXPECT_NO_THROW(s.schedule(wl.next(32, 1), plans));
  EXPECT_THROW(s.cache_of(0), Error);
  c.model_host = 2;
  EXPECT_THROW(Scheduler{c}, ConfigError) << "host 2 has no worker";
}

}  // namespace
}  // namespace ember::scheduler
