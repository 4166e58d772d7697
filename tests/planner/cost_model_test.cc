// The planner's cost model against the simulator: per table and per PS shard, vanilla's
// predicted rows per iteration within 10% of ember-sim's counts; other policies sampled
// from the simulator itself (docs/planner.md).
#include "ember/planner/cost_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/common/error.h"
#include "synthetic_dataset.h"
#include "test_util.h"

namespace ember::planner {
namespace {
namespace fs = std::filesystem;

// The last line of a command's output that parses as a JSON object.
nlohmann::json last_json(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  nlohmann::json j;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '{') j = nlohmann::json::parse(line);
  }
  return j;
}

class CostModel : public test::TempDirTest {
 protected:
  // A Criteo-like file of exactly `batches` global batches of 4 x 64 samples, all train.
  fs::path dataset(std::uint64_t rows) {
    data::GenOptions g;
    g.rows = rows;
    g.scale = 0.01;
    g.seed = 7;
    return test::prepare_synthetic(dir_, g);
  }
};

TEST_F(CostModel, VanillaRowsPerTableWithinTenPercentOfTheSimulator) {
  constexpr int kWorkers = 4, kBatch = 64, kWarmup = 5, kIterations = 60, kShards = 3;
  const fs::path ds = dataset(static_cast<std::uint64_t>(kWarmup + kIterations) * kWorkers * kBatch);
  const std::string common = fmt::format(" --dataset {} --workers {} --batch-per-worker {} --warmup {} --iterations {} --ps {}",
                                         ds.string(), kWorkers, kBatch, kWarmup, kWarmup + kIterations, kShards);
  // File order (both tools' default), and shuffled (ember-sim --shuffle: the split's
  // frequencies).
  for (const bool shuffled : {false, true}) {
    SCOPED_TRACE(shuffled ? "shuffled" : "file order");
    std::string sim_out, plan_out;
    ASSERT_EQ(
        test::run_command(test::bin("ember-sim") + common + " --policy vanilla --json --quiet" + (shuffled ? " --shuffle" : ""), sim_out),
        0)
        << sim_out;
    ASSERT_EQ(test::run_command(test::bin("ember-plan") + common + " --json --order " + (shuffled ? "shuffled" : "file"), plan_out), 0)
        << plan_out;
    const nlohmann::json sim = last_json(sim_out), plan = last_json(plan_out);
    ASSERT_TRUE(sim.contains("tables")) << sim_out;
    ASSERT_TRUE(plan.contains("tables")) << plan_out;
    ASSERT_EQ(sim["tables"].size(), plan["tables"].size());

    // The simulator's per-table counts add up to its totals, kind by kind.
    for (const char* kind : {"pulls", "push_grad", "push_value", "push_evict", "pushes", "transmissions", "pull_state"}) {
      std::uint64_t sum = 0;
      for (const auto& t : sim["tables"]) sum += t[kind].get<std::uint64_t>();
      EXPECT_EQ(sum, sim[kind].get<std::uint64_t>()) << kind;
    }

    // Per table, per iteration: the prediction within 10% where the simulator counted
    // enough rows over the run for its own count to be steady (>= 1000: the draw's noise,
    // about 1/sqrt(count), stays near 3%); smaller tables are reported, not judged.
    int judged = 0;
    for (std::size_t i = 0; i < sim["tables"].size(); ++i) {
      const auto& s = sim["tables"][i];
      const auto& p = plan["tables"][i];
      ASSERT_EQ(s["name"], p["name"]);
      for (const char* kind : {"pulls", "push_grad"}) {
        const double counted = s[kind].get<double>();
        const double sim_per_it = counted / kIterations;
        const double predicted = p[kind].get<double>();
        if (counted < 1000) continue;
        ++judged;
        EXPECT_NEAR(predicted / sim_per_it, 1.0, 0.10)
            << s["name"] << " " << kind << ": ember-sim " << sim_per_it << " per iteration, ember-plan " << predicted;
      }
    }
    EXPECT_GE(judged, 20);

    // Per PS shard: the simulator's counts add up to its totals (the end-of-run flush
    // included), the model's to its tables', and the model is within 10% per shard.
    ASSERT_EQ(sim["shards"].size(), static_cast<std::size_t>(kShards)) << sim_out;
    ASSERT_EQ(plan["shards"].size(), static_cast<std::size_t>(kShards)) << plan_out;
    for (const char* kind :
         {"pulls", "push_grad", "push_value", "push_evict", "pushes", "transmissions", "pull_state", "flush_grad", "flush_value"}) {
      std::uint64_t sum = 0;
      for (const auto& sh : sim["shards"]) sum += sh[kind].get<std::uint64_t>();
      EXPECT_EQ(sum, sim[kind].get<std::uint64_t>()) << kind;
    }
    std::uint64_t sim_bytes = 0;
    for (const auto& sh : sim["shards"]) sim_bytes += sh["bytes"].get<std::uint64_t>();
    EXPECT_EQ(sim_bytes, sim["bytes"]["total"].get<std::uint64_t>());
    for (const char* kind : {"pulls", "pushes", "bytes"}) {
      double by_shard = 0;
      for (const auto& sh : plan["shards"]) by_shard += sh[kind].get<double>();
      EXPECT_NEAR(by_shard, plan[kind].get<double>(), 1e-6 * plan[kind].get<double>()) << kind;
    }
    int judged_shards = 0;
    for (int s = 0; s < kShards; ++s) {
      for (const char* kind : {"pulls", "pushes"}) {
        const double counted = sim["shards"][s][kind].get<double>();
        if (counted < 1000) continue;
        ++judged_shards;
        EXPECT_NEAR(plan["shards"][s][kind].get<double>() / (counted / kIterations), 1.0, 0.10) << "shard " << s << " " << kind;
      }
    }
    EXPECT_EQ(judged_shards, 2 * kShards);
  }
}

