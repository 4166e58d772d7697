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

namespace ember::worker {
namespace {

using namespace test_jobs;

class Training : public JobTest {
 protected:
  void expect_survivors_end_when_stopped(const JobOptions& o, std::uint32_t victim, const std::string& name) {
    const fs::path data = dataset(4000);
    Processes ps;
    const std::string coord = start_ps(data, o, name, ps);
    ASSERT_FALSE(coord.empty());
    Processes workers = start_workers(data, o, coord, name);
    wait_for_lines(dir_ / (name + "-w0.jsonl"), 3);
    workers[victim]->signal(SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    const std::string named = "worker " + std::to_string(victim) + ": no heartbeat";
    for (std::uint32_t w = 0; w < o.workers; ++w) {
      if (w == victim) continue;
      EXPECT_EQ(workers[w]->wait(20s), 6) << name << " worker " << w << ": " << workers[w]->log_tail(10);
      const std::string tail = workers[w]->log_tail(10);
      EXPECT_NE(tail.find(named), std::string::npos) << name << ": " << tail;
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_LT(took, 3.0 + 3.0 + 4.0) << name << ": survivors must end within the heartbeat timeout, the watchdog's grace and a margin";
    EXPECT_EQ(ps[0]->wait(20s), 6) << ps[0]->log_tail(10);
    EXPECT_NE(ps[0]->log_tail(20).find(named), std::string::npos) << ps[0]->log_tail(20);
    workers[victim]->signal(SIGKILL);
  }
};

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

  ASSERT_FALSE(v.wire.empty());
  ASSERT_FALSE(h.wire.empty());
  EXPECT_LT(transmissions(h.wire), transmissions(v.wire)) << "herald should move fewer rows than vanilla";
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

// A disk tier under each shard (--store-dir, --ram-budget-mb 0.0625: a fraction of each
// shard's rows) trains the model all-RAM shards train, bit for bit, serving the same
// rows; the workers name each iteration's rows --lookahead iterations ahead (hints), and
// the shards' summaries count the tier's reads and evictions.
TEST_F(Training, DiskTierTrainsTheAllRamModelBitForBit) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.optimizer = "adagrad";
  o.model = "wide-deep";
  o.cache_ratio = "0.06";
  o.lookahead = 2;
  o.eviction = "lookahead";
  o.prefetch = true;
  o.eval_every = 7;
  const JobResult ram = run_job(data, o, "tier-ram");
  JobOptions t = o;
  t.ps_args = {"--store-dir", (dir_ / "tier").string(), "--ram-budget-mb", "0.0625"};
  const JobResult disk = run_job(data, t, "tier-disk");
  ASSERT_FALSE(ram.dump.rows.empty());
  EXPECT_EQ(max_abs_diff(ram.dump.rows, disk.dump.rows), 0.0f);
  EXPECT_EQ(max_abs_diff(ram.dump.dense, disk.dump.dense), 0.0f);
  for (const char* kind : {"pull", "pull_state", "prefetch", "push_grad", "push_value"})
    EXPECT_EQ(ram.served.at(std::string(kind) + ".rows"), disk.served.at(std::string(kind) + ".rows")) << kind;
  EXPECT_EQ(ram.served.at("hint.rows"), 0u) << "hints are sent to shards with a tier only";
  EXPECT_GT(disk.served.at("hint.rows"), 0u);
  std::uint64_t evicted = 0, hint_loads = 0, touched = 0;
  std::string tiers;
  for (int s = 0; s < 2; ++s) {
    const json summary = json::parse(read_file(dir_ / ("tier-disk-ps" + std::to_string(s) + ".json")));
    const json& tier = summary.at("tier");
    tiers += tier.dump() + " ";
    evicted += tier.at("evicted_rows").get<std::uint64_t>();
    hint_loads += tier.at("hint_loads").get<std::uint64_t>();
    touched += tier.at("rows_touched").get<std::uint64_t>();
  }
  EXPECT_GT(evicted, 0u) << "the rows never outgrew the budget: the tier was not exercised; " << tiers;
  EXPECT_GT(hint_loads, 0u) << tiers;
  EXPECT_GT(touched, 0u) << tiers;
}

// Tiered shards checkpoint and resume exactly: a job resumed at iteration 7 from a
// tiered job's checkpoint, into tiered shards again (their store directories reused: the
// same table), ends bit for bit as the uninterrupted tiered job, which trains the
// one-process model.
TEST_F(Training, DiskTierJobsResumeExactly) {
  const fs::path data = dataset();
  const std::vector<std::string> tier = {"--store-dir", (dir_ / "tier").string(), "--ram-budget-mb", "0.0625"};
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.ps_args.insert(o.ps_args.end(), tier.begin(), tier.end());
  o.optimizer = "adagrad";
  o.dense_optimizer = "adagrad";
  const JobResult whole = run_job_like_one_process(data, o, "tier-whole", "herald + adagrad on a disk tier, checkpointing");
  // A tiered shard checkpoints incrementally (one whole in 8): 7's files add to 3's.
  for (const char* f : {"shard-0-of-2.ckpt", "shard-1-of-2.ckpt"}) {
    const auto info = ps::ShardStore::checkpoint_info(dir_ / "ckpt" / "iter-000000007" / f);
    EXPECT_EQ(info.base, std::optional<std::int64_t>(3)) << f;
  }
  JobOptions resumed = o;
  resumed.ps_args = {"--restore", (dir_ / "ckpt" / "iter-000000007").string()};
  resumed.ps_args.insert(resumed.ps_args.end(), tier.begin(), tier.end());
  resumed.worker_args.push_back("--resume");
  const JobResult r = run_job(data, resumed, "tier-resumed");
  ASSERT_FALSE(whole.dump.rows.empty());
  EXPECT_EQ(max_abs_diff(whole.dump.rows, r.dump.rows), 0.0f);
  EXPECT_EQ(max_abs_diff(whole.dump.dense, r.dump.dense), 0.0f);
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
  ASSERT_FALSE(f.wire.empty());
  EXPECT_GT(f.wire["hot_sync"], 0u) << "no hot row was trained";
  EXPECT_GT(f.wire["hot_flush"], 0u) << "the trained hot rows go back to the PS at the end";
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

// On a GPU machine (a CUDA build of LibTorch), the same with the cache in GPU memory.
// The hierarchical all-reduce (a reduce within each host, a ring over the hosts' leaders,
// a broadcast back) sums the same gradients in another order: the same model as one
// process, with only the leaders' ring crossing hosts. 4 workers on 2 virtual hosts, the
// shards on the first: the rows each worker moved within its host and across hosts, as
// the transport counted them, are ember-sim's link by link.
TEST_F(Training, HierarchicalAllReduceTrainsTheSameModel) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.model = "wide-deep";
  o.workers_per_host = 2;
  o.ps_on_host = 0;
  const JobResult flat = run_job_like_one_process(data, o, "flat", "flat all-reduce over 2 hosts");
  o.allreduce = "hierarchical";
  o.overlap_allreduce = true;
  const JobResult hier = run_job_like_one_process(data, o, "hierarchical", "hierarchical all-reduce over 2 hosts");
  EXPECT_EQ(hier.wire.at("allreduce_bytes"), flat.wire.at("allreduce_bytes"));
  // Flat: ranks 1 and 3 send 2(W-1)/W = 1.5x the payload to the other host; hierarchical:
  // the 2 leaders 2(H-1)/H = 1x.
  const double per_worker = static_cast<double>(flat.wire.at("allreduce_bytes")) / kWorkers;
  EXPECT_NEAR(static_cast<double>(flat.wire.at("allreduce_cross_host_bytes")), 3.0 * per_worker, 8);
  EXPECT_NEAR(static_cast<double>(hier.wire.at("allreduce_cross_host_bytes")), 2.0 * per_worker, 8);
  EXPECT_EQ(hier.wire.at("hosts"), 2u * kWorkers) << "every worker counts 2 hosts";

  auto sim = simulate(data, o);
  for (const JobResult* job : {&flat, &hier}) {
    auto& w = job->wire;
    for (const char* kind : {"push_grad", "push_value", "pull"}) {
      const std::string cross = std::string("links.cross_host.") + kind, intra = std::string("links.intra_host.") + kind;
      EXPECT_GT(sim[cross], 0u) << cross;
      EXPECT_GT(sim[intra], 0u) << intra;
      EXPECT_EQ(w.at(cross), sim[cross]) << "rows across hosts, vs ember-sim --hosts 2 --ps-hosts 0";
      // (Worker 0's evaluation and dump pull as reads, counted apart.)
      EXPECT_EQ(w.at(intra), sim[intra]) << "rows within hosts, vs ember-sim";
    }
    // Every byte the shards served went through a worker's socket on one link or the
    // other (counted by each side apart); host 1's workers reach the shards across hosts.
    EXPECT_EQ(w.at("links.intra_host.ps_bytes_out") + w.at("links.cross_host.ps_bytes_out") + w.at("links.intra_host.ps_bytes_in") +
                  w.at("links.cross_host.ps_bytes_in"),
              served_bytes(*job));
    EXPECT_GT(w.at("links.cross_host.ps_bytes_in"), 0u);
    EXPECT_GT(w.at("links.intra_host.ps_bytes_in"), 0u);
    expect_served_as_simulated(*job, sim, o, "all-reduce over 2 hosts");
  }
  // Within a host, the flat ring sends 1.5x the payload from ranks 0 and 2; the
  // hierarchical reduce and broadcast 1x from every worker.
  EXPECT_NEAR(static_cast<double>(flat.wire.at("links.intra_host.peer_bytes_out")), 3.0 * per_worker, 8);
  EXPECT_NEAR(static_cast<double>(hier.wire.at("links.intra_host.peer_bytes_out")), 4.0 * per_worker, 8);
}

// The host hierarchy for rows, each mechanism alone and all together, on 2 hosts x 2
// workers (and aggregation on 2 x 3) and 2 shards:
//   - per-host aggregation (--host-aggregation): a row of a shard on another host is
//     pulled once per host and handed to the host's other workers, and its gradients
//     are summed in the host and pushed once;
//   - two-level allocation (--host-allocation): samples to hosts, then to workers;
//   - peer sync (--peer-sync): a dirty row whose one trainer is another worker of its
//     holder's host moves between them, not through the PS.
// Each trains the same model as one process, and moves the rows ember-sim plans, kind
// by kind and link by link. Herald with SGD (shards on a host of their own) and with
// Adagrad (shards beside host 0's workers: their rows stay flat), with lookahead and
// prefetch; vanilla (every trained row's gradient pushed, where summing saves most).
// Caches small enough to evict, so that evictions are counted link by link too.
TEST_F(Training, HostHierarchyForRowsTrainsTheSameModel) {
  const fs::path data = dataset();
  struct Case {
    const char* name;
    std::string policy, optimizer;
    int ps_on_host;
    bool aggregate, allocate, peer;
    std::uint32_t per_host = 2;  // 2 hosts of 2 workers, or of 3
  };
  // A host's parts of a row are summed only when a phase holds them all
  // (scheduler/host_parts.h): with three workers a host, not always (agg-herald-adagrad-3).
  const std::vector<Case> cases = {Case{"agg-herald-sgd", "herald", "sgd", -1, true, false, false},
                                   Case{"agg-herald-adagrad", "herald", "adagrad", 0, true, false, false},
                                   Case{"agg-vanilla", "vanilla", "sgd", -1, true, false, false},
                                   Case{"peer-herald-adagrad", "herald", "adagrad", -1, false, false, true},
                                   Case{"all-herald-sgd", "herald", "sgd", -1, true, true, true},
                                   Case{"all-herald-adagrad", "herald", "adagrad", 0, true, true, true},
                                   Case{"agg-herald-adagrad-3", "herald", "adagrad", -1, true, false, false, 3}};
  for (const Case& c : cases) {
    JobOptions o;
    o.policy = c.policy;
    o.optimizer = c.optimizer;
    o.workers = 2 * c.per_host;
    o.workers_per_host = c.per_host;
    o.ps_on_host = c.ps_on_host;
    o.cache_ratio = "0.06";  // caches that evict
    o.host_aggregation = c.aggregate;
    o.host_allocation = c.allocate;
    o.peer_sync = c.peer;
    if (c.policy == "herald") {
      o.lookahead = 2;
      o.prefetch = true;
    }
    const JobResult job = run_job_like_one_process(data, o, c.name, std::string(c.name) + " on 2 hosts");
    auto sim = simulate(data, o);
    JobOptions flat_o = o;
    flat_o.host_aggregation = false;
    auto flat = simulate(data, flat_o);
    expect_served_as_simulated(job, sim, o, c.name);
    expect_plans_as_simulated(job, sim, c.name);
    if (c.peer) {
      EXPECT_GT(sim["peer_value"], 0u) << c.name << ": rows handed by peer sync";
      EXPECT_GT(sim["peer_grad"], 0u) << c.name << ": rows applied within a host";
    }
    auto& w = job.wire;
    for (const char* link : {"cross_host", "intra_host"}) {
      for (const char* kind : {"push_grad", "push_value", "pull"}) {
        const std::string key = std::string("links.") + link + "." + kind;
        // (Worker 0's evaluation and dump pull as reads, counted apart.)
        EXPECT_EQ(w.at(key), sim[key]) << c.name << ": " << key << ", vs ember-sim's links_aggregated";
      }
    }
    // Fewer rows across hosts than without aggregation: repeated pulls and gradients.
    if (c.aggregate) {
      EXPECT_LT(w.at("links.cross_host.pull"), flat["links.cross_host.pull"]) << c.name;
      EXPECT_LT(w.at("links.cross_host.push_grad"), flat["links.cross_host.push_grad"]) << c.name;
    }
    EXPECT_GT(w.at("links.intra_host.relay_bytes_out"), 0u) << c.name;
    EXPECT_EQ(w.at("links.intra_host.relay_bytes_out"), w.at("links.intra_host.relay_bytes_in")) << c.name << ": every byte sent arrives";
    EXPECT_EQ(w.at("links.cross_host.relay_bytes_out"), 0u) << c.name;
    // Every byte the shards served crossed a worker's socket on the link of the shards'
    // host: across hosts when they have a host of their own.
    const std::uint64_t socket = w.at("links.intra_host.ps_bytes_out") + w.at("links.cross_host.ps_bytes_out") +
                                 w.at("links.intra_host.ps_bytes_in") + w.at("links.cross_host.ps_bytes_in");
    EXPECT_EQ(socket, served_bytes(job)) << c.name << ": bytes at the workers' sockets vs the shards'";
    if (c.ps_on_host < 0) {
      EXPECT_EQ(w.at("links.intra_host.ps_bytes_out") + w.at("links.intra_host.ps_bytes_in"), 0u) << c.name;
    }
  }
}

// A scheduler per host (--scheduler-per-host): each process models only its host's
// caches and the hosts exchange their evictions after each iteration. With a cache small
// enough to evict, herald + Adagrad (lookahead, prefetch, peer sync) and vanilla on 2
// hosts x 2 workers train the one-process model, and every kind of row ember-sim (one
// scheduler of every worker) counts. Drop the exchange and the plans part: the model
// and the counts break.
TEST_F(Training, SchedulerPerHostTrainsTheSameModel) {
  const fs::path data = dataset();
  for (const std::string policy : {"herald", "vanilla"}) {
    JobOptions o;
    o.policy = policy;
    o.optimizer = policy == "herald" ? "adagrad" : "sgd";
    o.workers_per_host = 2;
    o.cache_ratio = "0.06";
    if (policy == "herald") {
      o.lookahead = 2;
      o.prefetch = true;
      o.peer_sync = true;
    }
    o.worker_args = {"--scheduler-per-host"};
    const JobResult job = run_job_like_one_process(data, o, "per-host-" + policy, policy + " with a scheduler per host");
    auto sim = simulate(data, o);
    expect_served_as_simulated(job, sim, o, policy + " with a scheduler per host");
    expect_plans_as_simulated(job, sim, policy + " with a scheduler per host");
    if (policy == "herald") {
      EXPECT_GT(sim["push_evict"], 0u) << "no eviction to exchange: the test proves little";
    }
    // Rows per link too (the shards on a host of their own: every PS row crosses; the
    // peer hand-offs stay within), evictions of rows whose slot a handed row takes
    // included (worker 0's evaluation and dump pull as reads, counted apart).
    for (const char* kind : {"push_grad", "push_value", "pull"}) {
      for (const char* link : {"cross_host", "intra_host"}) {
        const std::string key = std::string("links.") + link + "." + kind;
        EXPECT_EQ(job.wire.at(key), sim[key]) << policy << ": " << key << ", vs ember-sim's links";
      }
    }
    // Every word a worker sends reaches the 3 others.
    EXPECT_GT(job.wire.at("scheduler_exchange_bytes_out"), 0u) << policy;
    EXPECT_EQ(job.wire.at("scheduler_exchange_bytes_in"), 3 * job.wire.at("scheduler_exchange_bytes_out")) << policy;
  }
}

// With a scheduler per host and a cache that evicts, a job (2 hosts x 2 workers, herald
// + Adagrad, lookahead, prefetch) resumed from a checkpoint ends bit for bit as the
// uninterrupted one: the resumed schedulers replay the iterations before it, exchanging
// their evictions as the first job's did.
TEST_F(Training, SchedulerPerHostJobsResumeExactly) {
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.cache_ratio = "0.06";
  o.lookahead = 2;
  o.prefetch = true;
  o.worker_args.push_back("--scheduler-per-host");
  const JobResult whole = expect_resumes_exactly(dataset(), o, "ph", "a scheduler per host");
  EXPECT_GT(whole.wire.at("push_evict"), 0u) << "no eviction to exchange: the test proves less";
}

// A job with the whole host hierarchy for rows (2 hosts x 2 workers, herald + Adagrad,
// per-host aggregation, two-level allocation, peer sync) checkpoints the BSP model and
// resumes from a checkpoint to the uninterrupted job's model, bit for bit: the rows
// applied within a host are applied before every flush, and the replayed scheduler
// hands the same rows to the same workers.
TEST_F(Training, HostHierarchyJobsResumeExactly) {
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.host_aggregation = o.host_allocation = o.peer_sync = true;
  const JobResult whole = expect_resumes_exactly(dataset(), o, "hh", "the host hierarchy");
  EXPECT_GT(whole.wire.at("peer_value") + whole.wire.at("peer_grad"), 0u) << "peer sync never applied: the test proves less";
}

// Cache admission: a job resumed from a checkpoint turns away the rows the
// uninterrupted one did (the replayed scheduler rebuilds the frequency sketch) and ends
// bit for bit as it (multi-hot bags, a cache under pressure, lookahead and prefetch).
TEST_F(Training, AdmissionJobsResumeExactly) {
  const fs::path data = dataset(8000, "3,2,1,2,6,1,1,1,1,7,3,8,0,6,9,5,1,1,1,12,4,2,10,3,1,1");
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.cache_ratio = "0.12";
  o.lookahead = 2;
  o.prefetch = true;
  o.cache_admission = "tinylfu";
  // The resumed job equals the uninterrupted one bit for bit; the one-process model sums
  // the dense gradients in another order, which a ReLU's kink amplifies (docs/training.md
  // "Same model, whatever the policy"): 4e-5 here with OpenBLAS's AVX-512 kernels.
  one_process_tolerance_ = 1e-4;
  expect_resumes_exactly(data, o, "adm", "cache admission");
  EXPECT_GT(simulate(data, o)["not_admitted"], 0u) << "admission turned no row away: the test proves less";
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

// A herald job's checkpoints hold the model of BSP training before their iteration (the
// rows workers own and their partial gradients are flushed to the PS first; before,
// they held the PS's stale copies), and a job restored from one (ember-ps --restore,
// ember-worker --resume) trains on to the same model as the uninterrupted run. Adagrad
// on both sides: the optimizers' state must come back too.
TEST_F(Training, CheckpointsHoldTheBspModelAndJobsResumeFromThem) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.optimizer = "adagrad";
  o.dense_optimizer = "adagrad";
  const JobResult whole = run_job_like_one_process(data, o, "whole", "herald + adagrad, checkpointing");
  // commit(I) with (I + 1) % 4 == 0 checkpoints the rows trained before iteration I, and
  // the workers' last commit (of iteration 10, after their final flush) the whole run's.
  expect_checkpoint_of(data, o, 3);
  const std::vector<float> at7 = expect_checkpoint_of(data, o, 7);
  expect_checkpoint_of(data, o, kIterations);
  ASSERT_FALSE(whole.dump.rows.empty());
  EXPECT_GT(max_abs_diff(at7, whole.dump.rows), 1e-4) << "iterations 7-9 changed nothing: the resume below proves nothing";

  JobOptions resumed = o;
  resumed.ps_args = {"--restore", (dir_ / "ckpt" / "iter-000000007").string()};
  resumed.worker_args.push_back("--resume");
  const JobResult r = run_job_like_one_process(data, resumed, "resumed", "herald + adagrad, resumed at iteration 7");
  EXPECT_LT(max_abs_diff(whole.dump.rows, r.dump.rows), 2e-5);
  EXPECT_LT(max_abs_diff(whole.dump.dense, r.dump.dense), 2e-5);
  // It trained iterations 7-9 only.
  std::ifstream in(dir_ / "resumed-w0.jsonl");
  std::vector<std::uint64_t> trained;
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line);
    if (j.contains("iteration") && !j.contains("eval")) trained.push_back(j.at("iteration"));
  }
  EXPECT_EQ(trained, (std::vector<std::uint64_t>{7, 8, 9}));
}

// Checkpoints on command (SIGUSR1 to a shard, no --checkpoint-every): every shard
// writes the iteration asked for a few commits later, the workers having flushed for it,
// and it holds the model of BSP training before that iteration. Two shards signalled an
// iteration apart name different iterations: each is flushed for and whole (the workers
// used to keep only the later one, so the other held that shard's rows only).
TEST_F(Training, CheckpointOnCommandHoldsTheBspModel) {
  const fs::path data = dataset();
  const fs::path ckpt = dir_ / "ckpt";
  JobOptions o = checkpointing_job({});
  o.iterations = 40;
  const fs::path metrics = dir_ / "command-w0.jsonl";
  run_job(data, o, "command", [&](Processes& ps, Processes&) {
    // Iteration 1 done: no shard has committed 3 yet (worker 0 has not); iteration 7 done:
    // every shard has (worker 0's commit was acknowledged). So they name distinct ones,
    // with room for a shard that handles its signal a few commits late on a loaded host.
    wait_for_lines(metrics, 2);
    ps[1]->signal(SIGUSR1);
    wait_for_lines(metrics, 8);
    ps[0]->signal(SIGUSR1);
  });
  // The two asked for, and the finished model's (iteration 40, at the workers' last commit).
  std::vector<fs::path> dirs;
  if (fs::exists(ckpt))
    for (const auto& e : fs::directory_iterator(ckpt)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  ASSERT_EQ(dirs.size(), 3u) << "two checkpoints asked for, and the last";
  EXPECT_EQ(dirs[2].filename(), "iter-000000040");
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(fs::exists(dirs[i] / "manifest.json")) << dirs[i] << ": every shard wrote it";
    const std::uint64_t it = std::stoull(dirs[i].filename().string().substr(5));
    EXPECT_GE(it, 1u + ps::kCheckpointLead);  // asked once iteration 1 was committed
    EXPECT_LT(it, o.iterations);
    expect_checkpoint_of(data, o, it);
  }
}

// SIGTERM to a shard of a running job, with --checkpoint-on-exit: the job stops at a
// checkpoint the workers flush for (not at once: the rows they own would be missing),
// every process exits 0, the checkpoint holds BSP training of that many iterations, and
// a job resumed from it ends with the uninterrupted run's model.
TEST_F(Training, SigtermStopsTheJobAtACheckpointThatResumes) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-on-exit"});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "stopped", [](Processes& ps, Processes&) { ps[1]->signal(SIGTERM); });
  ASSERT_GE(stopped.iteration, 1u + ps::kCheckpointLead) << "stopped once iteration 1 was committed, a lead later";
  ASSERT_FALSE(stopped.dir.empty());

