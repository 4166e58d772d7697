// ember-worker: one training worker of a job (joins the control plane of ember-ps shard 0).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/signals.h"
#include "ember/monitor/exporter.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/worker/device.h"
#include "ember/worker/trainer.h"
#include "reference.h"

namespace {

using namespace ember;

// SIGTERM/SIGINT while training, with checkpoints: the job stops at a checkpoint a few
// iterations on, as on a PS shard's SIGTERM (a cluster manager that signals every process
// stops the job there too); a second signal, or one at another time, ends the process at
// once. Before any thread starts: they all inherit the blocked signals.
SignalThread stop_signals(worker::StopRequest& stop) {
  return SignalThread({SIGTERM, SIGINT}, [&stop](int sig) {
    if (stop.possible.load() && stop.signal.exchange(sig) == 0) {
      spdlog::warn("signal {}: the job stops at a checkpoint a few iterations on (a second signal stops this worker now)", sig);
      return;
    }
    spdlog::warn("signal {}: stopping now{}", sig,
                 stop.signal.load() != 0
                     ? ""
                     : " (a stop at a checkpoint needs --checkpoint-dir here and on the PS shards, and training under way)");
    // The control plane hears why (it names this worker only if no other member was
    // lost first); 0.2 s for the message to leave before the process ends.
    stop.ending(fmt::format("stopped by signal {} ({})", sig, strsignal(sig)));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    die_by_signal(sig);
  });
}

// --reference: the whole global batch in this process; one JSON line.
int run_reference(const worker::TrainConfig& c, const std::string& optimizer, float lr, std::uint32_t dim) {
  ps::OptimizerConfig sparse;
  sparse.kind = ps::parse_optimizer(optimizer);
  sparse.lr = lr;
  auto r = worker::train_reference(c, sparse, dim);
  const double samples = static_cast<double>(c.workers) * c.batch_per_worker * static_cast<double>(c.iterations);
  std::printf("{\"reference\":true,\"iterations\":%llu,\"seconds\":%.4f,\"samples_s\":%.1f,\"loss\":%.6f}\n",
              static_cast<unsigned long long>(c.iterations), r.seconds, samples / r.seconds, r.losses.empty() ? 0.0 : r.losses.back());
  return 0;
}

// One worker of a job, its metrics served on metrics_port (0: none).
int train(worker::TrainConfig& c, std::uint16_t metrics_port, const std::string& metrics_address) {
  std::unique_ptr<monitor::Exporter> exporter;
  if (metrics_port != 0) {
    exporter = std::make_unique<monitor::Exporter>(metrics_address.empty() ? c.gloo_host : metrics_address, metrics_port);
    c.exporter = exporter.get();
    spdlog::info("metrics at {}", exporter->url());
  }
  worker::TrainSummary s = worker::run_worker(c);
  spdlog::info("worker {} done: {} iterations in {:.1f} s, {:.0f} samples/s, rows pulled {}, pushed {} (grad {}, value {}, evict {}){}",
               s.rank, s.iterations, s.seconds, s.samples_per_s, s.wire.rows.pulls, s.wire.pushes(), s.wire.rows.push_grad,
               s.wire.rows.push_value, s.wire.rows.push_evict,
               s.auc >= 0 ? fmt::format(", AUC {:.4f}, logloss {:.4f}", s.auc, s.logloss) : std::string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ember;
  CLI::App app{"ember-worker: trains a CTR model on its share of every global batch, with a Herald-style scheduler"};
  worker::TrainConfig c;
  std::string token_file, log_level = "info", bottom = "512-256-64", top = "512-256", deep = "400-400-400";
  int heartbeat_ms = 10000, timeout_ms = 30000, join_timeout_ms = 120000;
  std::uint16_t metrics_port = 0;
  std::string metrics_address;
  add_config_option(app);
  app.add_option("--dataset", c.dataset, "ember-data dataset directory")->required();
  app.add_option("--coordinator", c.coordinator, "control plane endpoint of ember-ps shard 0 (tcp://host:port)");
  bool reference = false;
  std::uint32_t ref_dim = 16;
  std::string ref_optimizer = "sgd";
  float ref_lr = 0.01f;
  app.add_flag("--reference", reference,
               "train the whole global batch in this one process with the tables in memory (no PS, no scheduler): "
               "the baseline of the equivalence test and of the e2e benchmark; prints one JSON line");
  app.add_option("--dim", ref_dim, "--reference: embedding dimension (normally the PS's)")->capture_default_str();
  app.add_option("--optimizer", ref_optimizer, "--reference: sparse optimizer (normally the PS's)")->capture_default_str();
  app.add_option("--lr", ref_lr, "--reference: sparse learning rate (normally the PS's)")->capture_default_str();
  app.add_option("--token", c.token, "job token");
  app.add_option("--token-file", token_file, "read the job token from this file");
  app.add_option("--rank", c.rank, "this worker's rank (default: assigned at join)");
  scheduler::add_scheduler_options(app, c, scheduler::FlagsFor::kTraining);
  app.add_option("--policy", c.policy, "vanilla, laia, plan, herald, het:S, fae:F (hottest fraction F replicated on every worker)")
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, cuda or cuda:N (the embedding cache then lives in GPU memory)")->capture_default_str();
  app.add_option("--cache-backend", c.cache_backend, "auto, host (CPU memory, the PS's optimizer code) or tensor (device memory)")
      ->capture_default_str();
  app.add_option("--transport", c.transport, "data plane to the PS shards: tcp or rdma")->capture_default_str();
  app.add_option("--ps-connections", c.ps_connections, "data connections per PS shard (keys spread over them)")->capture_default_str();
  app.add_option("--rdma-slot-mib", c.rdma_slot_mib, "RDMA: largest reply (pulled rows) in MiB")->capture_default_str();
  app.add_option("--socket-buffer-kib", c.socket_buffer_kib, "TCP: send/receive buffer per connection in KiB (0: kernel autotuning)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 21));
  app.add_option("--model", c.model.kind, "wide-deep, deepfm, dcn, dlrm")->capture_default_str();
  app.add_option("--bottom-mlp", bottom, "dlrm bottom MLP (then the embedding dim)")->capture_default_str();
  app.add_option("--top-mlp", top, "dlrm top MLP (then 1)")->capture_default_str();
  app.add_option("--deep-mlp", deep, "wide-deep / deepfm / dcn deep MLP")->capture_default_str();
  app.add_option("--cross-layers", c.model.cross_layers, "dcn cross layers")->capture_default_str();
  app.add_option("--iterations", c.iterations, "global batches to train")->capture_default_str();
  app.add_option("--dense-optimizer", c.dense_optimizer, "sgd or adagrad")->capture_default_str();
  app.add_option("--dense-lr", c.dense_lr, "dense learning rate")->capture_default_str();
  app.add_option("--eval-every", c.eval_every, "evaluate every N iterations (0: only at the end)")->capture_default_str();
  app.add_flag("--overlap-allreduce", c.overlap_allreduce,
               "sum the dense gradients over the workers while the PS exchange runs (waited for before the next forward pass)");
  app.add_option("--eval-samples", c.eval_samples, "validation samples per evaluation (0: all)")->capture_default_str();
  app.add_option("--torch-threads", c.torch_threads, "LibTorch intra-op threads")->capture_default_str();
  app.add_option("--progress-every", c.progress_every, "iterations between progress lines (worker 0)")->capture_default_str();
  app.add_option("--metrics", c.metrics_file, "JSON lines: one per iteration, evaluation and the summary");
  app.add_option("--dump-dir", c.dump_dir, "worker 0 writes the final dense weights and every embedding row here");
  app.add_option("--checkpoint-dir", c.checkpoint_dir,
                 "write this worker's dense model and optimizer here at every PS checkpoint (ember-ps --checkpoint-every), for --resume; "
                 "with it, SIGTERM/SIGINT stops the job at a checkpoint a few iterations on (a second signal stops now)");
  app.add_option("--keep-checkpoints", c.keep_checkpoints, "keep this worker's newest N dense checkpoints (0: all)")->capture_default_str();
  app.add_flag("--resume", c.resume,
               "continue from the iteration the PS shards restored (ember-ps --restore), with the dense state of that iteration from "
               "--checkpoint-dir");
  app.add_option("--metrics-port", metrics_port, "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: none)")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address, "address the metrics are served on (default: the --gloo-host address)");
  app.add_option("--gloo-host", c.gloo_host, "address the dense all-reduce (Gloo) binds on")->capture_default_str();
  app.add_option("--host", c.host, "the host this worker runs on, as the job names it (default: this machine's host name)");
  app.add_option("--allreduce", c.allreduce,
                 "dense all-reduce: flat (one ring over every worker) or hierarchical (within each host, across the hosts' "
                 "leaders, back within the host)")
      ->check(CLI::IsMember({"flat", "hierarchical"}))
      ->capture_default_str();
  app.add_flag("--host-aggregation", c.host_aggregation,
               "per-host aggregation: a row of a PS shard on another host crosses once per host and phase (pulled by one worker "
               "of the host and handed to the others; gradients summed within the host and pushed once)");
  app.add_option("--timeout-ms", timeout_ms, "PS request timeout")->capture_default_str();
  app.add_option("--join-timeout-ms", join_timeout_ms, "wait this long for the job to form")->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", heartbeat_ms, "silence after which a peer is reported dead")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  if (const int status = parse_command_line(app, argc, argv, "ember-worker"); status >= 0) return status;
  return guarded_main("ember-worker", [&] {
    setup_logging(log_level);
    worker::StopRequest stop;
    c.stop = &stop;
    const SignalThread signals = stop_signals(stop);
    if (!token_file.empty()) c.token = read_secret_file(token_file, "--token-file");
    c.model.bottom = worker::parse_layers(bottom, "--bottom-mlp");
    c.model.top = worker::parse_layers(top, "--top-mlp");
    c.model.deep = worker::parse_layers(deep, "--deep-mlp");
    c.timeout = std::chrono::milliseconds(timeout_ms);
    c.heartbeat_timeout = std::chrono::milliseconds(heartbeat_ms);
    c.join_timeout = std::chrono::milliseconds(join_timeout_ms);
    spdlog::info("{}", worker::describe(worker::select_device(false)));
    if (reference) return run_reference(c, ref_optimizer, ref_lr, ref_dim);
    return train(c, metrics_port, metrics_address);
  });
}
