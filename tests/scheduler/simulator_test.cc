#include "ember/scheduler/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/common/error.h"
#include "ember/scheduler/fae_profile.h"
#include "synthetic_dataset.h"
#include "test_util.h"
#include "tier_model.h"

namespace ember::scheduler {
namespace {
namespace fs = std::filesystem;

class Simulator : public test::TempDirTest {
 protected:
  fs::path dataset(std::uint64_t rows, double scale) {
    data::GenOptions g;
    g.rows = rows;
    g.scale = scale;
    return test::prepare_synthetic(dir_, g);
  }
};

// The tier model (ember-sim --ram-budget-mb) keeps the budget's rows, drops the least
// recently used, reads no row on its first use (it is initialized), and keeps a hinted
// row until its iteration is done.
TEST(TierModel, KeepsTheBudgetsRowsAndHintedOnesUntilTheirIteration) {
  TierModel t(2 * 512, 512);  // 2 rows
  t.touch(0, 0);
  t.touch(0, 1);
  t.touch(0, 0);  // in memory
  t.touch(1, 2);  // a first use: drops row 1, the least recently used
  t.touch(1, 0);
  EXPECT_EQ(t.reads(), 0u) << "first uses are not read";
  t.touch(1, 1);
  EXPECT_EQ(t.critical_reads(), 1u) << "row 1 was dropped";
  // A hint at iteration 1 for iteration 3 of row 2 (used, dropped): read now, kept while
  // iterations 1-3 run.
  t.hint(1, 3, 2);
  EXPECT_EQ(t.reads(), 2u);
  EXPECT_EQ(t.critical_reads(), 1u) << "a hinted read is off the critical path";
  for (std::uint64_t row : {8, 9, 10}) t.touch(2, row);
  t.touch(3, 2);
  EXPECT_EQ(t.critical_reads(), 1u) << "the hinted row was kept through iteration 2's rows";
  for (std::uint64_t row : {11, 12, 13}) t.touch(4, row);
  t.touch(4, 2);
  EXPECT_EQ(t.critical_reads(), 2u) << "after iteration 3 it may go";
  t.hint(4, 5, 99);
  EXPECT_EQ(t.reads(), 3u) << "a row never used is not hinted (the shard has nothing to read)";
  EXPECT_EQ(t.rows_touched(), 14u);
}

// ember-sim's disk-tier prediction: with room for every row, nothing is read (first uses
// are initialized in memory); with a budget under one iteration's rows, rows are read
// again, and hints at the lookahead's distance take reads off the critical path; without
// lookahead there are no hints.
TEST_F(Simulator, DiskTierReadsWithAndWithoutHints) {
  data::Dataset ds = data::Dataset::open(dataset(40 * 4 * 256, 0.01));
  SimOptions o;
  o.scheduler.workers = 4;
  o.scheduler.batch_per_worker = 256;
  o.scheduler.policy = "herald";
  o.scheduler.cache_ratio = 0.1;
  o.iterations = 30;
  o.warmup = 0;
  o.shards = 2;
  o.shard_of = [](Key k) { return static_cast<std::uint32_t>(k % 2); };
  o.tier_row_bytes = 64 * 4;
  o.tier_budget_bytes = std::uint64_t{1} << 40;
  o.scheduler.lookahead = 2;
  const SimResult all = simulate(ds, o);
  ASSERT_EQ(all.per_shard_tier.size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_GT(all.per_shard_tier[s].rows_touched, 0u);
    EXPECT_EQ(all.per_shard_tier[s].reads, 0u) << "every row stays in memory";
    EXPECT_EQ(all.per_shard_tier_hinted[s].reads, 0u);
  }
  o.tier_budget_bytes = 1024 * o.tier_row_bytes;  // far under an iteration's rows
  const SimResult small = simulate(ds, o);
  std::uint64_t plain = 0, hinted = 0;
  for (std::size_t s = 0; s < 2; ++s) {
    const TierReads& t = small.per_shard_tier[s];
    plain += t.critical_reads;
    hinted += small.per_shard_tier_hinted[s].critical_reads;
    EXPECT_GT(t.reads, 0u) << "a small budget reads rows again";
    EXPECT_EQ(t.critical_reads, t.reads) << "no hints: every read is waited for";
    EXPECT_LT(t.reads, t.rows_touched) << "rows used again within the budget stay in memory";
  }
  EXPECT_LT(hinted, plain);
  o.scheduler.lookahead = 0;
  const SimResult none = simulate(ds, o);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(none.per_shard_tier_hinted[s].critical_reads, none.per_shard_tier[s].critical_reads) << "no lookahead, no hints";
    EXPECT_EQ(none.per_shard_tier_hinted[s].reads, none.per_shard_tier[s].reads);
  }
  // A tier needs the shards.
  o.shards = 0;
  EXPECT_THROW(simulate(ds, o), ConfigError);
}

TEST_F(Simulator, HeraldMovesFewerRowsThanVanillaAndPartsAddUp) {
  data::Dataset ds = data::Dataset::open(dataset(40 * 8 * 64, 0.01));
  SimOptions o;
  o.scheduler.workers = 8;
  o.scheduler.batch_per_worker = 64;
  o.iterations = 30;
  o.warmup = 10;
  auto run = [&](const std::string& policy) {
    o.scheduler.policy = policy;
    return simulate(ds, o);
  };
  SimResult v = run("vanilla");
  SimResult l = run("laia");
  SimResult p = run("plan");
  SimResult h = run("herald");
  EXPECT_EQ(v.policy, "vanilla");
  EXPECT_EQ(v.iterations, 30u);
  ASSERT_EQ(h.per_iteration.size(), 30u);
  TrafficCounts sum;
  for (const auto& c : h.per_iteration) sum += c;
  EXPECT_EQ(sum.transmissions(), h.traffic.transmissions());
  // Full-set sync never pushes values; on-demand never pushes more gradients.
  EXPECT_EQ(v.traffic.push_value, 0u);
  EXPECT_LT(l.traffic.pulls, v.traffic.pulls);
  EXPECT_LT(p.traffic.pushes(), v.traffic.pushes());
  EXPECT_LT(h.traffic.transmissions(), l.traffic.transmissions());
  EXPECT_LT(h.traffic.transmissions(), p.traffic.transmissions());
  EXPECT_GT(h.hit_rate(), v.hit_rate());
  // Every micro-batch row is either a hit or a pull: the same total for every policy.
  EXPECT_EQ(v.traffic.hits + v.traffic.pulls,
            l.traffic.hits + l.traffic.pulls + (v.traffic.hits + v.traffic.pulls - l.traffic.hits - l.traffic.pulls));
  SimResult f = run("fae:0.01");
  EXPECT_GT(f.traffic.hot_sync, 0u);
  EXPECT_LT(f.traffic.transmissions(), v.traffic.transmissions());
  SimResult het = run("het:4");
  EXPECT_LT(het.traffic.pulls, v.traffic.pulls);
}

// Per-link counts, and per-host aggregation as modelled: 8 workers on 2 hosts with the PS
// on a host of its own, every row crosses; aggregated, repeats within a host become
// hand-offs and sums there (rows conserved, fewer across). One worker per host: no
// repeats within a host, the same counts as without aggregation.
TEST_F(Simulator, PerHostAggregationMovesRepeatsWithinTheHost) {
  data::Dataset ds = data::Dataset::open(dataset(40 * 8 * 64, 0.01));
  for (const char* policy : {"vanilla", "herald"}) {
    for (const std::uint32_t hosts : {2u, 8u}) {
      SimOptions o;
      o.scheduler.workers = 8;
      o.scheduler.batch_per_worker = 64;
      o.scheduler.policy = policy;
      o.iterations = 30;
      o.warmup = 10;
      o.link_of = [](WorkerId, Key) -> std::size_t { return 1; };  // the PS on a host of its own
      o.host_of = [hosts](WorkerId w) { return static_cast<std::uint32_t>(w * hosts / 8); };
      const SimResult r = simulate(ds, o);
      const std::string what = std::string(policy) + ", " + std::to_string(hosts) + " hosts";
      ASSERT_EQ(r.per_link.size(), 2u);
      ASSERT_EQ(r.per_link_aggregated.size(), 2u);
      const TrafficCounts &flat = r.per_link[1], &in = r.per_link_aggregated[0], &across = r.per_link_aggregated[1];
      EXPECT_EQ(flat.pulls, r.traffic.pulls) << what;
      EXPECT_EQ(r.per_link[0].transmissions(), 0u) << what;
      EXPECT_EQ(in.pulls + across.pulls, flat.pulls) << what;
      EXPECT_EQ(in.push_grad + across.push_grad, flat.push_grad) << what;
      EXPECT_EQ(across.push_value, flat.push_value) << what;
      EXPECT_EQ(in.flush_grad + across.flush_grad, flat.flush_grad) << what;
      if (hosts == 8) {
        EXPECT_EQ(across.transmissions(), flat.transmissions()) << what;
        EXPECT_EQ(in.transmissions(), 0u) << what;
      } else {
        EXPECT_LT(across.pulls, flat.pulls) << what << ": rows 4 workers of a host all pull cross once";
        EXPECT_GT(in.pulls, 0u) << what;
        if (std::string(policy) == "vanilla") {
          EXPECT_LT(across.push_grad, flat.push_grad) << what;
        }
      }
    }
  }
}

TEST_F(Simulator, ImpossibleConfigurations) {
  data::Dataset ds = data::Dataset::open(dataset(2000, 0.01));
  SimOptions o;
  o.scheduler.policy = "herald";
  o.scheduler.workers = 8;
  o.scheduler.batch_per_worker = 512;  // 4096 > 2000 rows
  EXPECT_THROW(simulate(ds, o), ConfigError);
  o.scheduler.batch_per_worker = 16;
  o.iterations = 100;  // 110 batches of 128 > 2000 rows
  EXPECT_THROW(simulate(ds, o), ConfigError);
  o.iterations = 5;
  o.scheduler.cache_ratio = 0.0001;  // a few rows
  EXPECT_THROW(simulate(ds, o), ConfigError);
}

// The host flags' one-line refusals: --hosts that does not divide --workers, a host map
// that is not a partition of the workers, a mechanism without hosts; a map of unequal
// hosts is accepted and counts like the same hosts given as --hosts where they agree.
TEST_F(Simulator, HostFlagsAreRefusedUnlessTheyPartitionTheWorkers) {
  const std::string base = test::bin("ember-sim") + " --synthetic criteo --scale 0.01 --iterations 7 --warmup 1 --batch-per-worker 16 " +
                           "--workers 4 --policy herald --json -q";
  const std::pair<const char*, const char*> refused[] = {
      {" --hosts 3", "--hosts 3 does not divide --workers 4"},
      {" --host-map 0,0,1", "gives 3 workers' hosts; --workers is 4"},
      {" --host-map 0,0,2,2", "not a partition of the workers: host 1 has none"},
      {" --host-map 0,x,1,1", "'x' is not a host index"},
      {" --peer-sync", "--peer-sync needs every worker's host"},
      {" --host-allocation", "--host-allocation needs every worker's host"},
  };
  for (const auto& [flags, says] : refused) {
    std::string out;
    EXPECT_NE(test::run_command(base + flags + " 2>&1", out), 0) << flags;
    EXPECT_NE(out.find(says), std::string::npos) << flags << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << flags << ": one line: " << out;
  }
  std::string by_map, by_count;
  ASSERT_EQ(test::run_command(base + " --host-map 0,0,1,1 --peer-sync --host-allocation", by_map), 0) << by_map;
  ASSERT_EQ(test::run_command(base + " --hosts 2 --peer-sync --host-allocation", by_count), 0) << by_count;
  // (The per-link counts: the JSON from "links" on; the fields before include timings.)
  const auto links = [](const std::string& out) { return out.substr(std::min(out.find("\"links\""), out.size())); };
  EXPECT_FALSE(links(by_map).empty()) << by_map;
  EXPECT_EQ(links(by_map), links(by_count));
  std::string unequal;
  ASSERT_EQ(test::run_command(base + " --host-map 0,0,0,1 --peer-sync", unequal), 0) << unequal;
}

// The builder fills what each option asks for, the same as assembling the config by hand.
TEST_F(Simulator, SchedulerConfigFromOptions) {
  data::Dataset ds = data::Dataset::open(dataset(40 * 4 * 16, 0.01));
  SchedulerOptions o;
  o.workers = 4;
  o.batch_per_worker = 16;
  o.cache_ratio = 0.05;
  o.policy = "herald";
  o.seed = 9;
  o.threads = 2;
  o.budget_ms = 0.5;
  o.partitions = 4;
  o.iterations = 40;
  SchedulerConfig c = make_scheduler_config(ds, o);
  EXPECT_EQ(c.workers, 4u);
  EXPECT_EQ(c.batch_per_worker, 16u);
  EXPECT_EQ(c.table_offsets, ds.manifest().table_offsets());
  EXPECT_EQ(c.num_keys, ds.manifest().total_table_rows());
  EXPECT_EQ(c.cache_rows, cache_rows_for(0.05, c.num_keys));
  EXPECT_EQ(c.policy.name(), "herald");
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.budget_ms, 0.5);
  EXPECT_EQ(c.partitions, 4u);
  EXPECT_TRUE(c.replicated.empty());
  EXPECT_EQ(c.first_iteration, 0u);

