// End-to-end training on hosts (virtual hosts on loopback): the hierarchical all-reduce,
// per-host aggregation, host allocation, peer sync and a scheduler per host train the
// one-process model, and resume exactly.
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
  EXPECT_EQ(hier.reported.at("allreduce_bytes"), flat.reported.at("allreduce_bytes"));
  // Flat: ranks 1 and 3 send 2(W-1)/W = 1.5x the payload to the other host; hierarchical:
  // the 2 leaders 2(H-1)/H = 1x.
  const double per_worker = static_cast<double>(flat.reported.at("allreduce_bytes")) / kWorkers;
  EXPECT_NEAR(static_cast<double>(flat.reported.at("allreduce_cross_host_bytes")), 3.0 * per_worker, 8);
  EXPECT_NEAR(static_cast<double>(hier.reported.at("allreduce_cross_host_bytes")), 2.0 * per_worker, 8);
  EXPECT_EQ(hier.reported.at("hosts"), 2u * kWorkers) << "every worker counts 2 hosts";

  auto sim = simulate(data, o);
  for (const JobResult* job : {&flat, &hier}) {
    auto& w = job->reported;
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
  EXPECT_NEAR(static_cast<double>(flat.reported.at("links.intra_host.peer_bytes_out")), 3.0 * per_worker, 8);
  EXPECT_NEAR(static_cast<double>(hier.reported.at("links.intra_host.peer_bytes_out")), 4.0 * per_worker, 8);
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
    auto& w = job.reported;
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
        EXPECT_EQ(job.reported.at(key), sim[key]) << policy << ": " << key << ", vs ember-sim's links";
      }
    }
    // Every word a worker sends reaches the 3 others.
    EXPECT_GT(job.reported.at("scheduler_exchange_bytes_out"), 0u) << policy;
    EXPECT_EQ(job.reported.at("scheduler_exchange_bytes_in"), 3 * job.reported.at("scheduler_exchange_bytes_out")) << policy;
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
  EXPECT_GT(whole.reported.at("push_evict"), 0u) << "no eviction to exchange: the test proves less";
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
  EXPECT_GT(whole.reported.at("peer_value") + whole.reported.at("peer_grad"), 0u) << "peer sync never applied: the test proves less";
}

}  // namespace
}  // namespace ember::worker