  JobOptions resumed = o;
  resumed.ps_args.insert(resumed.ps_args.end(), {"--restore", stopped.dir.string()});
  resumed.worker_args.push_back("--resume");
  run_job_like_one_process(data, resumed, "resumed", "herald, stopped by SIGTERM and resumed");
}

// SIGTERM to one worker of a running job, whose shards checkpoint and whose workers have
// a --checkpoint-dir: the worker asks the shards (its commits flagged kCommitStop) to
// stop the job at a checkpoint, and it stops there as on a shard's SIGTERM: every
// process exits 0, and the checkpoint holds BSP training of that many iterations.
TEST_F(Training, SigtermToAWorkerStopsTheJobAtACheckpoint) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "worker-stop", [](Processes&, Processes& workers) { workers[2]->signal(SIGTERM); });
  ASSERT_GE(stopped.iteration, 1u + ps::kCheckpointLead) << "stopped once iteration 1 was committed, a lead later";
  ASSERT_FALSE(stopped.dir.empty());
  EXPECT_NE(read_file(dir_ / "worker-stop-w2.log").find("signal 15: the job stops at a checkpoint"), std::string::npos);
}

// SIGTERM to every process of the job at once, as a cluster manager sends it: the shards
// (--checkpoint-on-exit) and the workers each ask for the stop, and the job stops at the
// first one named, checkpointed whole, instead of the workers dying and the shards
// writing the rows they hold alone.
TEST_F(Training, SigtermToEveryProcessStopsTheJobAtACheckpoint) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-on-exit"});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "all-stop", [](Processes& ps, Processes& workers) {
    for (auto& p : workers) p->signal(SIGTERM);
    for (auto& p : ps) p->signal(SIGTERM);
  });
  EXPECT_FALSE(stopped.dir.empty());
}

