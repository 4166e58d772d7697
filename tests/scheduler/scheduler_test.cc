// The scheduler against the plain reference model, policy by policy: traits, counts and
// caches every iteration, multi-hot bags, het, on-demand sync, thread counts, refusals.
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
#include "scheduler_fixture.h"

namespace ember::scheduler {
namespace {

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

TEST(Scheduler, HetWithZeroStalenessIsVanilla) {
  Workload a, b;
  Scheduler v(config("vanilla", 4, 6, 60, a)), h(config("het:0", 4, 6, 60, b));
  std::vector<StepPlan> pv, ph;
  for (int it = 0; it < 200; ++it) {
    GlobalBatch ba = a.next(24, static_cast<std::uint64_t>(it)), bb = b.next(24, static_cast<std::uint64_t>(it));
    expect_same_counts(v.schedule(ba, pv).traffic, h.schedule(bb, ph).traffic, it);
  }
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

}  // namespace
}  // namespace ember::scheduler