  // A key space larger than the rows the file saw.
  std::vector<std::uint64_t> rows;
  for (const auto& t : ds.manifest().tables) rows.push_back(t.rows + 10);
  o.table_rows = rows;
  SchedulerConfig big = make_scheduler_config(ds, o);
  EXPECT_EQ(big.num_keys, c.num_keys + 10 * rows.size());
  EXPECT_EQ(big.table_offsets[1], rows[0]);
  o.table_rows.pop_back();
  EXPECT_THROW(make_scheduler_config(ds, o), ConfigError);
  o.table_rows.clear();

  // fae: the hot rows are the most accessed in the job's batches, as many as the fraction
  // of the key space asks (every one of them accessed).
  o.policy = "fae:0.01";
  SchedulerConfig f = make_scheduler_config(ds, o);
  ASSERT_EQ(f.replicated.size(), f.num_keys);
  EXPECT_EQ(f.replicated, profile_replicated_rows(ds, o, 0.01));
  std::vector<std::uint64_t> count(f.num_keys, 0);
  data::BatchReader reader = global_batch_reader(ds, o);
  data::Batch b;
  GlobalBatch g;
  for (std::uint64_t it = 0; it < o.iterations && reader.next(b); ++it) {
    to_global_batch(b, f.table_offsets, g);
    for (Key k : g.keys) ++count[k];
  }
  std::uint64_t coldest_hot = UINT64_MAX, hottest_cold = 0;
  for (Key k = 0; k < f.num_keys; ++k) {
    if (f.replicated[k])
      coldest_hot = std::min(coldest_hot, count[k]);
    else
      hottest_cold = std::max(hottest_cold, count[k]);
  }
  EXPECT_GT(coldest_hot, 0u);
  EXPECT_GE(coldest_hot, hottest_cold);
  const auto accessed = static_cast<std::uint64_t>(std::count_if(count.begin(), count.end(), [](std::uint64_t n) { return n > 0; }));
  const auto wanted = static_cast<std::uint64_t>(std::floor(0.01 * static_cast<double>(f.num_keys)));
  EXPECT_EQ(static_cast<std::uint64_t>(std::count(f.replicated.begin(), f.replicated.end(), 1)), std::min(wanted, accessed));