TEST_F(CostModel, SampledHeraldIsTheSimulatorsCount) {
  // ember-plan --policy herald runs the simulator in process over the sample: its rows
  // per table and per shard are ember-sim's counts over the same iterations, exactly.
  constexpr int kWorkers = 4, kBatch = 64, kWarmup = 3, kSample = 8;
  const fs::path ds = dataset(static_cast<std::uint64_t>(kWarmup + kSample) * kWorkers * kBatch);
  const std::string common =
      fmt::format(" --dataset {} --workers {} --batch-per-worker {} --warmup {} --ps 2", ds.string(), kWorkers, kBatch, kWarmup);
  std::string sim_out, plan_out;
  ASSERT_EQ(
      test::run_command(test::bin("ember-sim") + common + fmt::format(" --iterations {} --policy herald --json --quiet", kWarmup + kSample),
                        sim_out),
      0)
      << sim_out;
  ASSERT_EQ(test::run_command(test::bin("ember-plan") + common + fmt::format(" --policy herald --sample {} --json", kSample), plan_out), 0)
      << plan_out;
  const nlohmann::json sim = last_json(sim_out), plan = last_json(plan_out);
  ASSERT_TRUE(plan["sampled"].get<bool>());
  EXPECT_EQ(plan["sample_iterations"].get<int>(), kSample);
  EXPECT_GE(plan["sample_seconds"].get<double>(), 0.0);
  ASSERT_EQ(sim["tables"].size(), plan["tables"].size());
  for (std::size_t i = 0; i < sim["tables"].size(); ++i) {
    for (const char* kind : {"pulls", "push_grad", "push_value", "push_evict", "pushes", "pull_state", "hits"}) {
      EXPECT_DOUBLE_EQ(plan["tables"][i][kind].get<double>() * kSample, sim["tables"][i][kind].get<double>())
          << sim["tables"][i]["name"] << " " << kind;
    }
  }
  ASSERT_EQ(plan["shards"].size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    for (const char* kind : {"pulls", "pushes", "pull_state"}) {
      EXPECT_DOUBLE_EQ(plan["shards"][s][kind].get<double>() * kSample, sim["shards"][s][kind].get<double>()) << s << " " << kind;
    }
  }
}