TEST_F(Training, ClearErrorsForWrongTokenMismatchedDataAndRdma) {
  const fs::path data = dataset(4000);
  std::string out;
  // No RDMA device here (or one, on a machine that has it): one line either way.
  int rc = test::run_command(
      test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator tcp://127.0.0.1:1 --token x --transport rdma", out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("RDMA"), std::string::npos) << out;
  EXPECT_NE(out.find("--transport tcp"), std::string::npos) << out;
  if (!torch::cuda::is_available()) {
    rc = test::run_command(
        test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator tcp://127.0.0.1:1 --token x --device cuda 2>&1", out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("no CUDA device"), std::string::npos) << out;
    EXPECT_NE(out.find("--device cpu"), std::string::npos) << out;
  }

  JobOptions o;
  o.shards = 1;
  o.workers = 1;
  std::vector<std::unique_ptr<test::Process>> ps;
  const std::string coord = start_ps(data, o, "job", ps);
  ASSERT_FALSE(coord.empty());
  rc = test::run_command(test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator " + coord +
                             " --token wrong --workers 1 --join-timeout-ms 5000 2>&1",
                         out);
  EXPECT_EQ(rc, 5) << out;
  EXPECT_NE(out.find("wrong job token"), std::string::npos) << out;
  // Another dataset than the PS serves.
  const fs::path other = dir_ / "other";
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 3000 --scale 0.0002 --seed 9 --force -o " +
                                  (dir_ / "o.tsv").string() + " && " + test::bin("ember-data") + " prep --format criteo --force -o " +
                                  other.string() + " " + (dir_ / "o.tsv").string(),
                              out),
            0)
      << out;
  rc = test::run_command(
      test::bin("ember-worker") + " --dataset " + other.string() + " --coordinator " + coord + " --token " + kToken + " --workers 1 2>&1",
      out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("dataset mismatch"), std::string::npos) << out;
  // --resume against shards that restored nothing (a job of its own: a worker that fails
  // after joining keeps its place).
  std::vector<std::unique_ptr<test::Process>> ps2;
  const std::string coord2 = start_ps(data, o, "resume", ps2);
  ASSERT_FALSE(coord2.empty());
  rc = test::run_command(test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator " + coord2 + " --token " + kToken +
                             " --workers 1 --resume --checkpoint-dir " + (dir_ / "none").string() + " 2>&1",
                         out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("restored no checkpoint"), std::string::npos) << out;
}

