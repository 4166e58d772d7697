// Flushes (the write-back before a checkpoint, an evaluation or the end) change nothing:
// a job trains the same model, bit for bit, whatever its --checkpoint-every and
// --eval-every, under every mechanism and optimizer. Restarts make every job checkpoint,
// so a flush that moved one rounding would make a restarted job's model depend on when
// it checkpointed.
//
// Under per-host aggregation it did: a flush pushed a row's partial gradients of one
// host summed there, where without the flush they left one by one (evicted at different
// iterations), and a sum of three grouped as (a + b) + c rounds unlike the shard's sum of
// a, b and c. The shards now sum each host's gradients first (ShardStore::push_grad), in
// the order of their bytes, and a host sums its gradients of a row only when a phase
// holds all of them, in that order (scheduler/host_parts.h): hosts of three workers
// are the cases where the second rule matters.
#include "job_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

class Flushes : public JobTest {};

struct Case {
  const char* name;
  const char* policy;
  const char* optimizer;
  int mechanisms;  // 1: lookahead 3, 2: prefetch, 4: overlapped all-reduce
  bool hosts = false, aggregate = false, allocate = false, peer = false, per_host = false;
  const char* model = "dlrm";
  std::uint32_t workers_per_host = 2;  // hosts: 6 workers, in 3 hosts of 2 or 2 of 3
};

JobOptions job_of(const Case& c) {
  JobOptions o;
  o.policy = c.policy;
  o.optimizer = c.optimizer;
  o.dense_optimizer = std::string(c.optimizer) == "sgd" ? "sgd" : "adagrad";
  o.model = c.model;
  o.iterations = 80;
  o.cache_ratio = "0.05";  // evictions of partial gradients, between flushes
  if (c.mechanisms & 1) o.lookahead = 3;
  o.prefetch = c.mechanisms & 2;
  o.overlap_allreduce = c.mechanisms & 4;
  if (c.hosts) {
    o.workers = 6;
    o.workers_per_host = c.workers_per_host;
    o.allreduce = "hierarchical";
    o.peer_sync = c.peer;
    o.host_aggregation = c.aggregate;
    o.host_allocation = c.allocate;
    if (c.per_host) o.worker_args = {"--scheduler-per-host"};
  }
  return o;
}

// The default run takes the cases that differed before (the host hierarchy) and one
// flat case; flush_matrix_test (ctest label `long`) takes every case.
TEST_F(Flushes, ChangeNoRowAndNoWeightUnderEveryMechanism) {
  const fs::path data = dataset(20000);
  std::vector<Case> cases = {Case{"flat-adagrad", "herald", "adagrad", 7},
                             Case{"hosts-issue", "herald", "rowwise-adagrad", 7, true, true, true, true, false, "deepfm"},
                             Case{"hosts-lookahead-adagrad", "herald", "adagrad", 1, true, true, true, true},
                             Case{"hosts-aggregation-adam", "herald", "adam", 7, true, true},
                             Case{"hosts-of-3-aggregation-adagrad", "herald", "adagrad", 7, true, true, false, false, false, "dlrm", 3}};
#ifdef EMBER_FLUSH_MATRIX
  cases.insert(cases.end(), {Case{"flat-sgd", "herald", "sgd", 7},
                             Case{"flat-rowwise-deepfm", "herald", "rowwise-adagrad", 7, false, false, false, false, false, "deepfm"},
                             Case{"flat-adam", "herald", "adam", 7}, Case{"plan-adagrad", "plan", "adagrad", 7},
                             Case{"hosts-per-host-adagrad", "herald", "adagrad", 7, true, true, false, true, true},
                             Case{"hosts-of-3-issue", "herald", "rowwise-adagrad", 7, true, true, true, true, false, "deepfm", 3},
                             Case{"hosts-of-3-lookahead-adagrad", "herald", "adagrad", 1, true, true, false, false, false, "dlrm", 3},
                             Case{"hosts-of-3-aggregation-adam", "herald", "adam", 7, true, true, false, false, false, "dlrm", 3}});
#endif
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const JobOptions plain = job_of(c);
    JobOptions flushed = plain;
    flushed.eval_every = 7;
    flushed.ps_args = {"--checkpoint-dir", (dir_ / (std::string(c.name) + "-ckpt")).string(), "--checkpoint-every", "5"};
    const JobResult a = run_job(data, plain, std::string(c.name) + "-plain");
    const JobResult b = run_job(data, flushed, std::string(c.name) + "-flushed");
    ASSERT_FALSE(a.dump.rows.empty());
    ASSERT_EQ(a.dump.rows.size(), b.dump.rows.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.dump.rows.size(); ++i) differ += a.dump.rows[i] != b.dump.rows[i];
    EXPECT_EQ(differ, 0u) << "embedding values differ, by up to " << max_abs_diff(a.dump.rows, b.dump.rows);
    EXPECT_EQ(max_abs_diff(a.dump.dense, b.dump.dense), 0.0) << "dense weights";
    EXPECT_GT(b.reported.at("flush_grad"), a.reported.at("flush_grad"))
        << "the flushes pushed no more partial gradients: the test proves less";
  }
}

}  // namespace
}  // namespace ember::worker
