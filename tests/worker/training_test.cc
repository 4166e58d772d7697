// End-to-end training with real processes on loopback: ember-ps shards + 4 ember-worker
// processes (ZeroMQ control plane, TCP rows, Gloo all-reduce, LibTorch).
//
// The central test: on the same data and seed, K iterations of (a) one process training
// the whole global batch, (b) 4 workers with vanilla, (c) 4 workers with herald give the
// same embedding rows and dense weights (up to float summation order), (c) moves fewer
// rows than (b), and the rows counted on the wire equal ember-sim's prediction.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/fs.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/ps_service.h"
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/plan_file.h"
#include "ember/worker/trainer.h"
#include "job_fixture.h"
#include "training_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

TEST_F(Training, SchedulerTrainsTheBspModelWithFewerRowsAndTheSimulatorsCounts) {
  const fs::path data = dataset();
  JobOptions vanilla;
  vanilla.policy = "vanilla";
  JobOptions herald;
  herald.policy = "herald";
  ps::OptimizerConfig sparse;
  sparse.kind = ps::OptimizerKind::kSgd;
  sparse.lr = 0.05f;
  const ReferenceResult ref = train_reference(reference_config(data, herald), sparse, kDim);
  ASSERT_EQ(ref.losses.size(), kIterations);

  JobResult v = run_job(data, vanilla, "vanilla");
  JobResult h = run_job(data, herald, "herald");
  expect_same_model(ref, v, "vanilla");
  expect_same_model(ref, h, "herald");
  // Training moved the model away from its initialization (the comparison is not trivial).
  std::vector<float> init(ref.rows.size());
  for (Key k = 0; k < init.size() / kDim; ++k) ps::initial_row(kSeed, k, kDim, &init[k * kDim]);
  EXPECT_GT(max_abs_diff(init, h.dump.rows), 1e-3);

  ASSERT_FALSE(v.reported.empty());
  ASSERT_FALSE(h.reported.empty());
  EXPECT_LT(transmissions(h.reported), transmissions(v.reported)) << "herald should move fewer rows than vanilla";
  for (auto [opts, job] : {std::pair{vanilla, &v}, std::pair{herald, &h}}) {
    auto sim = simulate(data, opts);
    expect_served_as_simulated(*job, sim, opts, opts.policy);
    expect_plans_as_simulated(*job, sim, opts.policy);
  }
  EXPECT_LT(served_pulls(h), served_pulls(v)) << "the shards served herald fewer rows than vanilla";
  EXPECT_GE(h.auc, 0.0);
  EXPECT_LE(h.auc, 1.0);
}

// Every lookahead mechanism at once: eviction by next use (a cache small enough to evict),
// prefetched pulls, the all-reduce overlapped with the PS exchange, and the refined
// allocation. The same model as
// one process with SGD and Adagrad over 2 shards (whose stores refuse any pull of a row
// an uncommitted update will change), and rows, pulls with state, prefetches, flushes
// and payload bytes on the wire as ember-sim predicts, kind by kind.
TEST_F(Training, LookaheadTrainsTheBspModelWithTheSimulatorsCounts) {
  const fs::path data = dataset();
  for (const char* optimizer : {"sgd", "adagrad"}) {
    JobOptions o;
    o.policy = "herald";
    o.optimizer = optimizer;
    o.model = "wide-deep";
    o.cache_ratio = "0.06";
    o.lookahead = 2;
    o.eviction = "lookahead";
    o.prefetch = true;
    o.overlap_allreduce = true;
    o.refine_allocation = true;
    o.eval_every = 7;  // flushes between prefetches
    const std::string what = std::string("herald + lookahead 2 + prefetch + overlap + refined allocation, ") + optimizer;
    JobResult job = run_job_like_one_process(data, o, std::string("lookahead-") + optimizer, what);
    auto sim = simulate(data, o);
    EXPECT_GT(sim["push_evict"], 0u) << "the cache must be small enough to evict";
    EXPECT_GT(sim["prefetched"], sim["pulls"] / 4) << "most pulls of rows nobody just trained are prefetched";
    EXPECT_LT(sim["prefetched"], sim["pulls"]) << "rows pushed since the last pulls are not";
    expect_served_as_simulated(job, sim, o, what);
    expect_plans_as_simulated(job, sim, what);
    if (o.optimizer == "adagrad") {
      EXPECT_LT(sim["pull_state"], sim["pulls"]) << "shared rows are pulled without their state";
    }
  }
}