TEST_F(Training, KilledWorkerFailsTheJobWithoutHanging) {
  const fs::path data = dataset(4000);
  JobOptions o;
  o.shards = 1;
  o.workers = 2;
  o.iterations = 1000000;
  Processes ps;
  const std::string coord = start_ps(data, o, "kill", ps);
  ASSERT_FALSE(coord.empty());
  Processes workers = start_workers(data, o, coord, "kill");
  // Wait until training runs (the metrics file grows), then kill worker 1.
  ASSERT_FALSE(test::wait_for_file(dir_ / "kill-w0.jsonl", 60s).empty()) << workers[0]->log_tail(20);
  workers[1]->signal(SIGKILL);
  EXPECT_NE(workers[1]->wait(5s), 0);
  const int rc0 = workers[0]->wait(60s);
  EXPECT_NE(rc0, 0);
  EXPECT_NE(rc0, -2) << "worker 0 hung after its peer died";
  const int rps = ps[0]->wait(60s);
  EXPECT_EQ(rps, 6) << ps[0]->log_tail(10);  // job failed
  EXPECT_NE(ps[0]->log_tail(30).find("worker 1"), std::string::npos) << ps[0]->log_tail(30);
}

// The pids of processes whose command line contains every one of `parts`.
std::vector<pid_t> pids_with(const std::vector<std::string>& parts) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    bool all = !cmd.empty();
    for (const auto& p : parts) all = all && cmd.find(p) != std::string::npos;
    if (all) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// A stopped worker (SIGSTOP: alive, silent) blocks its peers in the all-reduce (and,
