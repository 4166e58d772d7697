// A worker's configuration (ember-worker's flags, read once): the scheduler's options it
// extends, the model, the job and its transport. Free of LibTorch, like every header a
// module outside worker/ includes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "ember/scheduler/scheduler_config.h"
#include "ember/transport/job_connection.h"
#include "ember/worker/model_config.h"

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

// How this worker reaches its job: the control plane (ember-ps shard 0), the PS data
// plane, and the dense collective's and host tier's Gloo groups. What the job's
// connections (job/, host/host_channels) take of the configuration. The coordinator,
// token, transport, buffers, heartbeat timeout and host are a JobConnection's, whose
// flags ember-ps takes too.
struct ConnectOptions : transport::JobConnection {
  int rank = -1;                             // -1: assigned at join
  std::uint32_t ps_connections = 1;          // data connections per PS shard
  std::string gloo_host = "127.0.0.1";       // interface the dense collective binds on
  std::string allreduce = "flat";            // flat (one ring) or hierarchical (host, leaders, host)
  std::chrono::milliseconds timeout{30000};  // PS requests
  std::chrono::milliseconds join_timeout{120000};
};

// The scheduler's options (workers, batch_per_worker, cache_ratio, policy, seed, shuffle,
// iterations, threads, lookahead, eviction, prefetch, refine_allocation, placement:
// scheduler_config.h) are the job's: make_scheduler_config reads them from here as they
// are, with a training job's defaults (4 workers of herald for 100 iterations).
struct TrainConfig : scheduler::SchedulerOptions, ConnectOptions {
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
  // Sum the dense gradients over the workers while the PS exchange runs: the all-reduce
  // of iteration t starts after its backward pass and is waited for before t+1's forward
  // pass (the same model; an iteration's progress line then shows the loss before it).
  bool overlap_allreduce = false;
  // Progressive validation (report/progressive.h): AUC and log loss of each global batch
  // scored before it trains, over the last N iterations (0: off). Its scores and labels
  // join the dense all-reduce: 2 floats a sample of the global batch.
  std::uint64_t progressive_window = 0;
  std::string device = "cpu";          // cpu, cuda or cuda:N (a CUDA build of LibTorch)
  std::string cache_backend = "auto";  // host (CPU memory) or tensor (device memory); auto: by device
  int torch_threads = 1;
  std::uint64_t progress_every = 10;
  std::string metrics_file;  // JSON lines (one per iteration, evaluation, summary)
  // A restarted job's record, written by its launcher (JSON: "restarts",
  // "iterations_recomputed", "lost_at" in Unix seconds): reported in the summary and on
  // /metrics with the time from the loss to this process's first iteration. Empty: none.
  std::string restart_record;
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
  // Per-host aggregation of row traffic (host/host_plans.h): rows of a shard on another host
  // cross once per host and phase, handed within the host.
  bool host_aggregation = false;
};

}  // namespace ember::worker