// Multi-hot data (bags of 0 to 12 ids per table, repeats within bags and samples): one
// process, vanilla and herald with every mechanism (lookahead eviction, prefetch, the
// overlapped all-reduce, refined allocation, flushes, replicated and uncached tables, two
// hosts with aggregation, host allocation and peer sync, a scheduler per host) train the
// same model, pooled by sum or mean, and the rows on the wire are ember-sim's.
TEST_F(Training, MultiHotTrainsTheBspModelWithTheSimulatorsCounts) {
  const fs::path data = dataset(8000, "3,2,1,2,6,1,1,1,1,7,3,8,0,6,9,5,1,1,1,12,4,2,10,3,1,1");
  {
    const data::Dataset ds = data::Dataset::open(data);
    ASSERT_TRUE(ds.manifest().multi_hot);
  }
  const fs::path plan_file = mixed_placement(data);
  struct Case {
    const char* name;
    std::string policy, optimizer, pooling;
    bool mechanisms, placement, hosts, per_host = false;
    std::string admission = "none";
  };
  for (const Case& c : {Case{"mh-vanilla-sum", "vanilla", "sgd", "sum", false, false, false},
                        Case{"mh-herald-sum", "herald", "sgd", "sum", false, false, false},
                        Case{"mh-herald-all-mean", "herald", "adagrad", "mean", true, false, false},
                        Case{"mh-herald-placement", "herald", "sgd", "mean", true, true, false},
                        Case{"mh-herald-hosts", "herald", "sgd", "sum", true, false, true},
                        Case{"mh-herald-per-host", "herald", "sgd", "mean", true, false, true, true},
                        // Admission: rows turned away from a full cache are staged, and
                        // the model is still the one-process one.
                        Case{"mh-vanilla-tinylfu", "vanilla", "sgd", "sum", false, false, false, false, "tinylfu"},
                        Case{"mh-herald-tinylfu", "herald", "sgd", "sum", false, false, false, false, "tinylfu"},
                        Case{"mh-herald-tinylfu-all", "herald", "adagrad", "mean", true, false, false, false, "tinylfu"},
                        Case{"mh-herald-tinylfu-hosts", "herald", "sgd", "sum", true, false, true, false, "tinylfu"},
                        Case{"mh-herald-tinylfu-placement", "herald", "sgd", "mean", true, true, false, false, "tinylfu"}}) {
    JobOptions o;
    o.policy = c.policy;
    o.optimizer = c.optimizer;
    o.pooling = c.pooling;
    o.model = "wide-deep";
    o.cache_ratio = "0.12";
    if (c.mechanisms) {
      o.lookahead = 2;
      o.eviction = "lookahead";
      o.prefetch = true;
      o.overlap_allreduce = true;
      o.refine_allocation = !c.hosts;
      o.eval_every = 7;
    }
    if (c.placement) o.placement = plan_file.string();
    if (c.hosts) {
      o.workers_per_host = 2;
      o.host_aggregation = !c.per_host;
      o.host_allocation = !c.per_host;
      o.peer_sync = true;
    }
    if (c.per_host) o.worker_args = {"--scheduler-per-host"};
    o.cache_admission = c.admission;
    if (c.admission != "none") o.peer_sync = false;  // admission does not apply with peer sync (yet)
    const JobResult job = run_job_like_one_process(data, o, c.name, c.name);
    auto sim = simulate(data, o);
    EXPECT_GT(sim["pulls"], 0u) << c.name;
    if (c.mechanisms) {
      EXPECT_GT(sim["push_evict"], 0u) << c.name << ": the cache must be small enough to evict";
    }
    if (c.placement) {
      EXPECT_GT(sim["hot_sync"], 0u) << c.name;
    }
    if (c.admission != "none") {
      EXPECT_GT(sim["not_admitted"], 0u) << c.name << ": admission must turn rows away, or the case proves little";
    }
    expect_served_as_simulated(job, sim, o, c.name);
    expect_plans_as_simulated(job, sim, c.name);
  }
}

// MLPerf's batch size on MLPerf's bags: one micro-batch of 32,768 samples (about 7
// million ids) trains, and is the one-process model (no per-id tensors, no step that
// grows faster than the ids).
TEST_F(Training, MicroBatchOf32768MlperfBagsTrainsTheOneProcessModel) {
  const fs::path data = dataset(37000, "mlperf");
  {
    const data::Dataset ds = data::Dataset::open(data);
    ASSERT_TRUE(ds.manifest().multi_hot);
    ASSERT_GE(ds.split(data::Split::kTrain).rows(), 32768u);
  }
  JobOptions o;
  o.policy = "herald";
  o.workers = 1;
  o.batch = 32768;
  o.iterations = 2;
  o.cache_ratio = "1.0";
  o.model = "wide-deep";
  run_job_like_one_process(data, o, "mlperf-32768", "herald, one micro-batch of 32,768 MLPerf bags");
}