// with per-host aggregation, in the hand-offs of its host). The control plane declares
// it dead at the heartbeat timeout (3 s here); every survivor then exits within the
// timeout plus a few seconds, with JobFailed's status, naming it.
TEST_F(Training, StoppedWorkerEndsEverySurvivorWithinTheHeartbeatTimeout) {
  JobOptions o;
  o.shards = 1;
  o.workers = 3;
  o.iterations = 1000000;
  expect_survivors_end_when_stopped(o, 1, "stop");
}

// The same for the worker that pulls and pushes for its host (per-host aggregation: the
// first of host 1, on 2 hosts x 2 workers).
TEST_F(Training, StoppedHostRelayEndsEverySurvivorWithinTheHeartbeatTimeout) {
  JobOptions o;
  o.shards = 1;
  o.workers = 4;
  o.workers_per_host = 2;
  o.host_aggregation = true;
  o.iterations = 1000000;
  expect_survivors_end_when_stopped(o, 2, "stop-relay");
}

// kill -9 of one shard: no other process takes it for a finished job (no exit 0), and
// every one says the shard failed.
TEST_F(Training, KilledShardFailsEveryMemberNamingIt) {
  const fs::path data = dataset(4000);
  JobOptions o;
  o.shards = 2;
  o.workers = 2;
  o.iterations = 1000000;
  Processes ps;
  const std::string coord = start_ps(data, o, "kps", ps);
  ASSERT_FALSE(coord.empty());
  Processes workers = start_workers(data, o, coord, "kps");
  wait_for_lines(dir_ / "kps-w0.jsonl", 3);
  ps[1]->signal(SIGKILL);
  for (auto& w : workers) {
    const int rc = w->wait(20s);
    EXPECT_EQ(rc, 6) << w->log_tail(10);
    EXPECT_NE(w->log_tail(10).find("ps 1: no heartbeat"), std::string::npos) << w->log_tail(10);
  }
  EXPECT_EQ(ps[0]->wait(20s), 6) << ps[0]->log_tail(10);
  EXPECT_EQ(ps[0]->log_tail(30).find("every worker left"), std::string::npos) << ps[0]->log_tail(30);
}

