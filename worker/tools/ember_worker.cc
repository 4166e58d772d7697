// ember-worker: one training worker of a job (joins the control plane of ember-ps shard 0).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ember/common/blas_kernels.h"
#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/signals.h"
#include "ember/monitor/exporter.h"
#include "ember/ps/row_options.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/transport/job_connection.h"
#include "ember/worker/device.h"
#include "ember/worker/trainer.h"
#include "ember/worker/worker_options.h"
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
// Dynamic tables (hashed ids) train on the slots of `slots.shards` shards, as the job's.
int run_reference(const worker::TrainConfig& c, const ps::RowSettings& rows, worker::ReferenceSlots slots) {
  if ((slots.shards == 0) != (slots.slots_per_shard == 0))
    throw ConfigError("--reference-shards and --reference-slots-per-shard go together (a dataset of hashed ids: the job's PS shards)");
  ps::OptimizerConfig sparse;
  sparse.kind = ps::parse_optimizer(rows.optimizer);
  sparse.lr = rows.lr;
  auto r = worker::train_reference(c, sparse, rows.dim, slots);
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
  use_the_cpus_blas_kernels(argv);  // first: it may exec this program again
  CLI::App app{"ember-worker: trains a CTR model on its share of every global batch, with a Herald-style scheduler"};
  worker::TrainConfig c;
  std::string log_level = "info";
  std::uint16_t metrics_port = 0;
  std::string metrics_address;
  add_config_option(app);
  // Every option of the job (worker/src/job/worker_options.cc); below, this program's own.
  worker::add_worker_options(app, c);
  bool reference = false;
  ps::RowSettings reference_rows;  // a job's are the PS shards'
  app.add_flag("--reference", reference,
               "train the whole global batch in this one process with the tables in memory (no PS, no scheduler): "
               "the baseline of the equivalence test and of the e2e benchmark; prints one JSON line");
  add_options(app, ps::row_options(), reference_rows, kWorkerProgram);  // --dim, --optimizer, --lr: ember-ps's too
  worker::ReferenceSlots reference_slots;
  app.add_option("--reference-shards", reference_slots.shards,
                 "with --reference on a dataset of hashed ids: the job's PS shards, whose slots the dynamic tables take")
      ->check(CLI::Range(1u, 65535u));
  app.add_option("--reference-slots-per-shard", reference_slots.slots_per_shard,
                 "with --reference on a dataset of hashed ids: the job's ember-ps --slots-per-shard")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{0xfffffffe}));
  app.add_option("--metrics-port", metrics_port, "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: none)")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address, "address the metrics are served on (default: the --gloo-host address)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  // Before parsing: it needs no --dataset.
  app.add_flag_callback(
      "--options-json",
      [&c] {
        std::printf("%s\n", worker::worker_options_json(c).c_str());
        throw CLI::Success();
      },
      "print every job option as JSON (flag, kind, default, help, agreed, setting; the launchers read it) and exit");
  if (const int status = parse_command_line(app, argc, argv, "ember-worker"); status >= 0) return status;
  return guarded_main("ember-worker", [&] {
    setup_logging(log_level);
    worker::StopRequest stop;
    c.stop = &stop;
    const SignalThread signals = stop_signals(stop);
    transport::resolve_token(c);
    if (c.model.scripted()) worker::check_model_file(c.model.file);  // before the job forms
    spdlog::info("{}", worker::describe(worker::select_device(false)));
    spdlog::info("{}", describe(blas_info()));
    if (reference) return run_reference(c, reference_rows, reference_slots);
    if (reference_slots.shards != 0 || reference_slots.slots_per_shard != 0)
      throw ConfigError("--reference-shards and --reference-slots-per-shard go with --reference");
    return train(c, metrics_port, metrics_address);
  });
}
