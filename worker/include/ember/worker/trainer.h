// A training worker: run_worker joins the job, trains its share of every global batch
// and leaves. One iteration t, read in order (worker/src/):
//   loader.h          the scheduler's plan for t, made ahead in a thread of its own
//   ps_exchange.h     sync pushes, the workers' barrier, commit(t), evictions and pulls
//   compute_step.h    gather, forward/backward; dense all-reduce, dense optimizer
//                     (row gradients into the cache meanwhile)
//   ps_exchange.h     full-set policies' end pushes
//   row_updates.h     local optimizer for rows trained here alone, partials kept, drops
// and around them: job.h (join, PS connections), collective.h (c10d), trainer.cc (the
// loop, flushes for evaluations and checkpoints), checkpoint_life.h (resumes, checkpoints
// and stops), dense_checkpoint.h, evaluation.h, run_report.h.
// The row-state contract the plans follow is in docs/design.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ember/ps/ps_client.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/step_plan.h"
#include "ember/worker/model.h"

namespace ember::monitor {
class Exporter;
}

namespace ember::worker {

// A request from outside run_worker (ember-worker's SIGTERM/SIGINT thread) to stop the
// job at a checkpoint, as a PS shard's SIGTERM does: `signal` is the signal that asked
// (0: none). run_worker sets `possible` while it can honour one (in the training loop,
// with checkpoints on the PS shards and a checkpoint_dir here); otherwise the caller ends
// the process at once, after ending(): the job's control plane then hears why this
// worker went (ControlMember::ending) rather than finding it silent.
struct StopRequest {
  std::atomic<int> signal{0};
  std::atomic<bool> possible{false};

  // Tells the control plane that this worker is ending, and why, while run_worker has it
  // joined to a job (a no-op otherwise).
  void ending(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (tell_) tell_(why);
  }
  // run_worker's: how to tell it (none: nobody to tell).
  void set_teller(std::function<void(const std::string&)> tell) {
    std::lock_guard lock(mutex_);
    tell_ = std::move(tell);
  }

 private:
  std::mutex mutex_;
  std::function<void(const std::string&)> tell_;
};

// The scheduler's options (workers, batch_per_worker, cache_ratio, policy, seed, shuffle,
// iterations, threads, lookahead, eviction, prefetch, refine_allocation, placement:
// scheduler_config.h) are the job's: make_scheduler_config reads them from here as they
// are, with a training job's defaults (4 workers of herald for 100 iterations).
struct TrainConfig : scheduler::SchedulerOptions {
  TrainConfig() {
    workers = 4;  // checked against the job's shape
    policy = "herald";
    iterations = 100;
    for_training = true;
  }
  std::string dataset;                  // ember-data directory (train split; val for evaluation)
  ModelConfig model;                    // num_dense / num_tables / dim are filled from the job
  std::string dense_optimizer = "sgd";  // sgd or adagrad
  float dense_lr = 0.01f;
  std::uint64_t eval_every = 0;  // 0: only at the end
  // Sum the dense gradients over the workers while the PS exchange runs: the all-reduce
  // of iteration t starts after its backward pass and is waited for before t+1's forward
  // pass (the same model; an iteration's progress line then shows the loss before it).
  bool overlap_allreduce = false;
  std::uint64_t eval_samples = 0;      // 0: the whole validation split
  std::string device = "cpu";          // cpu, cuda or cuda:N (a CUDA build of LibTorch)
  std::string cache_backend = "auto";  // host (CPU memory) or tensor (device memory); auto: by device
  int torch_threads = 1;
  std::uint64_t progress_every = 10;
  std::string metrics_file;  // JSON lines (one per iteration, evaluation, summary)
  // Prometheus endpoint (ember-worker --metrics-port) the run's counters are served on;
  // none: not served. Outlives run_worker.
  monitor::Exporter* exporter = nullptr;
  std::string dump_dir;  // worker 0: dense weights and every embedding row at the end
  // Where each worker writes its dense model and optimizer at every PS checkpoint
  // (worker-R-iter-NNNNNNNNN.pt; empty: none), keeping the newest `keep_checkpoints`.
  std::string checkpoint_dir;
  std::uint32_t keep_checkpoints = 3;
  // Resume from the iteration the PS shards restored (ember-ps --restore): the dense
  // state of that iteration comes from checkpoint_dir.
  bool resume = false;
  StopRequest* stop = nullptr;  // none: the job stops only as the PS shards ask

