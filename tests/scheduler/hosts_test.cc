// Hosts: peer sync against the reference, and a scheduler per host planning as one
// scheduler of the job.
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