  o.policy = "fastest";
  EXPECT_THROW(make_scheduler_config(ds, o), ConfigError);
  o.policy = "herald";
  o.cache_ratio = 0;
  EXPECT_THROW(make_scheduler_config(ds, o), ConfigError);
}

// brute is simulator-only: refused for training, with the message a worker gives.
TEST_F(Simulator, TrainingRefusesSimulatorOnlyPolicies) {
  data::Dataset ds = data::Dataset::open(dataset(400, 0.01));
  SchedulerOptions o;
  o.workers = 4;
  o.batch_per_worker = 1;
  o.policy = "brute";
  EXPECT_EQ(make_scheduler_config(ds, o).policy.allocation(), Allocation::kBrute);
  o.for_training = true;
  try {
    make_scheduler_config(ds, o);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--policy brute is simulator-only (ember-sim); training runs vanilla, laia, plan, herald, het:S or fae:F");
  }
  for (const char* p : {"vanilla", "laia", "plan", "herald", "het:1", "fae:0.01"}) {
    o.policy = p;
    o.iterations = 10;
    EXPECT_NO_THROW(make_scheduler_config(ds, o)) << p;
  }
}

// Two processes, and one or two threads: byte-identical plans.
TEST_F(Simulator, PlansAreIdenticalAcrossProcesses) {
  std::string base = test::bin("ember-sim") + " --synthetic criteo --scale 0.01 --iterations 14 --warmup 2 --batch-per-worker 32 " +
                     "--policy vanilla,herald,het:1 --digest --json -q";
  std::string a, b;
  ASSERT_EQ(test::run_command(base + " --sched-threads 1", a), 0) << a;
  ASSERT_EQ(test::run_command(base + " --sched-threads 2", b), 0) << b;
  EXPECT_NE(a.find("\"plan_digest\""), std::string::npos) << a;
  // Everything but the timing fields must match.
  auto strip = [](std::string s) {
    std::string out;
    std::size_t pos = 0;
    while (true) {
      std::size_t d = s.find("\"plan_digest\":\"", pos);
      if (d == std::string::npos) break;
      out += s.substr(d, 32) + "|";
      pos = d + 1;
    }
    return out;
  };
  EXPECT_EQ(strip(a), strip(b));
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 3);  // Refined allocation, with the batch in two partitions allocated in parallel.
  std::string refined = test::bin("ember-sim") + " --synthetic criteo --scale 0.01 --iterations 14 --warmup 2 --batch-per-worker 32 " +
                        "--policy herald --refine-allocation --partitions 2 --digest --json -q";
  ASSERT_EQ(test::run_command(refined + " --sched-threads 1", a), 0) << a;
  ASSERT_EQ(test::run_command(refined + " --sched-threads 2", b), 0) << b;
  EXPECT_NE(a.find("\"refine_allocation\":true"), std::string::npos) << a;
  EXPECT_EQ(strip(a), strip(b));
}

