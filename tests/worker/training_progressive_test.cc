// Progressive validation (--progressive-window): each global batch scored by the model
// before it trains on it, gathered over the workers by the dense all-reduce, and reported
// by worker 0 over a window of iterations.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "job_fixture.h"
#include "training_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

class Progressive : public Training {
 protected:
  // Worker 0's JSON lines of a job: each iteration's loss, and the progressive lines by
  // the iteration they end at (counted from 1).
  struct Lines {
    std::map<std::uint64_t, double> loss;
    std::map<std::uint64_t, json> progressive;
    json summary;
  };
  Lines lines(const std::string& name) const {
    Lines r;
    std::ifstream in(dir_ / (name + "-w0.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.value("summary", false)) {
        r.summary = j;  // its "progressive" is the last window's scores
      } else if (j.contains("progressive")) {
        r.progressive[j.at("iteration").get<std::uint64_t>()] = j;
      } else if (j.contains("loss") && !j.at("loss").is_null() && !j.contains("eval")) {
        r.loss[j.at("iteration").get<std::uint64_t>()] = j.at("loss").get<double>();
      }
    }
    return r;
  }
  static JobOptions job(const std::string& policy, std::uint64_t window) {
    JobOptions o;
    o.policy = policy;
    o.iterations = 12;
    o.worker_args = {"--progressive-window", std::to_string(window), "--progress-every", "1"};
    return o;
  }
};

// A window of one iteration is that iteration's global batch: its log loss is the
// training loss of the iteration (the same forward pass, summed over the workers), which
// a sample gathered into the wrong place or with the wrong label would change.
TEST_F(Progressive, AWindowOfOneIterationHasTheIterationsTrainingLoss) {
  const fs::path data = dataset();
  run_job(data, job("vanilla", 1), "one");
  const Lines l = lines("one");
  ASSERT_EQ(l.progressive.size(), 12u);
  for (const auto& [it, p] : l.progressive) {
    SCOPED_TRACE(it);
    ASSERT_TRUE(l.loss.contains(it - 1));
    EXPECT_EQ(p.at("samples").get<std::uint64_t>(), kWorkers * kBatch);
    EXPECT_NEAR(p.at("logloss").get<double>(), l.loss.at(it - 1), 1e-5);
    EXPECT_GT(p.at("auc").get<double>(), 0.0);
  }
}

// Over a window of 5 iterations, herald scores every sample as vanilla does (the same
// BSP model before each batch), and the summary holds the last window.
TEST_F(Progressive, HeraldScoresEachBatchAsVanillaDoes) {
  const fs::path data = dataset();
  run_job(data, job("vanilla", 5), "vanilla");
  run_job(data, job("herald", 5), "herald");
  const Lines v = lines("vanilla"), h = lines("herald");
  ASSERT_EQ(v.progressive.size(), 12u);
  ASSERT_EQ(h.progressive.size(), 12u);
  for (const auto& [it, p] : v.progressive) {
    SCOPED_TRACE(it);
    const json& q = h.progressive.at(it);
    EXPECT_EQ(p.at("samples").get<std::uint64_t>(), std::min<std::uint64_t>(it, 5) * kWorkers * kBatch);
    EXPECT_EQ(p.at("first_iteration").get<std::uint64_t>(), it > 5 ? it - 4 : 1);
    EXPECT_NEAR(p.at("auc").get<double>(), q.at("auc").get<double>(), 1e-6);
    EXPECT_NEAR(p.at("logloss").get<double>(), q.at("logloss").get<double>(), 1e-6);
  }
  ASSERT_TRUE(v.summary.contains("progressive"));
  EXPECT_EQ(v.summary.at("progressive").at("auc"), v.progressive.at(12).at("auc"));
  EXPECT_EQ(v.summary.at("progressive").at("window_iterations").get<std::uint64_t>(), 5u);
}

}  // namespace
}  // namespace ember::worker
