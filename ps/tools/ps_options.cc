#include "ps_options.h"

#include <iterator>

#include "ember/transport/job_connection_options.h"

namespace ember::ps {

namespace {

using Decl = OptionDecl<Flags>;

template <class T>
Decl flag(const char* name, T Flags::*member, const char* help) {
  return field_option<Flags>(name, member, help, kPsProgram);
}

// A declaration of a part of Flags (the daemon's configuration, its store, the store's
// optimizer or disk tier) as one of Flags.
template <class T>
Decl daemon_flag(const char* name, T DaemonConfig::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kPsProgram, [](auto& f) -> auto& { return f.c; });
}
template <class T>
Decl store_flag(const char* name, T StoreConfig::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kPsProgram, [](auto& f) -> auto& { return f.c.store; });
}

void append(std::vector<Decl>& to, std::vector<Decl> more) { std::move(more.begin(), more.end(), std::back_inserter(to)); }

// The shared declarations of a part of Flags.
template <class Part, class GetPart>
std::vector<Decl> shared(const std::vector<OptionDecl<Part>>& decls, GetPart part) {
  std::vector<Decl> out;
  for (const OptionDecl<Part>& d : decls) out.push_back(rebind_option<Flags>(d, part));
  return out;
}

// The store: its place in the job, its rows and optimizer, and its disk tier.
std::vector<Decl> store_options() {
  std::vector<Decl> d = {
      store_flag("--shard", &StoreConfig::shard, "this shard's index"),
      store_flag("--shards", &StoreConfig::shards, "number of shards"),
      store_flag("--num-keys", &StoreConfig::num_keys, "rows of all tables").default_hidden(),
      flag("--dataset", &Flags::dataset, "take the rows of all tables from an ember-data dataset"),
      flag("--slots-per-shard", &Flags::slots_per_shard,
           "a dataset of hashed ids, or no --dataset (a job on a stream): dynamic tables, of which this shard holds at most this "
           "many rows at once (--shard-max-rows and one global batch's ids fit)")
          .checked(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32)),
  };
  append(d, shared(
                row_options(), [](auto& f) -> auto& { return f.rows; }));
  append(d, {
                member_option<Flags>(
                    "--weight-decay", &OptimizerConfig::weight_decay, "L2 weight decay", kPsProgram,
                    [](auto& f) -> auto& { return f.c.store.optimizer; }),
                store_flag("--seed", &StoreConfig::seed, "initial rows from (seed, key)"),
                flag("--allocate", &Flags::allocate, "rows allocated 'lazy' (on first use) or 'upfront' (all at start)"),
                flag("--store-dir", &Flags::store_dir,
                     "keep the rows in a file under DIR on local disk, at most --ram-budget-mb of them in memory (docs/disk-tier.md)"),
                flag("--no-hints", &Flags::no_hints,
                     "with --store-dir: do not ask the workers to name rows ahead (the tier reads a row when first asked for it)"),
                flag("--ram-budget-mb", &Flags::ram_budget_mb,
                     "with --store-dir: MB of rows and optimizer state kept in memory, at most (0.0625 and up)")
                    .default_hidden(),
                member_option<Flags>(
                    "--tier-io-threads", &TierConfig::io_threads,
                    "with --store-dir: threads reading and writing rows at once (the disk's queue depth)", kPsProgram,
                    [](auto& f) -> auto& { return f.c.store.tier; })
                    .checked(CLI::Range(1, 64)),
            });
  return d;
}

// Serving: the address, the job connection (shared with ember-worker), the threads.
std::vector<Decl> serving_options() {
  std::vector<Decl> d = {
      flag("--listen", &Flags::listen, "host:port (port 0: any free port)"),
      daemon_flag("--port-file", &DaemonConfig::port_file, "write the port listened on to this file (atomically)"),
  };
  append(d, shared(
                lift_options<DaemonConfig>(transport::job_connection_options()), [](auto& f) -> auto& { return f.c; }));
  append(d, {
                daemon_flag("--io-threads", &DaemonConfig::io_threads, "I/O threads (TCP)").checked(CLI::Range(1, 256)),
                daemon_flag("--apply-commits", &DaemonConfig::apply_commits,
                            "where a commit's optimizer pass runs: 'handler' (each row on the handler thread that received its "
                            "gradient, after that thread's next ack), 'applier' (threads of their own, leaving the handlers to "
                            "their connections), or 'auto' (the applier for rows of 1 KB and up, value and state, when the I/O "
                            "and applier threads take at most half the cores)")
                    .checked(CLI::IsMember({"auto", "handler", "applier"})),
                daemon_flag("--apply-threads", &DaemonConfig::apply_threads,
                            "applier threads (--apply-commits applier, and checkpoint commits; 0: as many as --io-threads)")
                    .checked(CLI::Range(0u, 256u)),
            });
  return d;
}