// ember-sim past 64 workers, as a job of hosts runs it: 96 workers on 12 hosts, one
// scheduler per host (--scheduler-per-host, evictions exchanged) plans exactly as one scheduler of
// every worker (the same digests and counts) and holds a fraction of its state.
TEST_F(Simulator, PerHostReplayOfNinetySixWorkersPlansAsOneScheduler) {
  const std::string base = test::bin("ember-sim") + " --synthetic criteo --scale 0.01 --iterations 12 --warmup 2 --workers 96 " +
                           "--hosts 12 --batch-per-worker 8 --cache-ratio 0.02 --policy vanilla,herald --lookahead 2 --prefetch " +
                           "--eval-every 4 --digest --json -q";
  std::string whole, hosts;
  ASSERT_EQ(test::run_command(base, whole), 0) << whole;
  ASSERT_EQ(test::run_command(base + " --scheduler-per-host", hosts), 0) << hosts;
  std::istringstream a(whole), b(hosts);
  std::string la, lb;
  int lines = 0;
  while (std::getline(a, la) && std::getline(b, lb)) {
    const auto ja = nlohmann::json::parse(la), jb = nlohmann::json::parse(lb);
    ++lines;
    EXPECT_EQ(ja.at("plan_digest"), jb.at("plan_digest")) << ja.at("policy");
    for (const char* k : {"pulls", "push_grad", "push_value", "push_evict", "flush_grad", "flush_value"})
      EXPECT_EQ(ja.at(k), jb.at(k)) << k;
    EXPECT_LT(jb.at("scheduler_bytes").get<double>() * 3, ja.at("scheduler_bytes").get<double>()) << "one host's state";
  }
  EXPECT_EQ(lines, 2);
  std::string out;
  EXPECT_NE(test::run_command(test::bin("ember-sim") + " --synthetic criteo --scheduler-per-host 2>&1", out), 0);
  EXPECT_NE(out.find("--scheduler-per-host needs --hosts or --host-map"), std::string::npos) << out;
}