// The launcher names the member that failed by the control plane's word (not the first
// process to exit), and its own death ends every process of its job.
TEST_F(Training, LauncherNamesTheFailedWorkerAndItsDeathEndsTheJob) {
  const fs::path data = dataset(4000);
  const fs::path out = dir_ / "launch";
  auto launch = [&](const std::string& name) {
    return std::make_unique<test::Process>(std::vector<std::string>{"/usr/bin/env",
                                                                    "python3",
                                                                    std::string(EMBER_SOURCE_DIR) + "/scripts/ember_launch.py",
                                                                    "--dataset",
                                                                    data.string(),
                                                                    "--workers",
                                                                    "3",
                                                                    "--policy",
                                                                    "herald",
                                                                    "--out",
                                                                    (out / name).string(),
                                                                    "--bin",
                                                                    EMBER_BIN_DIR,
                                                                    "--heartbeat-timeout-ms",
                                                                    "3000",
                                                                    "-q",
                                                                    "--",
                                                                    "--iterations",
                                                                    "1000000",
                                                                    "--batch-per-worker",
                                                                    "64",
                                                                    "--model",
                                                                    "dlrm",
                                                                    "--bottom-mlp",
                                                                    "16",
                                                                    "--top-mlp",
                                                                    "16",
                                                                    "--log-level",
                                                                    "warn"},
                                           dir_ / (name + ".log"));
  };
  {
    auto launcher = launch("stop");
    wait_for_lines(out / "stop" / "w0.jsonl", 3);
    const auto victim = pids_with({"ember-worker", (out / "stop" / "w1.jsonl").string()});
    ASSERT_EQ(victim.size(), 1u);
    ::kill(victim[0], SIGSTOP);
    EXPECT_EQ(launcher->wait(30s), 1);
    const std::string tail = launcher->log_tail(30);
    EXPECT_NE(tail.find("ember-launch: worker1 failed first, by the control plane: no heartbeat"), std::string::npos) << tail;
    ::kill(victim[0], SIGKILL);
  }
  {
    auto launcher = launch("orphan");
    wait_for_lines(out / "orphan" / "w0.jsonl", 3);
    EXPECT_EQ(pids_with({(out / "orphan").string(), "bin/ember-"}).size(), 4u);
    launcher->signal(SIGKILL);
    launcher->wait(5s);
    std::vector<pid_t> left;
    for (auto until = std::chrono::steady_clock::now() + 15s; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(100ms)) {
      left = pids_with({(out / "orphan").string(), "bin/ember-"});
      if (left.empty()) break;
    }
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job outlived its launcher by 15 s";
    for (pid_t p : left) ::kill(p, SIGKILL);
  }
}