TEST_F(Training, AdagradRowsMatchOneProcessTraining) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.optimizer = "adagrad";
  o.shards = 1;
  o.model = "wide-deep";
  run_job_like_one_process(data, o, "adagrad", "herald + adagrad");
}

// The tensor cache backend (the one that keeps rows in GPU memory with --device cuda),
// run here on the CPU: the same model as one process, within float rounding.
TEST_F(Training, TensorCacheBackendTrainsTheSameModel) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.optimizer = "adagrad";
  o.cache_backend = "tensor";
  run_job_like_one_process(data, o, "tensor", "herald + adagrad, tensor cache backend");
}

// FAE-style training: the hottest rows replicated on every worker, their gradients summed
// with the dense ones. Same model as one process; cold rows on the wire as ember-sim says.
TEST_F(Training, FaeTrainsTheSameModelWithTheSimulatorsCounts) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "fae:0.02";
  o.optimizer = "adagrad";
  JobResult f = run_job_like_one_process(data, o, "fae", "fae:0.02 + adagrad");
  ASSERT_FALSE(f.reported.empty());
  EXPECT_GT(f.reported["hot_sync"], 0u) << "no hot row was trained";
  EXPECT_GT(f.reported["hot_flush"], 0u) << "the trained hot rows go back to the PS at the end";
  auto sim = simulate(data, o);
  expect_served_as_simulated(f, sim, o, "fae");
  expect_plans_as_simulated(f, sim, "fae");
}

// A placement executed (ember-plan's plan file): the two smallest tables and the largest
// replicated (all-reduced with the dense gradients, never on the PS), two mid-size tables
// uncached (pulled, end-pushed and dropped every iteration), the rest cached (one of them
// in a cache share of its own), under
// herald, 2 shards, SGD and Adagrad (with the lookahead mechanisms and evaluations'
// flushes). The same model as one process; every kind of row on the wire, the
// all-reduced rows and the replicas' write-backs included, as ember-sim predicts.
TEST_F(Training, PlacementTrainsTheBspModelWithTheSimulatorsCounts) {
  const fs::path data = dataset();
  const fs::path plan_file = mixed_placement(data);
  for (const char* optimizer : {"sgd", "adagrad"}) {
    JobOptions o;
    o.policy = "herald";
    o.optimizer = optimizer;
    o.model = "wide-deep";
    o.placement = plan_file.string();
    o.eval_every = 4;
    if (o.optimizer == "adagrad") {
      o.lookahead = 2;
      o.prefetch = true;
      o.overlap_allreduce = true;
    }
    const std::string what = std::string("herald + placement, ") + optimizer;
    JobResult job = run_job_like_one_process(data, o, std::string("placement-") + optimizer, what);
    auto sim = simulate(data, o);
    EXPECT_GT(sim["hot_sync"], 0u) << what;
    EXPECT_GT(sim["hot_flush"], 0u) << what;
    EXPECT_GT(sim["push_grad"], 0u) << what;
    expect_served_as_simulated(job, sim, o, what);
    expect_plans_as_simulated(job, sim, what);
  }
}

TEST_F(Training, CudaWorkersTrainTheSameModel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible to LibTorch";
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.device = "cuda";
  o.workers = 1;
  o.batch = kBatch * kWorkers;
  run_job_like_one_process(data, o, "cuda", "herald on CUDA");
}

TEST_F(Training, RealCriteoAndAvazuSamplesTrainEndToEnd) {
  for (auto [file, format] : {std::pair{"train.tiny.csv", "criteo-csv"}, std::pair{"tr.rx.csv", "avazu"}}) {
    fs::path sample = test::real_sample(file);
    if (sample.empty()) GTEST_SKIP() << "../shared/data/real is absent";
    fs::path data = dir_ / format;
    std::string out;
    ASSERT_EQ(test::run_command(test::bin("ember-data") + " prep --format " + format + " --val-fraction 0.2 --force -o " + data.string() +
                                    " " + sample.string(),
                                out),
              0)
        << out;
    JobOptions o;
    o.shards = 1;
    o.workers = 2;
    o.batch = 32;
    o.iterations = 20;
    o.cache_ratio = "0.3";
    JobResult r = run_job(data, o, format);
    EXPECT_GE(r.auc, 0.0) << format;
    EXPECT_GT(r.reported["pulls"], 0u) << format;
  }
}

}  // namespace
}  // namespace ember::worker
