// ember-ps: one parameter-server shard serving pulls and pushes over TCP or RDMA. Reads
// the flags into a DaemonConfig and runs a PsDaemon (ps/src/daemon.h).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../src/daemon.h"
#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/ps/checkpoints.h"

namespace {

using namespace ember;
namespace fs = std::filesystem;

// The flags: the daemon's configuration, and what is resolved into it once parsed.
struct Flags {
  ps::DaemonConfig c;
  std::string optimizer = "sgd", listen = "127.0.0.1:0", token_file, dataset, allocate = "lazy", verify_dir, log_level = "info";
  std::string store_dir;
  double ram_budget_mb = 0;
  bool no_hints = false;
};

std::uint64_t rows_of_dataset(const fs::path& dir) {
  auto path = dir / "manifest.json";
  try {
    auto j = nlohmann::json::parse(read_file(path));
    std::uint64_t n = 0;
    for (const auto& t : j.at("tables")) n += t.at("rows").get<std::uint64_t>();
    return n;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path.string() + ": " + e.what());
  }
}

void add_store_options(CLI::App& app, Flags& f) {
  ps::StoreConfig& sc = f.c.store;
  app.add_option("--shard", sc.shard, "this shard's index")->capture_default_str();
  app.add_option("--shards", sc.shards, "number of shards")->capture_default_str();
  auto* nk = app.add_option("--num-keys", sc.num_keys, "rows of all tables");
  app.add_option("--dataset", f.dataset, "take the rows of all tables from an ember-data dataset")->excludes(nk);
  app.add_option("--dim", sc.dim, "embedding dimension")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd, adagrad, rowwise-adagrad, adam")->capture_default_str();
  app.add_option("--lr", sc.optimizer.lr, "learning rate")->capture_default_str();
  app.add_option("--weight-decay", sc.optimizer.weight_decay, "L2 weight decay")->capture_default_str();
  app.add_option("--seed", sc.seed, "initial rows from (seed, key)")->capture_default_str();
  app.add_option("--allocate", f.allocate, "rows allocated 'lazy' (on first use) or 'upfront' (all at start)")->capture_default_str();
  app.add_option("--store-dir", f.store_dir,
                 "keep the rows in a file under DIR on local disk, at most --ram-budget-mb of them in memory (docs/disk-tier.md)");
  app.add_flag("--no-hints", f.no_hints,
               "with --store-dir: do not ask the workers to name rows ahead (the tier reads a row when first asked for it)");
  app.add_option("--ram-budget-mb", f.ram_budget_mb,
                 "with --store-dir: MB of rows and optimizer state kept in memory, at most (0.0625 and up)");
  app.add_option("--tier-io-threads", sc.tier.io_threads,
                 "with --store-dir: threads reading and writing rows at once (the disk's queue depth)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
}

void add_serving_options(CLI::App& app, Flags& f) {
  ps::DaemonConfig& c = f.c;
  app.add_option("--listen", f.listen, "host:port (port 0: any free port)")->capture_default_str();
  app.add_option("--host", c.host,
                 "the host this shard runs on, as the job's workers name theirs (ember-worker --host; default: this machine's name): "
                 "its traffic counts as within a host or across hosts");
  app.add_option("--port-file", c.port_file, "write the port listened on to this file (atomically)");
  app.add_option("--token", c.token, "job token required from every peer");
  app.add_option("--token-file", f.token_file, "read the job token from this file");
  app.add_option("--io-threads", c.io_threads, "I/O threads (TCP)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--apply-commits", c.apply_commits,
                 "where a commit's optimizer pass runs: 'handler' (each row on the handler thread that received its gradient, after "
                 "that thread's next ack), 'applier' (threads of their own, leaving the handlers to their connections), or 'auto' (the "
                 "applier for rows of 1 KB and up, value and state, when the I/O and applier threads take at most half the cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "handler", "applier"}));
  app.add_option("--apply-threads", c.apply_threads,
                 "applier threads (--apply-commits applier, and checkpoint commits; 0: as many as --io-threads)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  app.add_option("--socket-buffer-kib", c.socket_buffer_kib, "TCP: send/receive buffer per connection in KiB (0: kernel autotuning)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 21));
  app.add_option("--transport", c.transport, "data plane: tcp or rdma (ibverbs, rdma_cm port space)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "rdma"}));
  app.add_option("--rdma-slot-mib", c.rdma_slot_mib, "RDMA: largest request in MiB (a slot of the receive ring)")->capture_default_str();
}

void add_checkpoint_options(CLI::App& app, Flags& f) {
  ps::DaemonConfig& c = f.c;
  app.add_option("--restore", c.restore_dir,
                 "resume from a checkpoint (written by any number of shards): its directory, or a --checkpoint-dir (then its newest whole "
                 "checkpoint)");
  app.add_option("--verify-checkpoint", f.verify_dir,
                 "check a checkpoint's files in full (checksums), or pick a --checkpoint-dir's newest whole checkpoint that verifies, "
                 "as --restore would; print its directory and exit (3, naming each file and why, when none verifies)");
  app.add_option("--checkpoint-dir", c.checkpoint_dir,
                 "where checkpoints go; SIGUSR1 asks for one at an iteration boundary a few iterations on (the workers flush for it)");
  app.add_flag("--checkpoint-on-exit", c.checkpoint_on_exit,
               "write a checkpoint on SIGTERM/SIGINT; in a job with workers, first stop the job at a checkpoint a few iterations on "
               "(the workers flush for it and finish; a second signal stops now)");
  app.add_option("--stop-wait-s", c.stop_wait_s,
                 "with --checkpoint-on-exit in a job: how long SIGTERM/SIGINT waits for the workers to reach the stopping checkpoint "
                 "(0: stop at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--drain-ms", c.drain_ms, "on SIGTERM/SIGINT: how long requests in flight may take to finish")->capture_default_str();
  app.add_option("--checkpoint-every", c.checkpoint_every, "also checkpoint after committing every N iterations")->capture_default_str();
  app.add_option("--keep-checkpoints", c.keep_checkpoints,
                 "keep the newest N whole checkpoints (and newer ones, and those they add to), remove older ones (0: keep all)")
      ->capture_default_str();
  app.add_option("--checkpoint-full-every", c.checkpoint_full_every,
                 "one checkpoint in N holds every row; those between hold the rows changed since the one before (incremental; "
                 "0: 8 with --store-dir, else 1)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
}

void add_job_options(CLI::App& app, Flags& f) {
  ps::DaemonConfig& c = f.c;
  app.add_option("--stats-interval", c.stats_interval, "seconds between stats lines (0: none)")->capture_default_str();
  app.add_option("--stats-file", c.stats_file, "JSON stats, rewritten atomically at every stats line");
  app.add_option("--coordinator", c.coordinator,
                 "join a job's control plane at this ZeroMQ endpoint (tcp://host:port); shard 0 runs the coordinator there "
                 "(port 0: any free port, see --coordinator-file)");
  app.add_option("--coordinator-file", c.coordinator_file, "shard 0: write the coordinator's endpoint to this file (atomically)");
  app.add_option("--failure-file", c.failure_file,
                 "shard 0: when the job fails, write the control plane's word on it here (JSON: the member that failed first and "
                 "the cause; atomically)");
  app.add_option("--summary-file", c.summary_file,
                 "at exit, write this shard's totals here (JSON: requests, rows served and what was served by kind, peers dropped, "
                 "checkpoints written and "
                 "failed; atomically)");
  app.add_option("--max-connections", c.max_connections, "TCP: open data connections at most (more are refused at accept)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--hello-timeout-ms", c.hello_timeout_ms, "TCP: a data connection that has not authenticated by then is closed")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600000));
  app.add_option("--workers", c.workers, "workers of the job (with --coordinator)");
  app.add_option("--heartbeat-timeout-ms", c.heartbeat_timeout_ms, "silence after which a peer is reported dead")->capture_default_str();
  app.add_option("--metrics-port", c.metrics_port, "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: none)")
      ->capture_default_str();
  app.add_option("--metrics-address", c.metrics_address, "address the metrics are served on (default: the --listen host)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error, off")->capture_default_str();
}

// --verify-checkpoint: no shard, only the files.
int verify_checkpoint(const std::string& dir) {
  const ps::RestorePlan plan = ps::plan_restore(dir);
  for (const std::string& why : plan.skipped) spdlog::warn("--verify-checkpoint: passing over {}", why);
  if (!plan.verified) {
    for (const fs::path& file : plan.files) ps::verify_checkpoint_file(file);
  }
  std::printf("%s\n", plan.dir.string().c_str());
  return 0;
}

// Checks the flags and resolves them into f.c: the token, the rows, the optimizer.
void resolve(Flags& f) {
  ps::DaemonConfig& c = f.c;
  ps::StoreConfig& sc = c.store;
  if (c.token.empty() && f.token_file.empty()) throw ConfigError("a job token is required (--token or --token-file)");
  if (!f.token_file.empty()) c.token = read_secret_file(f.token_file, "--token-file");
  if (!f.dataset.empty()) sc.num_keys = rows_of_dataset(f.dataset);
  if (sc.num_keys == 0) throw ConfigError("give --num-keys or --dataset");
  if ((c.checkpoint_on_exit || c.checkpoint_every > 0) && c.checkpoint_dir.empty()) {
    throw ConfigError("--checkpoint-on-exit and --checkpoint-every need --checkpoint-dir");
  }
  sc.optimizer.kind = ps::parse_optimizer(f.optimizer);
  c.optimizer_name = f.optimizer;
  c.listen = ps::parse_address(f.listen);
  if (!c.coordinator.empty() && c.workers == 0) throw ConfigError("--coordinator needs --workers (the job's worker count)");
  if (sc.shard >= sc.shards)
    throw ConfigError("--shard " + std::to_string(sc.shard) + " is not below --shards " + std::to_string(sc.shards));
  if (f.allocate != "lazy" && f.allocate != "upfront") throw ConfigError("--allocate '" + f.allocate + "': choose lazy or upfront");
  sc.allocate_up_front = f.allocate == "upfront";
  if (f.store_dir.empty() != (f.ram_budget_mb == 0)) throw ConfigError("--store-dir and --ram-budget-mb go together");
  if (f.ram_budget_mb < 0 || f.ram_budget_mb > 1e9)
    throw ConfigError("--ram-budget-mb " + std::to_string(f.ram_budget_mb) + ": out of range");
  if (c.checkpoint_full_every == 0) c.checkpoint_full_every = f.store_dir.empty() ? 1 : 8;
  sc.track_changes = c.checkpoint_full_every > 1 && !c.checkpoint_dir.empty();
  if (!f.store_dir.empty()) {
    sc.tier.dir = f.store_dir;
    sc.tier.hints = !f.no_hints;
    sc.tier.ram_budget_bytes = static_cast<std::uint64_t>(f.ram_budget_mb * 1048576.0);
    // What the tier's file holds: another table's directory is refused (disk_tier.h).
    std::error_code ec;
    const fs::path data = f.dataset.empty() ? fs::path() : fs::weakly_canonical(f.dataset, ec);
    sc.tier.table = "dataset " + (data.empty() ? std::string("(none)") : data.string()) + ", " + std::to_string(sc.num_keys) +
                    " keys, dim " + std::to_string(sc.dim) + ", " + f.optimizer;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-ps: a parameter-server shard (embedding rows + optimizer state) over TCP or RDMA"};
  Flags f;
  add_config_option(app);
  add_store_options(app, f);
  add_serving_options(app, f);
  add_checkpoint_options(app, f);
  add_job_options(app, f);
  if (const int status = parse_command_line(app, argc, argv, "ember-ps"); status >= 0) return status;
  return guarded_main("ember-ps", [&] {
    setup_logging(f.log_level);
    if (!f.verify_dir.empty()) return verify_checkpoint(f.verify_dir);
    resolve(f);
    ps::PsDaemon daemon(std::move(f.c));
    return daemon.run();
  });
}