// ember_launch.py --resume with a corrupt newest checkpoint (bytes flipped mid-file, the
// size unchanged, so the manifest's size check passes). A job of 19 iterations
// checkpoints at 9 and at its end (19); then, each on a copy of its checkpoints:
//   - a shard file of 19 corrupt: the launcher passes over 19 (one line naming the file
//     and "checksum mismatch") and the job goes on from 9;
//   - one worker's dense file of 19 corrupt: 19 stands (the replicas are identical), and
//     that worker loads worker 0's file of 19, logging the one it passed over;
//   - every dense file of 19 corrupt: the launcher passes over 19 for 9;
//   - every checkpoint corrupt: refused (exit 1), naming each.
TEST_F(Training, ResumePassesOverACorruptNewestCheckpoint) {
  const fs::path data = dataset(4000);
  auto launch = [&](const std::string& name, const fs::path& ckpt, bool resume, int iterations) {
    std::vector<std::string> args = {"/usr/bin/env",
                                     "python3",
                                     std::string(EMBER_SOURCE_DIR) + "/scripts/ember_launch.py",
                                     "--dataset",
                                     data.string(),
                                     "--ps",
                                     "2",
                                     "--workers",
                                     "2",
                                     "--policy",
                                     "herald",
                                     "--out",
                                     (dir_ / name).string(),
                                     "--bin",
                                     EMBER_BIN_DIR,
                                     "--checkpoint-dir",
                                     ckpt.string(),
                                     "--checkpoint-every",
                                     "10",
                                     "--heartbeat-timeout-ms",
                                     "5000",
                                     "--timeout",
                                     "120",
                                     "-q"};
    if (resume) args.push_back("--resume");
    for (const std::string a : {"--", "--iterations", "", "--batch-per-worker", "32", "--model", "dlrm", "--bottom-mlp", "16", "--top-mlp",
                                "16", "--eval-every", "0", "--eval-samples", "256"})
      args.push_back(a.empty() ? std::to_string(iterations) : a);
    test::Process p(args, dir_ / (name + ".log"));
    const int rc = p.wait(150s);
    return std::pair{rc, read_file(dir_ / (name + ".log"))};
  };
  // The iterations worker 0 trained in job `name`.
  auto trained = [&](const std::string& name) {
    std::vector<std::uint64_t> its;
    std::ifstream in(dir_ / name / "w0.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.contains("iteration") && !j.contains("eval") && !j.contains("summary")) its.push_back(j.at("iteration"));
    }
    return its;
  };
  auto flip = [](const fs::path& file) {
    std::string bytes = read_file(file);
    for (std::size_t i = 0; i < 8; ++i) bytes[bytes.size() / 2 + i] = static_cast<char>(~bytes[bytes.size() / 2 + i]);
    write_file_atomic(file, bytes);
  };
  const fs::path ckpt = dir_ / "ckpt";
  {
    const auto [rc, log] = launch("first", ckpt, false, 19);
    ASSERT_EQ(rc, 0) << log;
  }
  for (const char* it : {"iter-000000009", "iter-000000019"}) ASSERT_TRUE(fs::exists(ckpt / "ps" / it / "manifest.json")) << it;
  for (const char* f : {"worker-0-iter-000000019.pt", "worker-1-iter-000000019.pt", "worker-0-iter-000000009.pt"})
    ASSERT_TRUE(fs::exists(ckpt / "dense" / f)) << f;
  auto copy_of = [&](const std::string& name) {
    const fs::path c = dir_ / name;
    fs::copy(ckpt, c, fs::copy_options::recursive);
    return c;
  };
  auto iters_from = [](std::uint64_t first, std::uint64_t end) {
    std::vector<std::uint64_t> v;
    for (std::uint64_t i = first; i < end; ++i) v.push_back(i);
    return v;
  };

  {  // A shard file of 19.
    const fs::path c = copy_of("ckpt-shard");
    const fs::path victim = c / "ps" / "iter-000000019" / "shard-1-of-2.ckpt";
    flip(victim);
    const auto [rc, log] = launch("shard", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000009").string() + ", passing over iter-000000019 (" +
                       victim.string() + ": checksum mismatch (corrupt checkpoint))"),
              std::string::npos)
        << log;
    EXPECT_EQ(trained("shard"), iters_from(9, 21));
  }
  {  // Worker 1's dense file of 19: it loads worker 0's.
    const fs::path c = copy_of("ckpt-dense1");
    const fs::path victim = c / "dense" / "worker-1-iter-000000019.pt";
    flip(victim);
    const auto [rc, log] = launch("dense1", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000019").string() + ": " + victim.string() +
                       ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << log;
    const std::string w1 = read_file(dir_ / "dense1" / "worker1.log");
    EXPECT_NE(w1.find("worker 1: --resume: passing over " + victim.string() + ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << w1;
    EXPECT_NE(
        w1.find("dense model and optimizer from " + (c / "dense" / "worker-0-iter-000000019.pt").string() + " (its own file is corrupt)"),
        std::string::npos)
        << w1;
    EXPECT_EQ(trained("dense1"), iters_from(19, 21));
  }
  {  // Every dense file of 19: back to 9.
    const fs::path c = copy_of("ckpt-dense");
    for (int w = 0; w < 2; ++w) flip(c / "dense" / ("worker-" + std::to_string(w) + "-iter-000000019.pt"));
    const auto [rc, log] = launch("dense", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000009").string() + ", passing over iter-000000019 (" +
                       (c / "dense" / "worker-0-iter-000000019.pt").string() + ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << log;
    EXPECT_EQ(trained("dense"), iters_from(9, 21));
  }
  {  // Everything: refused, naming each.
    const fs::path c = copy_of("ckpt-all");
    for (const char* it : {"iter-000000009", "iter-000000019"}) flip(c / "ps" / it / "shard-0-of-2.ckpt");
    const auto [rc, log] = launch("all", c, true, 21);
    EXPECT_EQ(rc, 1) << log;
    for (const char* it : {"iter-000000009", "iter-000000019"}) {
      EXPECT_NE(
          log.find(std::string(it) + " (" + (c / "ps" / it / "shard-0-of-2.ckpt").string() + ": checksum mismatch (corrupt checkpoint))"),
          std::string::npos)
          << log;
    }
    EXPECT_NE(log.find("ember-launch: --resume: no checkpoint in " + (c / "ps").string() + " to resume from"), std::string::npos) << log;
  }
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
    EXPECT_GT(r.wire["pulls"], 0u) << format;
  }
}

}  // namespace
}  // namespace ember::worker
