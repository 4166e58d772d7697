#include "ember/scheduler/simulator.h"

#include <gtest/gtest.h>

#include "ember/common/error.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"
#include "test_util.h"

namespace ember::scheduler {
namespace {
namespace fs = std::filesystem;

class Simulator : public test::TempDirTest {
 protected:
  fs::path dataset(std::uint64_t rows, double scale) {
    data::GenOptions g;
    g.rows = rows;
    g.scale = scale;
    g.output = dir_ / "g.tsv";
    data::generate(g);
    data::PrepOptions p;
    p.inputs = {g.output};
    p.output = dir_ / "ds";
    data::prepare_dataset(p);
    return p.output;
  }
};

TEST_F(Simulator, HeraldMovesFewerRowsThanVanillaAndPartsAddUp) {
  data::Dataset ds = data::Dataset::open(dataset(40 * 8 * 64, 0.01));
  SimOptions o;
  o.workers = 8;
  o.batch_per_worker = 64;
  o.iterations = 30;
  o.warmup = 10;
  SimResult v = simulate(ds, parse_policy("vanilla"), o);
  SimResult l = simulate(ds, parse_policy("laia"), o);
  SimResult p = simulate(ds, parse_policy("plan"), o);
  SimResult h = simulate(ds, parse_policy("herald"), o);
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
  EXPECT_EQ(v.traffic.hits + v.traffic.pulls, l.traffic.hits + l.traffic.pulls + (v.traffic.hits + v.traffic.pulls - l.traffic.hits - l.traffic.pulls));
  SimResult f = simulate(ds, parse_policy("fae:0.01"), o);
  EXPECT_GT(f.traffic.hot_sync, 0u);
  EXPECT_LT(f.traffic.transmissions(), v.traffic.transmissions());
  SimResult het = simulate(ds, parse_policy("het:4"), o);
  EXPECT_LT(het.traffic.pulls, v.traffic.pulls);
}

TEST_F(Simulator, ImpossibleConfigurations) {
  data::Dataset ds = data::Dataset::open(dataset(2000, 0.01));
  SimOptions o;
  o.workers = 8;
  o.batch_per_worker = 512;  // 4096 > 2000 rows
  EXPECT_THROW(simulate(ds, parse_policy("herald"), o), ConfigError);
  o.batch_per_worker = 16;
  o.iterations = 100;  // 110 batches of 128 > 2000 rows
  EXPECT_THROW(simulate(ds, parse_policy("herald"), o), ConfigError);
  o.iterations = 5;
  o.cache_ratio = 0.0001;  // a few rows
  EXPECT_THROW(simulate(ds, parse_policy("herald"), o), ConfigError);
}

// Two processes, and one or two threads: byte-identical plans.
TEST_F(Simulator, PlansAreIdenticalAcrossProcesses) {
  std::string base = test::bin("ember-sim") + " --synthetic criteo --scale 0.01 --iterations 12 --warmup 2 --batch-per-worker 32 " +
                     "--policies vanilla,herald,het:1 --digest --json -q";
  std::string a, b;
  ASSERT_EQ(test::run_command(base + " --threads 1", a), 0) << a;
  ASSERT_EQ(test::run_command(base + " --threads 2", b), 0) << b;
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
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 3);
}

TEST_F(Simulator, CliErrors) {
  std::string out;
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --synthetic criteo --policies fastest", out), 2);
  EXPECT_NE(out.find("unknown policy 'fastest'"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(test::bin("ember-sim") + " --workers 8", out), 2);
  EXPECT_NE(out.find("--data"), std::string::npos) << out;
}

}  // namespace
}  // namespace ember::scheduler