  // Job
  std::string coordinator;  // tcp://host:port of the control plane
  std::string token;
  int rank = -1;                        // -1: assigned at join
  std::string transport = "tcp";        // tcp or rdma (the PS shards must serve the same)
  std::uint32_t rdma_slot_mib = 4;      // RDMA: largest reply (pulled rows) in MiB
  std::uint32_t ps_connections = 1;     // data connections per PS shard
  std::uint32_t socket_buffer_kib = 0;  // TCP send/receive buffers (0: kernel autotuning)
  std::string gloo_host = "127.0.0.1";  // interface the dense collective binds on
  std::string host;                     // this worker's host (empty: the machine's name), hosts.h
  std::string allreduce = "flat";       // flat (one ring) or hierarchical (host, leaders, host)
  // Per-host aggregation of row traffic (host_relay.h): rows of a shard on another host
  // cross once per host and phase, handed within the host.
  bool host_aggregation = false;
  std::chrono::milliseconds timeout{30000};  // PS requests
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds join_timeout{120000};
};

// A worker's traffic on one class of link (docs/cluster.md#traffic-per-link): with the PS
// shards, as the transport framed it (ps::WireTally, rows included), and with the other
// workers in the dense all-reduces (payload, by the algorithm: allreduce_link_bytes),
// and, within the host, the rows handed between its workers by per-host aggregation
// (`relay`: pulled rows received, gradients handed over; their floats' bytes).
struct LinkTraffic {
  ps::WireTally ps;
  std::uint64_t peer_out = 0, peer_in = 0;
  ps::WireTally relay;
  std::uint64_t out() const { return ps.out() + peer_out + relay.out(); }
  std::uint64_t in() const { return ps.in() + peer_in + relay.in(); }
};
struct Links {
  LinkTraffic intra_host, cross_host;
};

// Rows and bytes this worker moved (what crossed its sockets), docs/design.md accounting.
struct WireCounts {
  // Rows by kind, as the scheduler counts them (what ember-sim predicts): the plans'
  // pulls (with state, prefetched), pushes by kind, hits, flushed rows (evaluations,
  // checkpoints, the end) and replicated rows (fae's hot rows, a placement's replicated
  // tables: all-reduced every iteration, written back at flushes by worker 0). Not
  // counted: cold_pulls (the simulator's alone).
  scheduler::TrafficCounts rows;
  // Replicated rows loaded at the start; a resumed job's cached rows, pulled once before
  // its first iteration (Step::restore).
  std::uint64_t hot_load = 0, restored = 0;
  // Payload this worker put into the dense all-reduces: dense gradients, the loss and the
  // replicated rows' gradients (4 bytes a float; a ring moves about twice that per link).
  std::uint64_t allreduce_bytes = 0;
  scheduler::RowFormat format;  // the job's rows: the bytes below
  // What the transport carried per kind of request, headers included (PsClient::tally):
  // also the evaluation's pulls, not the final model dump's.
  ps::WireTally framed;
  // The same framed bytes and rows, and the all-reduces' payload, by where they went:
  // within this worker's host or across hosts (hosts.h, link_traffic).
  Links links;
  // Rows handed within the host by per-host aggregation (host_relay.h): pull.rows the
  // pulled rows this worker received from another, push_grad.rows the gradients it handed
  // to another; bytes the floats sent (out) and received (in), every phase and flush.
  ps::WireTally relay;
  // --scheduler-per-host: the eviction words' bytes this worker sent to and received
  // from the other workers (worker/src/eviction_exchange.h), payload only.
  std::uint64_t exchange_bytes_out = 0, exchange_bytes_in = 0;

  std::uint64_t pushes() const { return rows.pushes(); }
  // Payload per kind (scheduler::wire_bytes of `rows`: keys, trainer counts, floats;
  // what ember-sim predicts), replicated rows' write-backs in `flush`.
  scheduler::WireBytes bytes() const { return scheduler::wire_bytes(rows, format); }
  // The same payload by direction, the restored rows included: out to the PS (the pulls'
  // keys, gradients, values), in from it (the pulled rows).
  std::uint64_t bytes_out() const;
  std::uint64_t bytes_in() const;
};

// Where a worker's iterations spent their wall time, in seconds: the PS exchanges
// (sync pushes before the barrier; the barrier and the commit, which includes waiting
// for slower workers; write-backs, evictions and pulls; the full-set pushes after
// training), the model (gather, forward, backward), the dense all-reduce and optimizer
// step (with the row gradients scattered into the cache while the sum runs), and the
// local updates of the cached rows. Excludes waiting for the loader and the evaluation
// flushes.
struct PhaseTimes {
  double sync = 0, commit = 0, pull = 0, compute = 0, allreduce = 0, push = 0, update = 0;
  double total() const { return sync + commit + pull + compute + allreduce + push + update; }
};

struct TrainSummary {
  std::uint32_t rank = 0;
  WireCounts wire;
  PhaseTimes phases;
  std::uint64_t iterations = 0;
  double seconds = 0;             // training loop, wall
  double samples_per_s = 0;       // global samples per second
  double final_loss = 0;          // mean over the last iteration's global batch
  double auc = -1, logloss = -1;  // final evaluation (worker 0; -1 when none)
  // The job was stopped early (a PS shard or a worker got SIGTERM): the iteration it
  // stopped at, checkpointed, from which --resume goes on; 0 when it ran to --iterations.
  std::uint64_t stopped_at = 0;
  // The job's hosts, and the all-reduce payload this worker sent to another host (by the
  // algorithm: hosts.h; wire.links.cross_host.peer_out).
  std::uint32_t hosts = 1;
  std::uint64_t allreduce_cross_host_bytes = 0;
};

// Where worker `rank` writes its dense state of `iteration` under `dir`
// (worker-R-iter-NNNNNNNNN.pt: sorts by iteration; one file per worker, since hosts may
// share no filesystem, though the replicas are identical).
std::filesystem::path dense_checkpoint_file(const std::filesystem::path& dir, std::uint32_t rank, std::uint64_t iteration);

// Runs one worker to the end. Throws ConfigError / IoError / ProtocolError / Error.
TrainSummary run_worker(const TrainConfig& config);

// The single-process reference: the whole global batch in one process, the full
// embedding table in memory, the same initialization, data order, loss scaling and
// optimizers. Used by the equivalence test and `ember-bench e2e`.
struct ReferenceResult {
  std::vector<float> dense;    // parameters, flattened in named_parameters order
  std::vector<float> rows;     // num_keys x dim
  std::vector<double> losses;  // per iteration
  double seconds = 0;          // training loop, wall
};
ReferenceResult train_reference(const TrainConfig& config, const ps::OptimizerConfig& sparse, std::uint32_t dim);

// Reads a dump written by worker 0 (--dump-dir): dense parameters and rows.
struct ModelDump {
  std::vector<float> dense;
  std::vector<float> rows;
  std::uint32_t dim = 0;
};
ModelDump read_dump(const std::string& dir);

}  // namespace ember::worker