TEST_F(CostModel, TheTiersReadsAreTheSimulatorsPrediction) {
  // ember-plan --ram-budget-mb samples the simulator with the tier modelled: per shard,
  // the pages it predicts read with and without hints are ember-sim's over the same
  // iterations, for a sampled policy and for vanilla (sampled when a tier is asked for).
  constexpr int kWorkers = 2, kBatch = 128, kWarmup = 2, kSample = 6;
  const fs::path ds = dataset(static_cast<std::uint64_t>(kWarmup + kSample + 2) * kWorkers * kBatch);
  for (const char* policy : {"herald", "vanilla"}) {
    const std::string common = fmt::format(
        " --dataset {} --workers {} --batch-per-worker {} --warmup {} --ps 2 --dim 16 --optimizer adagrad --ram-budget-mb 0.25 "
        "--cache-ratio 0.5 "
        "--lookahead 2 --policy {}",
        ds.string(), kWorkers, kBatch, kWarmup, policy);
    std::string sim_out, plan_out;
    ASSERT_EQ(
        test::run_command(test::bin("ember-sim") + common + fmt::format(" --iterations {} --json --quiet", kWarmup + kSample), sim_out), 0)
        << sim_out;
    ASSERT_EQ(test::run_command(test::bin("ember-plan") + common + fmt::format(" --sample {} --json", kSample), plan_out), 0) << plan_out;
    const nlohmann::json sim = last_json(sim_out)["tier"], plan = last_json(plan_out)["tier"];
    EXPECT_EQ(plan["row_bytes"], sim["row_bytes"]) << policy;
    EXPECT_EQ(plan["ram_budget_bytes"], sim["ram_budget_bytes"]) << policy;
    ASSERT_EQ(plan["shards"].size(), 2u) << plan_out;
    ASSERT_EQ(sim["shards"].size(), 2u) << sim_out;
    double waited = 0, waited_hinted = 0;
    for (std::size_t s = 0; s < 2; ++s) {
      for (const char* side : {"no_hints", "hints"}) {
        for (const char* k : {"rows_touched_per_iteration", "reads_per_iteration", "critical_reads_per_iteration"}) {
          EXPECT_DOUBLE_EQ(plan["shards"][s][side][k].get<double>(), sim["shards"][s][side][k].get<double>())
              << policy << " shard " << s << " " << side << " " << k;
        }
      }
      waited += plan["shards"][s]["no_hints"]["critical_reads_per_iteration"].get<double>();
      waited_hinted += plan["shards"][s]["hints"]["critical_reads_per_iteration"].get<double>();
    }
    // A quarter of a MB holds 2,048 rows: the tier reads, and the hints take some of the
    // reads off the critical path.
    EXPECT_GT(waited, 0.0) << policy;
    EXPECT_LT(waited_hinted, waited) << policy;
  }
  std::string out;
  EXPECT_NE(test::run_command(test::bin("ember-plan") + " --dataset " + ds.string() + " --ram-budget-mb 1 --memory 1G 2>&1", out), 0);
  EXPECT_NE(out.find("--ram-budget-mb does not combine with --memory"), std::string::npos) << out;
}

TEST_F(CostModel, MeansAndCacheLimitsAreConsistent) {
  // Two tables: one value (every worker trains it every iteration: never alone), and
  // 1000 values drawn uniformly.
  Frequencies f;
  f.samples = 100000;
  f.tables.push_back({"one", 1, {100000}});
  f.tables.push_back({"uni", 1000, std::vector<std::uint32_t>(1000, 100)});
  Topology topo;
  topo.workers = 4;
  topo.batch_per_worker = 10;
  topo.cache_ratio = 1.0;
  CostEstimate e = vanilla_cost(f, topo, {16, 0});
  ASSERT_EQ(e.tables.size(), 2u);
  EXPECT_DOUBLE_EQ(e.tables[0].distinct_per_worker, 1.0);
  EXPECT_DOUBLE_EQ(e.tables[0].pulls, 4.0);  // shared every iteration: always dropped
  EXPECT_DOUBLE_EQ(e.tables[0].pull_state, 0.0);
  EXPECT_DOUBLE_EQ(e.tables[0].push_grad, 4.0);
  // E(b) = 1000 (1 - (1 - 1/1000)^10).
  EXPECT_NEAR(e.tables[1].distinct_per_worker, 1000 * (1 - std::pow(0.999, 10)), 1e-9);
  EXPECT_NEAR(e.tables[1].pulls + e.tables[1].hits, e.tables[1].push_grad, 1e-9);
  EXPECT_GT(e.tables[1].hits, 0.0);
  EXPECT_TRUE(std::isinf(e.lifetime));
  // A cache of 11 rows (the ratio of 1001 rows): copies no longer live forever, fewer hits.
  topo.cache_ratio = 0.011;
  CostEstimate small = vanilla_cost(f, topo, {16, 0});
  EXPECT_GT(small.cache_demand, 1.0);
  EXPECT_FALSE(std::isinf(small.lifetime));
  EXPECT_LT(small.tables[1].hits, e.tables[1].hits);
  EXPECT_THROW(vanilla_cost(f, Topology{0}, {16, 0}), ConfigError);
}

TEST(EmberPlan, BadFlagsFailInOneLine) {
  std::string out;
  EXPECT_NE(test::run_command(test::bin("ember-plan") + " --dataset /nonexistent", out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(test::run_command(test::bin("ember-plan") + " --dataset /tmp --workers 0", out), 0);
  EXPECT_NE(test::run_command(test::bin("ember-plan") + " --workers 8", out), 0);  // no --dataset
  EXPECT_NE(test::run_command(test::bin("ember-plan") + " --dataset /nonexistent --ps 0", out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(test::run_command(test::bin("ember-sim") + " --synthetic criteo --ps 0 --quiet", out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace ember::planner