TEST_F(Simulator, CliErrors) {
  std::string out;
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --synthetic criteo --policy fastest", out), 2);
  EXPECT_NE(out.find("unknown policy 'fastest'"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --workers 8", out), 2);
  EXPECT_NE(out.find("--dataset"), std::string::npos) << out;
  // The names of earlier releases say what they are now called.
  EXPECT_NE(test::run_command(test::bin("ember-sim") + " --synthetic criteo --policies herald 2>&1", out), 0) << out;
  EXPECT_NE(out.find("--policies is now called --policy"), std::string::npos) << out;
  if (std::filesystem::exists(test::bin("ember-bench"))) {
    EXPECT_NE(test::run_command(test::bin("ember-bench") + " scale --refine 2>&1", out), 0) << out;
    EXPECT_NE(out.find("--refine is now called --refine-allocation"), std::string::npos) << out;
  }
  // --iterations include the --warmup ones, as a job's include every batch it trains.
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --synthetic criteo --iterations 10 --warmup 10 2>&1", out), 2) << out;
  EXPECT_NE(out.find("--warmup 10 leaves none of the --iterations 10 counted"), std::string::npos) << out;
  // ... and a run says how many it counted (an old command's --iterations took the
  // warm-up on top).
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --synthetic criteo --scale 0.001 --batch-per-worker 8 --workers 2 --iterations 6 "
                                                       "--warmup 2 --policy vanilla 2>/dev/null",
                              out),
            0)
      << out;
  EXPECT_NE(out.find("4 iterations counted after 2 warm-up (--iterations 6 counts both)"), std::string::npos) << out;
}

}  // namespace
}  // namespace ember::scheduler