std::vector<Decl> checkpoint_options() {
  return {
      daemon_flag("--restore", &DaemonConfig::restore_dir,
                  "resume from a checkpoint (written by any number of shards): its directory, or a --checkpoint-dir (then its "
                  "newest whole checkpoint)"),
      flag("--verify-checkpoint", &Flags::verify_dir,
           "check a checkpoint's files in full (checksums), or pick a --checkpoint-dir's newest whole checkpoint that verifies, "
           "as --restore would; print its directory and exit (3, naming each file and why, when none verifies)"),
      daemon_flag("--checkpoint-dir", &DaemonConfig::checkpoint_dir,
                  "where checkpoints go; SIGUSR1 asks for one at an iteration boundary a few iterations on (the workers flush "
                  "for it)"),
      daemon_flag("--checkpoint-on-exit", &DaemonConfig::checkpoint_on_exit,
                  "write a checkpoint on SIGTERM/SIGINT; in a job with workers, first stop the job at a checkpoint a few "
                  "iterations on (the workers flush for it and finish; a second signal stops now)"),
      daemon_flag("--stop-wait-s", &DaemonConfig::stop_wait_s,
                  "with --checkpoint-on-exit in a job: how long SIGTERM/SIGINT waits for the workers to reach the stopping "
                  "checkpoint (0: stop at once)")
          .checked(CLI::Range(0.0, 86400.0)),
      daemon_flag("--drain-ms", &DaemonConfig::drain_ms, "on SIGTERM/SIGINT: how long requests in flight may take to finish"),
      daemon_flag("--checkpoint-every", &DaemonConfig::checkpoint_every, "also checkpoint after committing every N iterations"),
      rebind_option<Flags>(
          keep_checkpoints_option<DaemonConfig>(&DaemonConfig::keep_checkpoints), [](auto& f) -> auto& { return f.c; }),
      daemon_flag("--checkpoint-full-every", &DaemonConfig::checkpoint_full_every,
                  "one checkpoint in N holds every row; those between hold the rows changed since the one before "
                  "(incremental; 0: 8 with --store-dir, else 1)")
          .checked(CLI::Range(0, 1000000)),
      daemon_flag("--checkpoint-every-s", &DaemonConfig::checkpoint_every_s,
                  "shard 0 also asks for a checkpoint every T seconds (as SIGUSR1 does: at an iteration a few on, the "
                  "workers flush for it); with --serving-deltas, a version for ember-serve every T seconds")
          .checked(CLI::Range(0.0, 1e7)),
      daemon_flag("--serving-deltas", &DaemonConfig::serving_deltas,
                  "with each checkpoint, also write each shard's rows changed since its last one (values only) for "
                  "ember-serve to apply"),
  };
}

// The job: stats, the control plane's files, connections, metrics, logging.
std::vector<Decl> job_options() {
  return {
      daemon_flag("--stats-interval", &DaemonConfig::stats_interval, "seconds between stats lines (0: none)"),
      daemon_flag("--stats-file", &DaemonConfig::stats_file, "JSON stats, rewritten atomically at every stats line"),
      daemon_flag("--coordinator-file", &DaemonConfig::coordinator_file,
                  "shard 0: write the coordinator's endpoint to this file (atomically)"),
      daemon_flag("--failure-file", &DaemonConfig::failure_file,
                  "shard 0: when the job fails, write the control plane's word on it here (JSON: the member that failed first "
                  "and the cause; atomically)"),
      daemon_flag("--summary-file", &DaemonConfig::summary_file,
                  "at exit, write this shard's totals here (JSON: requests, rows served and what was served by kind, peers "
                  "dropped, checkpoints written and failed; atomically)"),
      daemon_flag("--max-connections", &DaemonConfig::max_connections, "TCP: open data connections at most (more are refused at accept)")
          .checked(CLI::Range(1u, 1u << 20)),
      daemon_flag("--hello-timeout-ms", &DaemonConfig::hello_timeout_ms,
                  "TCP: a data connection that has not authenticated by then is closed")
          .checked(CLI::Range(10, 3600000)),
      daemon_flag("--workers", &DaemonConfig::workers, "workers of the job (with --coordinator)").default_hidden(),
      daemon_flag("--metrics-port", &DaemonConfig::metrics_port, "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: none)"),
      daemon_flag("--metrics-address", &DaemonConfig::metrics_address, "address the metrics are served on (default: the --listen host)"),
      flag("--log-level", &Flags::log_level, "trace, debug, info, warn, error, off"),
  };
}

std::vector<Decl> declare() {
  std::vector<Decl> d = store_options();
  append(d, serving_options());
  append(d, checkpoint_options());
  append(d, job_options());
  return d;
}

}  // namespace

const std::vector<OptionDecl<Flags>>& ps_options() {
  static const std::vector<Decl> decls = declare();  // immutable after its first use
  return decls;
}

void add_ps_options(CLI::App& app, Flags& f) {
  add_options(app, ps_options(), f, kPsProgram);
  // One of them gives the rows of all tables.
  app.get_option("--dataset")->excludes(app.get_option("--num-keys"));
}

}  // namespace ember::ps
