// What the scheduler's tests share: a small skewed workload of three tables, a
// configuration for it, random allocations, and a run against the plain reference model
// (reference_model.h) that checks counts and every cache's LRU order each iteration.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "ember/data/zipf.h"
#include "ember/scheduler/scheduler.h"
#include "reference_model.h"

namespace ember::scheduler {

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

inline SchedulerConfig config(const std::string& policy, std::uint32_t W, std::uint32_t B, std::uint32_t cache, const Workload& wl) {
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

inline std::vector<std::uint32_t> random_allocation(std::uint32_t W, std::uint32_t B, std::mt19937_64& rng) {
  std::vector<std::uint32_t> a;
  for (std::uint32_t w = 0; w < W; ++w) a.insert(a.end(), B, w);
  std::shuffle(a.begin(), a.end(), rng);
  return a;
}

inline void expect_same_counts(const TrafficCounts& a, const TrafficCounts& b, int it) {
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

}  // namespace ember::scheduler
