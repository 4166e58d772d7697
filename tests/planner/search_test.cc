// The planner's placement (docs/planner.md): the treatments' memory and link accounting,
// the searched plan never worse than the best greedy on the model, and the refusals.
#include "ember/planner/search.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "synthetic_dataset.h"
#include "test_util.h"

namespace ember::planner {
namespace {
namespace fs = std::filesystem;

class PlacementTest : public test::TempDirTest {
 protected:
  // Criteo-like, scale 0.01, 65 global batches of 4 x 64 samples.
  fs::path dataset() {
    data::GenOptions g;
    g.rows = 65 * 4 * 64;
    g.scale = 0.01;
    g.seed = 7;
    return test::prepare_synthetic(dir_, g);
  }
};

TEST(Placement, TreatmentsMemoryAndLinks) {
  PlacementInput in;
  in.tables = {{"big", 1000, 50.0, 300.0}, {"tiny", 10, 8.0, 10.0}};
  in.workers = 4;
  in.batch_per_worker = 64;
  in.shards = 2;
  in.row = {16, 16};  // adagrad-like: 16 state floats
  in.memory = 1000 * 128 + 64 * 128;
  int model_calls = 0;
  in.cache_model = [&](double) {
    ++model_calls;
    CostEstimate e;
    e.cache_rows = 64;
    for (const char* n : {"big", "tiny"}) {
      TableCost tc;
      tc.name = n;
      tc.pulls = 100;
      tc.push_grad = 120;
      tc.bytes = 10000;
      e.tables.push_back(tc);
    }
    return e;
  };
  Placement pl(in);
  EXPECT_DOUBLE_EQ(pl.slot_bytes(), 128);
  EXPECT_DOUBLE_EQ(pl.replicated_bytes(0), 1000 * 128);
  EXPECT_EQ(pl.min_memory(), (64 + 10) * 128u);  // b rows of big, all 10 of tiny

  // big replicated, tiny uncached: no cache, b staging slots for tiny.
  PlanCost c = pl.evaluate({Treatment::kReplicated, Treatment::kUncached});
  ASSERT_TRUE(c.feasible);
  EXPECT_EQ(model_calls, 0);  // no cached table: no cache model
  EXPECT_EQ(c.cache_rows, 0u);
  EXPECT_EQ(c.memory, 1000u * 128 + 64 * 128);
  EXPECT_DOUBLE_EQ(c.tables[0].memory, 1000 * 128);
  // Replicated: the gradients of E(n) = 300 rows (no keys: 300 x 64 = 19200 bytes), x 2 (W-1)/W = 1.5.
  EXPECT_DOUBLE_EQ(c.tables[0].worker_link, 19200 * 1.5);
  EXPECT_DOUBLE_EQ(c.tables[0].ps_link, 0);
  // Uncached: W E(b) pulls (8 + 64 bytes) and gradients (16 + 64), spread over 2 shards.
  EXPECT_DOUBLE_EQ(c.tables[1].bytes, 4 * 8.0 * (72 + 80));
  EXPECT_DOUBLE_EQ(c.tables[1].worker_link, 8.0 * (72 + 80));
  EXPECT_DOUBLE_EQ(c.tables[1].ps_link, 4 * 8.0 * (72 + 80) / 2);
  EXPECT_DOUBLE_EQ(c.worker_link, 19200 * 1.5 + 8.0 * 152);
  EXPECT_DOUBLE_EQ(c.ps_link, 4 * 8.0 * 152 / 2);
  // At 1000 Mbit/s each, the worker link is the busiest; a worker link 100x faster leaves the PS's.
  EXPECT_TRUE(c.worker_busiest());
  EXPECT_DOUBLE_EQ(c.busiest_s(), c.worker_link * 8 / 1e9);

  // Both cached: the whole budget is cache (capped at all rows), the model's bytes / W, / S.
  c = pl.evaluate({Treatment::kCache, Treatment::kCache});
  ASSERT_TRUE(c.feasible);
  EXPECT_EQ(model_calls, 1);
  EXPECT_EQ(c.cache_rows, 1010u);
  EXPECT_DOUBLE_EQ(c.worker_link, 2 * 10000.0 / 4);
  EXPECT_DOUBLE_EQ(c.ps_link, 2 * 10000.0 / 2);

  in.worker_mbit = 100000;
  const PlanCost fast = Placement(in).evaluate({Treatment::kReplicated, Treatment::kUncached});
  EXPECT_FALSE(fast.worker_busiest());
  EXPECT_DOUBLE_EQ(fast.busiest_s(), fast.ps_link * 8 / 1e9);
  in.worker_mbit = 1000;

  // Replicating tiny leaves 64 slots: big's b = 64 rows of staging still fit; one byte
  // less budget and they do not.
  in.memory = 10 * 128 + 64 * 128;
  Placement tight(in);
  EXPECT_TRUE(tight.evaluate({Treatment::kUncached, Treatment::kReplicated}).feasible);
  EXPECT_FALSE(tight.evaluate({Treatment::kReplicated, Treatment::kReplicated}).feasible);
  in.memory -= 1;
  Placement tighter(in);
  EXPECT_FALSE(tighter.evaluate({Treatment::kUncached, Treatment::kReplicated}).feasible);
  EXPECT_FALSE(tighter.evaluate({Treatment::kCache, Treatment::kCache}).feasible);
}

// Cache shares are chosen only when a split takes at least 1% off one LRU's busiest link
// (the model below: every split 0.5% cheaper, then one split 40% cheaper), and every
// candidate leaves each share and the pool a micro-batch's rows.
TEST(Placement, SharesChosenOnlyWhenTheyPay) {
  PlacementInput in;
  in.tables = {{"big", 1000, 50.0, 300.0}, {"mid", 500, 40.0, 200.0}, {"tiny", 10, 8.0, 10.0}};
  in.workers = 4;
  in.batch_per_worker = 64;
  in.row = {16, 0};
  in.memory = 1510 * 64;
  auto estimate = [](double bytes) {
    CostEstimate e;
    for (const char* n : {"big", "mid", "tiny"}) {
      TableCost tc;
      tc.name = n;
      tc.bytes = bytes;
      e.tables.push_back(tc);
    }
    return e;
  };
  in.cache_model = [&](double) { return estimate(10000); };
  Placement pl(in);
  const std::vector<Treatment> plan(3, Treatment::kCache);
  const PlanCost c = pl.evaluate(plan);
  ASSERT_TRUE(c.feasible);
  ASSERT_EQ(c.cache_rows, 1510u);
  std::vector<std::vector<std::uint32_t>> asked;
  auto check = [&](const std::vector<std::uint32_t>& shares) {
    asked.push_back(shares);
    double pool = c.cache_rows;
    for (std::size_t t = 0; t < shares.size(); ++t) {
      if (shares[t] > 0) {
        EXPECT_GE(shares[t], std::min<std::uint64_t>(64, in.tables[t].rows));
      }
      pool -= shares[t];
    }
    EXPECT_GE(pool, 1);
  };
  const ShareChoice slight = choose_shares(pl, plan, c, [&](const std::vector<std::uint32_t>& shares) {
    check(shares);
    return estimate(shares.empty() ? 10000 : 9950);
  });
  EXPECT_EQ(slight.label, "one LRU");
  EXPECT_TRUE(slight.shares.empty());
  EXPECT_GT(slight.tried.size(), 2u);
  EXPECT_TRUE(asked.front().empty()) << "one LRU first";
  const ShareChoice capped = choose_shares(pl, plan, c, [&](const std::vector<std::uint32_t>& shares) {
    check(shares);
    const bool big_capped = !shares.empty() && shares[0] > 0 && shares[2] == 0 && shares[0] <= 0.21 * 1510 && shares[0] >= 0.19 * 1510;
    return estimate(big_capped ? 6000 : 10000);
  });
  EXPECT_EQ(capped.label, "the two largest cached tables, 20% each");
  ASSERT_EQ(capped.shares.size(), 3u);
  EXPECT_EQ(capped.shares[0], 302u);
  EXPECT_EQ(capped.shares[1], 302u);
  EXPECT_DOUBLE_EQ(capped.cost.ps_link, 3 * 6000.0);
}

TEST(Placement, ParseBytes) {
  EXPECT_EQ(parse_bytes("64M"), 64u << 20);
  EXPECT_EQ(parse_bytes("512k"), 512u << 10);
  EXPECT_EQ(parse_bytes("2G"), 2ull << 30);
  EXPECT_EQ(parse_bytes("1000"), 1000u);
  EXPECT_THROW(parse_bytes("64MB"), ConfigError);
  EXPECT_THROW(parse_bytes("x"), ConfigError);
}

TEST_F(PlacementTest, SearchNoWorseThanTheBestGreedyAndThePlanFile) {
  const fs::path ds_dir = dataset();
  data::Dataset ds = data::Dataset::open(ds_dir, {false});
  const Frequencies f = load_frequencies(ds);
  Topology topo;
  topo.workers = 4;
  topo.batch_per_worker = 64;
  topo.warmup = 5;
  topo.iterations = 60;
  const scheduler::RowFormat row{16, 0};
  for (const std::uint64_t memory : {80000ull, 200000ull, 600000ull}) {
    SCOPED_TRACE(memory);
    PlacementInput in;
    in.tables = table_shapes(f, topo);
    in.workers = topo.workers;
    in.batch_per_worker = topo.batch_per_worker;
    in.row = row;
    in.memory = memory;
    in.cache_model = [&](double ratio) {
      Topology t = topo;
      t.cache_ratio = ratio;
      return vanilla_cost(f, t, row);
    };
    Placement pl(in);
    ASSERT_LE(pl.min_memory(), memory);
    const PlanCost all = pl.evaluate(std::vector<Treatment>(in.tables.size(), Treatment::kCache));
    std::vector<Treatment> best;
    PlanCost best_cost;
    for (const char* key : {"size", "lookups", "size_x_lookups"}) {
      auto g = pl.greedy(pl.order_by(key));
      PlanCost c = pl.evaluate(g);
      ASSERT_TRUE(c.feasible);
      EXPECT_LE(c.busiest(), all.busiest() * (1 + 1e-12)) << key;
      if (best.empty() || better(c, best_cost)) best = g, best_cost = c;
    }
    const PlanCost searched = pl.evaluate(pl.search(best));
    ASSERT_TRUE(searched.feasible);
    EXPECT_LE(searched.busiest(), best_cost.busiest() * (1 + 1e-12));
    EXPECT_LE(searched.memory, memory);
  }

  // ember-plan writes the searched plan; read_plan takes it back against the dataset.
  const std::string plan = (dir_ / "plan.json").string();
  std::string out;
  ASSERT_EQ(test::run_command(test::bin("ember-plan") +
                                  fmt::format(" --dataset {} --workers 4 --batch-per-worker 64 --warmup 5 --iterations 65 --memory 120K "
                                              "--link-mbit 100 --plan-out {}",
                                              ds_dir.string(), plan),
                              out),
            0)
      << out;
  EXPECT_NE(out.find("searched:"), std::string::npos) << out;
  const PlanFile pf = read_plan(plan, ds);
  ASSERT_EQ(pf.names.size(), static_cast<std::size_t>(ds.num_tables()));
  EXPECT_GT(pf.cache_rows, 0u);

  // A plan whose third table is renamed: refused naming it, in one line.
  nlohmann::json j;
  std::ifstream(plan) >> j;
  j["tables"][2]["name"] = "C99";
  std::ofstream(dir_ / "bad.json") << j.dump();
  try {
    read_plan(dir_ / "bad.json", ds);
    FAIL() << "accepted a plan with a renamed table";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("C99"), std::string::npos) << m;
    EXPECT_NE(m.find("C3"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  j["tables"][2]["name"] = "C3";
  j["tables"][2]["rows"] = 1;
  std::ofstream(dir_ / "bad.json") << j.dump();
  EXPECT_THROW(read_plan(dir_ / "bad.json", ds), ConfigError);
  j["tables"].erase(25);
  std::ofstream(dir_ / "bad.json") << j.dump();
  EXPECT_THROW(read_plan(dir_ / "bad.json", ds), ConfigError);

  // Executed: ember-sim --placement counts the plan's replicated rows, and refuses a plan
  // of another dataset in one line, naming the table.
  ASSERT_EQ(
      test::run_command(test::bin("ember-sim") + fmt::format(" --dataset {} --workers 4 --batch-per-worker 64 --warmup 5 --iterations "
                                                             "25 --policy herald --placement {} --json -q",
                                                             ds_dir.string(), plan),
                        out),
      0)
      << out;
  const auto sim = nlohmann::json::parse(out.substr(0, out.find('\n')));
  const bool replicates = std::find(pf.treatments.begin(), pf.treatments.end(), Treatment::kReplicated) != pf.treatments.end();
  EXPECT_EQ(sim.at("hot_sync").get<std::uint64_t>() > 0, replicates) << out;
  EXPECT_EQ(sim.at("cache_rows").get<std::uint32_t>(), pf.cache_rows);
  EXPECT_EQ(pf.batch_per_worker, 64u);
  // Cache shares round-trip through the plan file; one on a replicated table is refused.
  PlanFile shared = pf;
  shared.cache_shares.assign(shared.names.size(), 0);
  const auto cached_table = static_cast<std::size_t>(std::find(shared.treatments.begin(), shared.treatments.end(), Treatment::kCache) -
                                                     shared.treatments.begin());
  ASSERT_LT(cached_table, shared.names.size());
  shared.cache_shares[cached_table] = 64;
  write_plan(dir_ / "shared.json", shared);
  EXPECT_EQ(read_plan(dir_ / "shared.json", ds).cache_shares, shared.cache_shares);
  if (replicates) {
    const auto rep = static_cast<std::size_t>(std::find(shared.treatments.begin(), shared.treatments.end(), Treatment::kReplicated) -
                                              shared.treatments.begin());
    shared.cache_shares[rep] = 64;
    write_plan(dir_ / "shared.json", shared);
    EXPECT_THROW(read_plan(dir_ / "shared.json", ds), ConfigError);
  }
  // A plan is made for a batch size: another job's is refused, naming both.
  EXPECT_NE(
      test::run_command(test::bin("ember-sim") + fmt::format(" --dataset {} --workers 4 --batch-per-worker 32 --warmup 5 --iterations "
                                                             "25 --policy herald --placement {} -q",
                                                             ds_dir.string(), plan),
                        out),
      0);
  EXPECT_NE(out.find("made for --batch-per-worker 64; the job runs 32"), std::string::npos) << out;
  EXPECT_NE(
      test::run_command(test::bin("ember-sim") + fmt::format(" --dataset {} --workers 4 --batch-per-worker 64 --warmup 5 --iterations "
                                                             "25 --policy herald --placement {} -q",
                                                             ds_dir.string(), (dir_ / "bad.json").string()),
                        out),
      0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("table C3 has 1 rows"), std::string::npos) << out;  // the first mismatch

  // The batch size against the cache: each choice planned, the cheapest per sample written.
  ASSERT_EQ(test::run_command(
                test::bin("ember-plan") + fmt::format(" --dataset {} --workers 4 --warmup 5 --iterations 35 --memory 120K --link-mbit 100 "
                                                      "--batch-choices 16,32,64 --plan-out {} --json",
                                                      ds_dir.string(), plan),
                out),
            0)
      << out;
  const auto trade = nlohmann::json::parse(out.substr(0, out.find('\n')));
  ASSERT_EQ(trade.at("batch_choices").size(), 3u) << out;
  double best = 1e300;
  std::uint32_t best_b = 0;
  for (const auto& c : trade.at("batch_choices")) {
    if (c.contains("per_sample_s") && c.at("per_sample_s").get<double>() < best) {
      best = c.at("per_sample_s").get<double>();
      best_b = c.at("batch_per_worker").get<std::uint32_t>();
    }
  }
  EXPECT_EQ(trade.at("batch_per_worker").get<std::uint32_t>(), best_b) << out;
  EXPECT_EQ(read_plan(plan, ds).batch_per_worker, best_b);

  // A budget below the smallest feasible plan: refused in one line, naming by how much.
  EXPECT_NE(test::run_command(test::bin("ember-plan") + fmt::format(" --dataset {} --memory 1K", ds_dir.string()), out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("below the smallest feasible plan"), std::string::npos) << out;
  EXPECT_NE(out.find(" by "), std::string::npos) << out;
}

}  // namespace
}  // namespace ember::planner
