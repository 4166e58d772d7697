// ember-ps: one parameter-server shard serving pulls and pushes over TCP or RDMA.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/process.h"
#include "ember/common/signals.h"
#include "ember/monitor/exporter.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/job_config.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/ps_service.h"
#include "ember/transport/control.h"
#include "ember/transport/rdma.h"
#include "ember/transport/transport.h"
#include "ps_metrics.h"

namespace {

using namespace ember;
namespace fs = std::filesystem;

// Seconds the exit checkpoint waits for the other shards' word (with a control plane).
constexpr double kExitCheckpointWait = 5.0;
// The same for the shard that hosts the coordinator while another shard is still in the
// job: that one may still be writing its checkpoint, and once the coordinator is gone it
// cannot learn of this shard's file, nor this shard of its. (Under the launcher's 30 s
// for the shards to stop.)
constexpr double kCoordinatorExitCheckpointWait = 20.0;

// Checkpoint records on the control plane's board (job_config.h): the shards' files, the
// shards' part whole, and the workers' dense states, by which checkpoints are pruned.
ps::CheckpointPeers peers_over(transport::ControlMember& member, const std::string& here, std::uint32_t workers) {
  ps::CheckpointPeers p;
  p.here = here;
  p.announce = [&member](std::int64_t it, std::uint32_t shard, const std::string& record) {
    member.publish(ps::checkpoint_record_key(it, shard), record);
  };
  p.record_of = [&member](std::int64_t it, std::uint32_t shard) { return member.try_lookup(ps::checkpoint_record_key(it, shard)); };
  p.workers_done = [&member, workers](std::int64_t it) {
    return ps::dense_states_ok([&member](const std::string& key) { return member.try_lookup(key); }, it, workers);
  };
  p.on_whole = [&member](std::int64_t it) { member.publish(ps::shards_whole_key(it), "1"); };
  return p;
}

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

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
std::uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-ps: a parameter-server shard (embedding rows + optimizer state) over TCP or RDMA"};
  ps::StoreConfig sc;
  std::string optimizer = "sgd", listen = "127.0.0.1:0", token, token_file, port_file, dataset, restore_dir, checkpoint_dir,
              log_level = "info", stats_file;
  int io_threads = 2;
  std::string apply_commits = "auto";
  std::uint32_t apply_threads = 0;
  std::string transport_kind = "tcp";
  std::uint32_t rdma_slot_mib = 4, socket_buffer_kib = 0;
  double stats_interval = 10;
  int drain_ms = 5000;
  std::string allocate = "lazy";
  bool checkpoint_on_exit = false;
  double stop_wait_s = 60;
  std::uint64_t checkpoint_every = 0;
  std::size_t keep_checkpoints = 3;
  std::string coordinator, coordinator_file, failure_file, summary_file;
  std::uint32_t max_connections = 1024;
  int hello_timeout_ms = 10000;
  std::uint32_t workers = 0;
  int heartbeat_timeout_ms = 10000;
  std::uint16_t metrics_port = 0;
  std::string metrics_address;
  add_config_option(app);
  app.add_option("--shard", sc.shard, "this shard's index")->capture_default_str();
  app.add_option("--shards", sc.shards, "number of shards")->capture_default_str();
  auto* nk = app.add_option("--num-keys", sc.num_keys, "rows of all tables");
  app.add_option("--dataset", dataset, "take the rows of all tables from an ember-data dataset")->excludes(nk);
  app.add_option("--dim", sc.dim, "embedding dimension")->capture_default_str();
  app.add_option("--optimizer", optimizer, "sgd, adagrad, rowwise-adagrad, adam")->capture_default_str();
  app.add_option("--lr", sc.optimizer.lr, "learning rate")->capture_default_str();
  app.add_option("--weight-decay", sc.optimizer.weight_decay, "L2 weight decay")->capture_default_str();
  app.add_option("--seed", sc.seed, "initial rows from (seed, key)")->capture_default_str();
  app.add_option("--allocate", allocate, "rows allocated 'lazy' (on first use) or 'upfront' (all at start)")->capture_default_str();
  app.add_option("--listen", listen, "host:port (port 0: any free port)")->capture_default_str();
  app.add_option("--port-file", port_file, "write the port listened on to this file (atomically)");
  app.add_option("--token", token, "job token required from every peer");
  app.add_option("--token-file", token_file, "read the job token from this file");
  app.add_option("--io-threads", io_threads, "I/O threads (TCP)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--apply-commits", apply_commits,
                 "where a commit's optimizer pass runs: 'handler' (each row on the handler thread that received its gradient, after "
                 "that thread's next ack), 'applier' (threads of their own, leaving the handlers to their connections), or 'auto' (the "
                 "applier for rows of 1 KB and up, value and state, when the I/O and applier threads take at most half the cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "handler", "applier"}));
  app.add_option("--apply-threads", apply_threads,
                 "applier threads (--apply-commits applier, and checkpoint commits; 0: as many as --io-threads)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  app.add_option("--socket-buffer-kib", socket_buffer_kib, "TCP: send/receive buffer per connection in KiB (0: kernel autotuning)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1u << 21));
  app.add_option("--transport", transport_kind, "data plane: tcp or rdma (ibverbs, rdma_cm port space)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "rdma"}));
  app.add_option("--rdma-slot-mib", rdma_slot_mib, "RDMA: largest request in MiB (a slot of the receive ring)")->capture_default_str();
  app.add_option("--restore", restore_dir,
                 "resume from a checkpoint (written by any number of shards): its directory, or a --checkpoint-dir (then its newest whole "
                 "checkpoint)");
  std::string verify_dir;
  app.add_option("--verify-checkpoint", verify_dir,
                 "check a checkpoint's files in full (checksums), or pick a --checkpoint-dir's newest whole checkpoint that verifies, "
                 "as --restore would; print its directory and exit (3, naming each file and why, when none verifies)");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "where checkpoints go; SIGUSR1 asks for one at an iteration boundary a few iterations on (the workers flush for it)");
  app.add_flag("--checkpoint-on-exit", checkpoint_on_exit,
               "write a checkpoint on SIGTERM/SIGINT; in a job with workers, first stop the job at a checkpoint a few iterations on "
               "(the workers flush for it and finish; a second signal stops now)");
  app.add_option("--stop-wait-s", stop_wait_s,
                 "with --checkpoint-on-exit in a job: how long SIGTERM/SIGINT waits for the workers to reach the stopping checkpoint "
                 "(0: stop at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--drain-ms", drain_ms, "on SIGTERM/SIGINT: how long requests in flight may take to finish")->capture_default_str();
  app.add_option("--checkpoint-every", checkpoint_every, "also checkpoint after committing every N iterations")->capture_default_str();
  app.add_option("--keep-checkpoints", keep_checkpoints,
                 "keep the newest N whole checkpoints (and newer ones), remove older ones (0: keep all)")
      ->capture_default_str();
  app.add_option("--stats-interval", stats_interval, "seconds between stats lines (0: none)")->capture_default_str();
  app.add_option("--stats-file", stats_file, "JSON stats, rewritten atomically at every stats line");
  app.add_option("--coordinator", coordinator,
                 "join a job's control plane at this ZeroMQ endpoint (tcp://host:port); shard 0 runs the coordinator there "
                 "(port 0: any free port, see --coordinator-file)");
  app.add_option("--coordinator-file", coordinator_file, "shard 0: write the coordinator's endpoint to this file (atomically)");
  app.add_option("--failure-file", failure_file,
                 "shard 0: when the job fails, write the control plane's word on it here (JSON: the member that failed first and "
                 "the cause; atomically)");
  app.add_option("--summary-file", summary_file,
                 "at exit, write this shard's totals here (JSON: requests, rows served, peers dropped, checkpoints written and "
                 "failed; atomically)");
  app.add_option("--max-connections", max_connections, "TCP: open data connections at most (more are refused at accept)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--hello-timeout-ms", hello_timeout_ms, "TCP: a data connection that has not authenticated by then is closed")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600000));
  app.add_option("--workers", workers, "workers of the job (with --coordinator)");
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms, "silence after which a peer is reported dead")->capture_default_str();
  app.add_option("--metrics-port", metrics_port, "serve Prometheus metrics at http://ADDRESS:PORT/metrics (0: none)")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address, "address the metrics are served on (default: the --listen host)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  if (const int status = parse_command_line(app, argc, argv, "ember-ps"); status >= 0) return status;
  return guarded_main("ember-ps", [&] {
    setup_logging(log_level);
    if (!verify_dir.empty()) {  // no shard: only the files
      const ps::RestorePlan plan = ps::plan_restore(verify_dir);
      for (const std::string& why : plan.skipped) spdlog::warn("--verify-checkpoint: passing over {}", why);
      if (!plan.verified) {
        for (const fs::path& f : plan.files) ps::verify_checkpoint_file(f);
      }
      std::printf("%s\n", plan.dir.string().c_str());
      return 0;
    }
    if (token.empty() && token_file.empty()) throw ConfigError("a job token is required (--token or --token-file)");
    if (!token_file.empty()) token = read_secret_file(token_file, "--token-file");
    if (!dataset.empty()) sc.num_keys = rows_of_dataset(dataset);
    if (sc.num_keys == 0) throw ConfigError("give --num-keys or --dataset");
    if ((checkpoint_on_exit || checkpoint_every > 0) && checkpoint_dir.empty()) {
      throw ConfigError("--checkpoint-on-exit and --checkpoint-every need --checkpoint-dir");
    }
    sc.optimizer.kind = ps::parse_optimizer(optimizer);
    ps::ShardAddress where = ps::parse_address(listen);
    if (!coordinator.empty() && workers == 0) throw ConfigError("--coordinator needs --workers (the job's worker count)");
    if (sc.shard >= sc.shards)
      throw ConfigError("--shard " + std::to_string(sc.shard) + " is not below --shards " + std::to_string(sc.shards));

    // Signals are waited for by this thread only; the I/O threads inherit the mask.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGUSR1);  // a checkpoint on command
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    // Until the loop below waits for them, SIGTERM/SIGINT stop the shard at once: the
    // join waits up to 2 minutes for every process of the job and a restore may take
    // long, too long to leave a signal unanswered; nothing is served yet, so nothing is
    // lost.
    std::optional<SignalThread> before_serving(std::in_place, std::initializer_list<int>{SIGTERM, SIGINT}, [](int sig) {
      spdlog::warn("signal {} before the job is served: stopping now", sig);
      die_by_signal(sig);
    });

    if (allocate != "lazy" && allocate != "upfront") throw ConfigError("--allocate '" + allocate + "': choose lazy or upfront");
    sc.allocate_up_front = allocate == "upfront";
    {
      // What the tables need on this shard, against the memory this machine has now.
      const double need = static_cast<double>(ps::ShardStore::bytes_when_full(sc)), have = static_cast<double>(available_memory());
      const std::uint64_t rows = ps::ShardStore::local_rows(sc);
      spdlog::info("shard {}/{}: {} rows x {} bytes = {:.2f} GB when every row is allocated; {:.2f} GB available", sc.shard, sc.shards,
                   rows, rows ? ps::ShardStore::bytes_when_full(sc) / rows : 0, need / 1e9, have / 1e9);
      if (have > 0 && need > have) {
        const std::string msg =
            fmt::format("the tables need {:.2f} GB on shard {} and {:.2f} GB are available", need / 1e9, sc.shard, have / 1e9);
        if (sc.allocate_up_front) throw ConfigError(msg + ": add shards (--shards) or use --allocate lazy");
        spdlog::warn("{}: fine while the rows touched fit (--allocate lazy)", msg);
      }
    }
    sc.apply_threads = ps::applier_threads(apply_threads, static_cast<std::uint32_t>(io_threads));
    transport::TransportOptions to;
    to.kind = transport::parse_transport(transport_kind);
    to.token = token;
    to.address = where.host;
    to.port = where.port;
    to.io_threads = io_threads;
    to.max_connections = max_connections;
    to.hello_timeout = std::chrono::milliseconds(hello_timeout_ms);
    to.socket_buffer_bytes = socket_buffer_kib << 10;
    to.rdma_slot_bytes = rdma_slot_mib << 20;
    if (to.kind == transport::TransportKind::kRdma) {
      // Pull replies leave from the rows' chunks in place (the device gathers them): each
      // chunk becomes a send region as it is allocated.
      auto send_regions = std::make_shared<transport::SendRegions>();
      sc.on_chunk = [send_regions](const void* p, std::size_t bytes) { send_regions->add(p, bytes); };
      to.send_regions = std::move(send_regions);
    }
    // The data plane before the tables: without an RDMA device, one line says so (exit 2)
    // before any table is allocated.
    const transport::Transport data_plane(std::move(to));
    ps::PsService service(sc);
    const std::uint32_t rf = service.store().row_floats();
    const ps::CommitApplyChoice apply =
        ps::choose_commit_apply(apply_commits, rf * 4, static_cast<std::uint32_t>(io_threads), sc.apply_threads, usable_cpus());
    service.apply_commits_on(apply.where);
    spdlog::info("commits applied by the {} ({}; {} I/O thread(s), {} applier thread(s))",
                 apply.where == ps::CommitApply::kApplier ? "applier" : "handler", apply.why, io_threads, sc.apply_threads);
    if (!checkpoint_dir.empty()) {  // periodic checkpoints, and those asked for (SIGUSR1, workers)
      fs::create_directories(checkpoint_dir);
      service.checkpoint_every(checkpoint_every, ps::CheckpointDir(checkpoint_dir, sc.shard, sc.shards, keep_checkpoints));
    }
    spdlog::info("ember-ps shard {}/{}: {} rows, dim {}, {} ({} state floats), {} bytes per row", sc.shard, sc.shards, sc.num_keys, sc.dim,
                 optimizer, rf - sc.dim, rf * 4);
    if (!restore_dir.empty()) {
      const ps::RestorePlan plan = ps::plan_restore(restore_dir, ps::RestoringShard{sc.shard, sc.shards});
      for (const std::string& why : plan.skipped) spdlog::warn("--restore: passing over {}", why);
      const std::int64_t iteration = service.store().load(plan.files, plan.own_file_only);
      service.restored_from(iteration);
      spdlog::info("restored {} rows from {} checkpoint file(s) in {}{}, iteration {}", service.store().initialized_rows(),
                   plan.files.size(), plan.dir.string(),
                   plan.own_file_only ? " (this shard's own file: its manifest lists the other shards' files, written elsewhere)"
                                      : (plan.manifest ? " (listed by its manifest)" : ""),
                   iteration >= 0 ? std::to_string(iteration) : std::string("unknown"));
    }
    auto handler = [&service](const transport::Message& r, transport::OutMessage& o, transport::Scratch& s) { service.handle(r, o, s); };
    const std::unique_ptr<transport::Server> server_ptr = data_plane.make_server(handler);
    transport::Server& server = *server_ptr;
    const auto* rdma_server = dynamic_cast<const transport::RdmaServer*>(&server);  // for its in-place bytes in the stats
    spdlog::info("listening on {}:{} ({})", where.host, server.port(), data_plane.name());
    if (!port_file.empty()) write_file_atomic(port_file, std::to_string(server.port()) + "\n");

    // Control plane: shard 0 coordinates; every shard joins and publishes its address.
    transport::ControlTimeouts ct;
    ct.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms);
    ct.heartbeat_interval = std::max(std::chrono::milliseconds(20), ct.heartbeat_timeout / 10);
    std::unique_ptr<transport::Coordinator> coord;
    std::unique_ptr<transport::ControlMember> member;
    std::optional<ps::CheckpointPeers> checkpoint_peers;  // with a control plane
    // Metrics served from here on, while the job forms too; declared after what they read.
    std::atomic<const transport::Coordinator*> coordinator_seen{nullptr};
    std::unique_ptr<monitor::Exporter> metrics;
    if (metrics_port != 0) {
      metrics = std::make_unique<monitor::Exporter>(metrics_address.empty() ? where.host : metrics_address, metrics_port);
      ps::export_ps_metrics(*metrics, service, server, sc.shard, coordinator_seen);
      spdlog::info("metrics at {}", metrics->url());
    }
    if (!coordinator.empty()) {
      std::string endpoint = coordinator;
      if (sc.shard == 0) {
        std::string bind = endpoint;
        if (bind.size() > 2 && bind.compare(bind.size() - 2, 2, ":0") == 0) bind = bind.substr(0, bind.size() - 1) + "*";
        coord = std::make_unique<transport::Coordinator>(bind, token, transport::JobShape{sc.shards, workers}, ct);
        if (!failure_file.empty()) {
          coord->on_failure([failure_file](const std::string& who, const std::string& cause) {
            try {
              write_file_atomic(failure_file, nlohmann::json{{"member", who}, {"cause", cause}}.dump() + "\n");
            } catch (const std::exception& e) {
              spdlog::error("--failure-file: {}", e.what());
            }
          });
        }
        endpoint = coord->endpoint();
        coordinator_seen = coord.get();
        if (!coordinator_file.empty()) write_file_atomic(coordinator_file, endpoint + "\n");
      }
      transport::MemberOptions mo;
      mo.coordinator = endpoint;
      mo.token = token;
      mo.role = transport::Role::kPs;
      mo.rank = static_cast<int>(sc.shard);
      mo.data_address = where.host + ":" + std::to_string(server.port());
      mo.timeouts = ct;
      spdlog::info("joining the job at {}", endpoint);
      member = std::make_unique<transport::ControlMember>(mo);
      member->publish(ps::restored_key(sc.shard), std::to_string(std::max<std::int64_t>(service.restored_iteration(), -1)));
      if (sc.shard == 0) {
        const auto lookup = [&member](const std::string& key) { return member->lookup(key, std::chrono::seconds(30)); };
        if (auto why = ps::restored_disagree(lookup, sc.shards)) {
          member->abort(*why);
          throw ConfigError(*why);
        }
        ps::JobConfig job;
        job.num_keys = sc.num_keys;
        job.dim = sc.dim;
        job.optimizer = sc.optimizer;
        job.seed = sc.seed;
        job.shards = sc.shards;
        job.transport = data_plane.name();
        // Workers flush the rows they hold before each checkpoint's commit, and resume
        // (--resume) from the restored iteration.
        job.checkpoint_every = checkpoint_every;
        job.checkpoints = !checkpoint_dir.empty();
        // -1: none, or a checkpoint of no iteration (iter-initial).
        job.restored_iteration = std::max<std::int64_t>(service.restored_iteration(), -1);
        member->publish(ps::kJobConfigKey, job.to_json());
      }
      spdlog::info("job formed: {} shards, {} workers", sc.shards, workers);
      checkpoint_peers = peers_over(*member, mo.data_address, workers);
      service.checkpoint_peers(checkpoint_peers);
    }

    before_serving.reset();  // the loop takes the signals from here
    Stopwatch since, stats_clock;
    std::uint64_t last_requests = 0, last_rows = 0;
    int exit_status = 0;
    std::uint64_t final_checkpoint_failures = 0;
    // SIGTERM/SIGINT with --checkpoint-on-exit in a job: the job stops at a checkpoint the
    // workers flush for (a stop made now would leave out the rows they own), then the
    // shards leave as at its end.
    bool stopping = false;
    Stopwatch stop_clock;
    while (true) {
      // Short waits when a control plane may end the job; stats on their own clock.
      timespec ts{member ? 0 : static_cast<time_t>(stats_interval > 0 ? stats_interval : 3600), member ? 100000000L : 0};
      int sig = sigtimedwait(&stop, nullptr, &ts);
      if (sig == SIGTERM || sig == SIGINT) {
        if (stopping || !member || !checkpoint_on_exit || stop_wait_s <= 0) {
          spdlog::info("signal {}: stopping{}", sig, stopping ? " now" : "");
          break;
        }
        stopping = true;
        stop_clock.reset();
        spdlog::info("signal {}: stopping the job at a checkpoint the workers flush for (a second signal stops now)", sig);
      }
      if (stopping && service.stop_at() < 0) {
        // -2: a checkpoint asked for by SIGUSR1 is still ahead; ask once it is written.
        if (const std::int64_t at = service.request_stop(); at >= 0) {
          spdlog::info("the job stops at iteration {}: its checkpoint holds the model, and --resume goes on from it", at);
        }
      }
      if (stopping && stop_clock.seconds() >= stop_wait_s) {
        spdlog::warn("the workers did not reach iteration {}'s checkpoint within --stop-wait-s {}: stopping now", service.stop_at(),
                     stop_wait_s);
        break;
      }
      if (sig == SIGUSR1) {
        const std::int64_t at = service.request_checkpoint();
        if (at < 0) {
          spdlog::warn("SIGUSR1: no --checkpoint-dir, so no checkpoint");
        } else {
          spdlog::info("SIGUSR1: checkpoint at iteration {}'s commit (the workers flush the rows they hold for it)", at);
        }
      }
      if (member) {
        if (auto why = member->failure()) {
          spdlog::error("job failed: {}", *why);
          exit_status = 6;
          break;
        }
        if (member->shutdown_requested()) {
          spdlog::info("every worker finished: stopping");
          break;
        }
        service.settle_checkpoints();
      }
      if (stats_interval <= 0 || stats_clock.seconds() < stats_interval) continue;
      stats_clock.reset();
      double secs = since.seconds();
      since.reset();
      std::uint64_t req = server.requests_served(), rows = service.rows_served();
      double rps = static_cast<double>(req - last_requests) / secs, rowps = static_cast<double>(rows - last_rows) / secs;
      spdlog::info("stats: {:.0f} requests/s, {:.0f} rows/s, {:.1f} MB/s of rows, {} rows initialized, {} pending, {} peers dropped", rps,
                   rowps, rowps * sc.dim * 4 / 1e6, service.store().initialized_rows(), service.store().pending(),
                   server.connections_dropped());
      if (!stats_file.empty()) {
        nlohmann::json j = {{"shard", sc.shard},
                            {"requests_s", rps},
                            {"rows_s", rowps},
                            {"initialized_rows", service.store().initialized_rows()},
                            {"requests", req},
                            {"peers_dropped", server.connections_dropped()},
                            {"checkpoints", service.checkpoints_written()},
                            {"checkpoint_failures", service.checkpoint_failures()}};
        if (rdma_server != nullptr) j["bytes_sent_in_place"] = rdma_server->bytes_sent_in_place();
        write_file_atomic(stats_file, j.dump() + "\n");
      }
      last_requests = req;
      last_rows = rows;
    }
    // Requests being handled finish and their replies go out; then no more come in, so
    // the final checkpoint sees a quiet store.
    server.drain(std::chrono::milliseconds(drain_ms));
    spdlog::info("drained: {} requests served, {} peers dropped", server.requests_served(), server.connections_dropped());
    if (checkpoint_on_exit) {
      std::lock_guard<std::mutex> lock(service.commit_mutex());
      const std::int64_t iteration = service.committed_iteration();
      ps::CheckpointDir checkpoints(checkpoint_dir, sc.shard, sc.shards, keep_checkpoints);
      const bool job_alive = member && !member->failure();
      if (job_alive) checkpoints.set_peers(checkpoint_peers);
      // Written at that commit (periodic, SIGUSR1, or the workers' last, after their final
      // flush): rows written back since belong to an unfinished iteration, and must not
      // replace it.
      const bool kept = iteration >= 0 && iteration == service.last_written_checkpoint();
      bool whole = false;
      fs::path file;
      if (kept) {
        whole = checkpoints.settle(iteration);
      } else {
        // Stopped mid-iteration, gradients pushed since the last commit are not in the rows
        // yet: the checkpoint holds the rows as of that commit, and says which it is.
        try {
          file = checkpoints.file_for(iteration);
          if (const std::size_t left_out = service.store().save(file, iteration, ps::ShardStore::Unapplied::kLeaveOut); left_out > 0) {
            spdlog::warn("final checkpoint: {} rows' gradients pushed after iteration {}'s commit are left out", left_out, iteration);
          }
        } catch (const std::exception& e) {
          // The job's work is done and the earlier checkpoints are whole (files are written
          // whole, then renamed): a warning, counted in the summary, not a failed job.
          ++final_checkpoint_failures;
          spdlog::error("final checkpoint of iteration {} not written: {}; the newest whole checkpoint before it stays", iteration,
                        e.what());
        }
        if (member) {
          spdlog::warn(
              "final checkpoint of iteration {}: written while the workers may still hold rows they own (herald-style "
              "policies flush them for periodic and SIGUSR1 checkpoints, for a stop by a single SIGTERM with --checkpoint-on-exit, "
              "and at the end): restore one of those to resume with the BSP model",
              iteration);
        }
        if (final_checkpoint_failures == 0) whole = checkpoints.finish(iteration);
      }
      // The other shards write theirs now too: wait a little for their word (longer on the
      // coordinator's shard, while another is still in the job: see above).
      for (Stopwatch waited; job_alive && !whole && !member->failure(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
        whole = checkpoints.settle(iteration);
        const bool others_here = coord && coord->ps_left() + 1 < sc.shards;
        if (waited.seconds() >= (others_here ? kCoordinatorExitCheckpointWait : kExitCheckpointWait)) break;
      }
      spdlog::info("{} ({} rows, iteration {}){}",
                   kept ? "final checkpoint: iteration " + std::to_string(iteration) + "'s was written at its commit, kept as it is"
                        : "checkpoint written: " + file.string(),
                   service.store().initialized_rows(), iteration,
                   whole ? "; every shard's file is in: manifest written"
                         : (job_alive ? "; not every shard said it wrote this iteration's: no manifest" : ""));
    }
    if (!summary_file.empty()) try {
        const std::uint64_t failures = service.checkpoint_failures() + final_checkpoint_failures;
        write_file_atomic(summary_file, nlohmann::json{{"shard", sc.shard},
                                                       {"requests", server.requests_served()},
                                                       {"rows_served", service.rows_served()},
                                                       {"peers_dropped", server.connections_dropped()},
                                                       {"checkpoints_written", service.checkpoints_written()},
                                                       {"checkpoint_failures", failures},
                                                       {"exit_status", exit_status}}
                                                .dump() +
                                            "\n");
      } catch (const std::exception& e) {
        spdlog::error("--summary-file: {}", e.what());
      }
    service.checkpoint_peers(std::nullopt);  // before the control member goes
    if (member) member->leave();
    if (coord) coord->wait_ps_left(std::chrono::milliseconds(3000));  // let the others hear the shutdown first
    return exit_status;
  });
}
