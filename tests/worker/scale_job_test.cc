// A job past 64 workers, end to end (ctest runs it alone: its 72 processes take both
// cores of a small host).
#include <gtest/gtest.h>

#include "job_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

class ScaleJob : public JobTest {};

// Past 64 workers, end to end: 72 workers on 9 hosts of 8 (processes sharing this
// machine's cores), herald with a scheduler per host, a few iterations of a small model.
// The join, the all-reduce, every shard's connections, the eviction exchange and the
// metrics take it, and it trains the one-process model.
TEST_F(ScaleJob, SeventyTwoWorkersTrainTheOneProcessModel) {
  const fs::path data = dataset(4000);
  JobOptions o;
  o.workers = 72;
  o.batch = 4;
  o.iterations = 4;
  o.workers_per_host = 8;
  o.cache_ratio = "0.05";
  o.worker_args = {"--scheduler-per-host", "--torch-threads", "1"};
  const JobResult job = run_job_like_one_process(data, o, "seventy-two", "72 workers on 9 hosts");
  auto sim = simulate(data, o);
  expect_served_as_simulated(job, sim, o, "72 workers");
  expect_plans_as_simulated(job, sim, "72 workers");
}

}  // namespace
}  // namespace ember::worker
