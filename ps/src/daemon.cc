#include "daemon.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../tools/ps_metrics.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/host.h"
#include "ember/ps/job_config.h"

namespace ember::ps {
namespace {

namespace fs = std::filesystem;

// This process's peak resident set (rows on a tier count while mapped in).
std::uint64_t peak_rss_bytes() {
  rusage u{};
  return getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<std::uint64_t>(u.ru_maxrss) * 1024 : 0;
}

// The summary's "tier": the disk tier's counters (disk_tier.h).
nlohmann::json tier_json(const TierStats& t) {
  return {{"rows_touched", t.rows_touched},
          {"misses", t.misses},
          {"miss_per_row", t.rows_touched ? static_cast<double>(t.misses) / static_cast<double>(t.rows_touched) : 0.0},
          {"hinted_rows", t.hinted_rows},
          {"hint_loads", t.hint_loads},
          {"evicted_rows", t.evicted},
          {"written_back_rows", t.written_back},
          {"bytes_read", t.bytes_read},
          {"bytes_written", t.bytes_written},
          {"resident_rows", t.resident},
          {"budget_rows", t.budget_rows},
          {"slot_waits", t.slot_waits},
          {"file_bytes", t.file_bytes}};
}

// The summary's "checkpoint_cost": what the checkpoints at commits cost, whole and
// incremental ones apart (count, bytes, seconds).
nlohmann::json cost_json(const CheckpointCoordinator& cp) {
  auto one = [](const CheckpointCoordinator::Cost& c) {
    return nlohmann::json{{"count", c.count}, {"bytes", c.bytes}, {"seconds", c.seconds}};
  };
  return {{"whole", one(cp.whole_cost())}, {"incremental", one(cp.incremental_cost())}};
}

// The summary's "served": per kind, what this shard answered (ServedCounts).
nlohmann::json served_json(const ServedCounts& served) {
  nlohmann::json j = nlohmann::json::object();
  for (int k = 0; k < ServedCounts::kKinds; ++k) {
    const ServedCounts::PerKind& n = served.kinds[k];
    j[ServedCounts::name(k)] = {
        {"requests", n.requests.load()}, {"rows", n.rows.load()}, {"bytes_in", n.bytes_in.load()}, {"bytes_out", n.bytes_out.load()}};
  }
  return j;
}

// Seconds the exit checkpoint waits for the other shards' word (with a control plane).
constexpr double kExitCheckpointWait = 5.0;
// The same for the shard that hosts the coordinator while another shard is still in the
// job: that one may still be writing its checkpoint, and once the coordinator is gone it
// cannot learn of this shard's file, nor this shard of its. (Under the launcher's 30 s
// for the shards to stop.)
constexpr double kCoordinatorExitCheckpointWait = 20.0;

// Checkpoint records on the control plane's board (job_config.h): the shards' files, the
// shards' part whole, and the workers' dense states, by which checkpoints are pruned.
CheckpointPeers peers_over(transport::ControlMember& member, const std::string& here, std::uint32_t workers) {
  CheckpointPeers p;
  p.here = here;
  p.announce = [&member](std::int64_t it, std::uint32_t shard, const std::string& record) {
    member.publish(checkpoint_record_key(it, shard), record);
  };
  p.record_of = [&member](std::int64_t it, std::uint32_t shard) { return member.try_lookup(checkpoint_record_key(it, shard)); };
  p.workers_done = [&member, workers](std::int64_t it) {
    return dense_states_ok([&member](const std::string& key) { return member.try_lookup(key); }, it, workers);
  };
  p.on_whole = [&member](std::int64_t it) { member.publish(shards_whole_key(it), "1"); };
  return p;
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

int PsDaemon::run() {
  take_signals();
  open_store();
  serve();
  join_job();
  const int status = signal_loop();
  // Requests being handled finish and their replies go out; then no more come in, so
  // the final checkpoint sees a quiet store.
  server_->drain(std::chrono::milliseconds(c_.drain_ms));
  spdlog::info("drained: {} requests served, {} peers dropped", server_->requests_served(), server_->connections_dropped());
  if (c_.checkpoint_on_exit) exit_checkpoint();
  write_summary(status);
  leave_job();
  return status;
}

void PsDaemon::take_signals() {
  // Signals are waited for by this thread only; the I/O threads inherit the mask.
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGUSR1);  // a checkpoint on command
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  // Until the loop waits for them, SIGTERM/SIGINT stop the shard at once: the join waits
  // up to 2 minutes for every process of the job and a restore may take long, too long
  // to leave a signal unanswered; nothing is served yet, so nothing is lost.
  before_serving_.emplace(std::initializer_list<int>{SIGTERM, SIGINT}, [](int sig) {
    spdlog::warn("signal {} before the job is served: stopping now", sig);
    die_by_signal(sig);
  });
}

void PsDaemon::open_store() {
  StoreConfig& sc = c_.store;
  report_memory();
  sc.apply_threads = applier_threads(c_.apply_threads, static_cast<std::uint32_t>(c_.io_threads));
  // The data plane before the tables: without an RDMA device, one line says so (exit 2)
  // before any row is allocated.
  data_plane_.emplace(transport_options());
  service_.emplace(sc);
  const std::uint32_t rf = service_->store().row_floats();
  const CommitApplyChoice apply =
      choose_commit_apply(c_.apply_commits, rf * 4, static_cast<std::uint32_t>(c_.io_threads), sc.apply_threads, usable_cpus());
  service_->apply_commits_on(apply.where);
  spdlog::info("commits applied by the {} ({}; {} I/O thread(s), {} applier thread(s))",
               apply.where == CommitApply::kApplier ? "applier" : "handler", apply.why, c_.io_threads, sc.apply_threads);
  if (!c_.checkpoint_dir.empty()) {  // periodic checkpoints, and those asked for (SIGUSR1, workers)
    fs::create_directories(c_.checkpoint_dir);
    service_->checkpoint_every(c_.checkpoint_every, CheckpointDir(c_.checkpoint_dir, sc.shard, sc.shards, c_.keep_checkpoints),
                               sc.track_changes ? c_.checkpoint_full_every : 1);
  }
  spdlog::info("ember-ps shard {}/{}: {} rows, dim {}, {} ({} state floats), {} bytes per row", sc.shard, sc.shards, sc.num_keys, sc.dim,
               c_.optimizer_name, rf - sc.dim, rf * 4);
  if (!c_.restore_dir.empty()) restore();
}

void PsDaemon::report_memory() const {
  // What the tables need on this shard, against the memory this machine has now.
  const StoreConfig& sc = c_.store;
  const double need = static_cast<double>(ShardStore::bytes_when_full(sc)), have = static_cast<double>(available_memory());
  const std::uint64_t rows = ShardStore::local_rows(sc);
  spdlog::info("shard {}/{}: {} rows x {} bytes = {:.2f} GB when every row is allocated; {:.2f} GB available", sc.shard, sc.shards, rows,
               rows ? ShardStore::bytes_when_full(sc) / rows : 0, need / 1e9, have / 1e9);
  if (have > 0 && need > have) {
    const std::string msg =
        fmt::format("the tables need {:.2f} GB on shard {} and {:.2f} GB are available", need / 1e9, sc.shard, have / 1e9);
    if (sc.allocate_up_front) throw ConfigError(msg + ": add shards (--shards) or use --allocate lazy");
    spdlog::warn("{}: fine while the rows touched fit (--allocate lazy)", msg);
  }
}

transport::TransportOptions PsDaemon::transport_options() {
  transport::TransportOptions to;
  to.kind = transport::parse_transport(c_.transport);
  to.token = c_.token;
  to.address = c_.listen.host;
  to.port = c_.listen.port;
  to.io_threads = c_.io_threads;
  to.max_connections = c_.max_connections;
  to.hello_timeout = std::chrono::milliseconds(c_.hello_timeout_ms);
  to.socket_buffer_bytes = c_.socket_buffer_kib << 10;
  to.rdma_slot_bytes = c_.rdma_slot_mib << 20;
  if (to.kind == transport::TransportKind::kRdma) {
    // Pull replies leave from the rows' chunks in place (the device gathers them): each
    // chunk becomes a send region as it is allocated.
    auto send_regions = std::make_shared<transport::SendRegions>();
    c_.store.on_chunk = [send_regions](const void* p, std::size_t bytes) { send_regions->add(p, bytes); };
    to.send_regions = std::move(send_regions);
  }
  return to;
}

void PsDaemon::restore() {
  const StoreConfig& sc = c_.store;
  const RestorePlan plan = plan_restore(c_.restore_dir, RestoringShard{sc.shard, sc.shards});
  for (const std::string& why : plan.skipped) spdlog::warn("--restore: passing over {}", why);
  const std::int64_t iteration = service_->store().load(plan.files, plan.own_file_only);
  service_->restored_from(iteration);
  spdlog::info("restored {} rows from {} checkpoint file(s) in {}{}, iteration {}", service_->store().initialized_rows(), plan.files.size(),
               plan.dir.string(),
               plan.own_file_only ? " (this shard's own file: its manifest lists the other shards' files, written elsewhere)"
                                  : (plan.manifest ? " (listed by its manifest)" : ""),
               iteration >= 0 ? std::to_string(iteration) : std::string("unknown"));
}

void PsDaemon::serve() {
  server_ = data_plane_->make_server(service_->handler());
  rdma_server_ = dynamic_cast<const transport::RdmaServer*>(server_.get());
  spdlog::info("listening on {}:{} ({})", c_.listen.host, server_->port(), data_plane_->name());
  // No job to form: the loop takes the signals before the port file says the shard is
  // up (a SIGTERM sent on seeing it stops the shard in order, exit 0, not by signal).
  if (c_.coordinator.empty()) before_serving_.reset();
  if (!c_.port_file.empty()) write_file_atomic(c_.port_file, std::to_string(server_->port()) + "\n");
  // Metrics served from here on, while the job forms too.
  if (c_.metrics_port != 0) {
    metrics_ = std::make_unique<monitor::Exporter>(c_.metrics_address.empty() ? c_.listen.host : c_.metrics_address, c_.metrics_port);
    export_ps_metrics(*metrics_, *service_, *server_, c_.store.shard, coordinator_seen_);
    spdlog::info("metrics at {}", metrics_->url());
  }
}

void PsDaemon::join_job() {
  if (c_.coordinator.empty()) return;  // signals already the loop's (serve)
  // Control plane: shard 0 coordinates; every shard joins and publishes its address.
  transport::ControlTimeouts ct;
  ct.heartbeat_timeout = c_.heartbeat_timeout;
  ct.heartbeat_interval = std::max(std::chrono::milliseconds(20), ct.heartbeat_timeout / 10);
  std::string endpoint = c_.coordinator;
  if (c_.store.shard == 0) host_coordinator(endpoint, ct);
  transport::MemberOptions mo;
  mo.coordinator = endpoint;
  mo.token = c_.token;
  mo.role = transport::Role::kPs;
  mo.rank = static_cast<int>(c_.store.shard);
  mo.data_address = c_.listen.host + ":" + std::to_string(server_->port());
  mo.timeouts = ct;
  spdlog::info("joining the job at {}", endpoint);
  member_ = std::make_unique<transport::ControlMember>(mo);
  // The job has formed: the loop takes the signals from here (they wait, blocked, until
  // it runs). This comes before the restored iteration is published, which shard 0 waits
  // for before it publishes the job's config that workers start on, so no worker can
  // train before every shard would answer a SIGTERM with its exit checkpoint.
  before_serving_.reset();
  member_->publish(shard_host_key(c_.store.shard), c_.host.empty() ? this_host_name() : c_.host);
  member_->publish(shard_machine_key(c_.store.shard), this_host_name());
  member_->publish(restored_key(c_.store.shard), std::to_string(std::max<std::int64_t>(service_->restored_iteration(), -1)));
  if (c_.store.shard == 0) publish_job_config();
  spdlog::info("job formed: {} shards, {} workers", c_.store.shards, c_.workers);
  peers_ = peers_over(*member_, mo.data_address, c_.workers);
  service_->checkpoint_peers(peers_);
}

void PsDaemon::host_coordinator(std::string& endpoint, const transport::ControlTimeouts& timeouts) {
  std::string bind = endpoint;
  if (bind.size() > 2 && bind.compare(bind.size() - 2, 2, ":0") == 0) bind = bind.substr(0, bind.size() - 1) + "*";
  coord_ = std::make_unique<transport::Coordinator>(bind, c_.token, transport::JobShape{c_.store.shards, c_.workers}, timeouts);
  if (!c_.failure_file.empty()) {
    coord_->on_failure([failure_file = c_.failure_file](const transport::JobFailure& f) {
      try {
        nlohmann::json word{{"member", f.member}, {"cause", f.cause}};
        if (f.exit_status != 0) word["exit"] = f.exit_status;  // 2, 3: a restart cannot mend it
        write_file_atomic(failure_file, word.dump() + "\n");
      } catch (const std::exception& e) {
        spdlog::error("--failure-file: {}", e.what());
      }
    });
  }
  endpoint = coord_->endpoint();
  coordinator_seen_ = coord_.get();
  if (!c_.coordinator_file.empty()) write_file_atomic(c_.coordinator_file, endpoint + "\n");
}

void PsDaemon::publish_job_config() {
  const auto lookup = [this](const std::string& key) { return member_->lookup(key, std::chrono::seconds(30)); };
  if (auto why = restored_disagree(lookup, c_.store.shards)) {
    member_->abort(*why, exit_code(ConfigError(*why)));
    throw ConfigError(*why);
  }
  const StoreConfig& sc = c_.store;
  JobConfig job;
  job.num_keys = sc.num_keys;
  job.dim = sc.dim;
  job.optimizer = sc.optimizer;
  job.seed = sc.seed;
  job.shards = sc.shards;
  job.transport = data_plane_->name();
  // Workers flush the rows they hold before each checkpoint's commit, and resume
  // (--resume) from the restored iteration.
  job.checkpoint_every = c_.checkpoint_every;
  job.checkpoints = !c_.checkpoint_dir.empty();
  // -1: none, or a checkpoint of no iteration (iter-initial).
  job.restored_iteration = std::max<std::int64_t>(service_->restored_iteration(), -1);
  job.disk_tier = !sc.tier.dir.empty() && sc.tier.hints;
  member_->publish(kJobConfigKey, job.to_json());
}

int PsDaemon::signal_loop() {
  loop_ = Loop{};
  while (true) {
    // Short waits when a control plane may end the job; stats on their own clock.
    const double stats_interval = c_.stats_interval;
    const bool short_waits = member_ || c_.checkpoint_every_s > 0;
    timespec ts{short_waits ? 0 : static_cast<time_t>(stats_interval > 0 ? stats_interval : 3600), short_waits ? 100000000L : 0};
    if (!on_signal(sigtimedwait(&signals_, nullptr, &ts))) return loop_.exit_status;
    if (stats_interval <= 0 || loop_.stats_clock.seconds() < stats_interval) continue;
    loop_.stats_clock.reset();
    write_stats();
  }
}

bool PsDaemon::on_signal(int sig) {
  // SIGTERM/SIGINT with --checkpoint-on-exit in a job: the job stops at a checkpoint the
  // workers flush for (a stop made now would leave out the rows they own), then the
  // shards leave as at its end.
  if (sig == SIGTERM || sig == SIGINT) {
    if (loop_.stopping || !member_ || !c_.checkpoint_on_exit || c_.stop_wait_s <= 0) {
      spdlog::info("signal {}: stopping{}", sig, loop_.stopping ? " now" : "");
      return false;
    }
    loop_.stopping = true;
    loop_.stop_clock.reset();
    spdlog::info("signal {}: stopping the job at a checkpoint the workers flush for (a second signal stops now)", sig);
  }
  if (loop_.stopping && service_->stop_at() < 0) {
    // -2: a checkpoint asked for by SIGUSR1 is still ahead; ask once it is written.
    if (const std::int64_t at = service_->request_stop(); at >= 0) {
      spdlog::info("the job stops at iteration {}: its checkpoint holds the model, and --resume goes on from it", at);
    }
  }
  if (loop_.stopping && loop_.stop_clock.seconds() >= c_.stop_wait_s) {
    spdlog::warn("the workers did not reach iteration {}'s checkpoint within --stop-wait-s {}: stopping now", service_->stop_at(),
                 c_.stop_wait_s);
    return false;
  }
  // Timed checkpoints (--checkpoint-every-s): shard 0 asks, as SIGUSR1 does; the workers
  // learn the iteration from its commit acks and flag that commit to every shard.
  if (c_.checkpoint_every_s > 0 && c_.store.shard == 0 && loop_.timed_checkpoint_clock.seconds() >= c_.checkpoint_every_s) {
    loop_.timed_checkpoint_clock.reset();
    if (const std::int64_t at = service_->request_checkpoint(); at >= 0)
      spdlog::debug("--checkpoint-every-s: checkpoint at iteration {}'s commit", at);
  }
  if (sig == SIGUSR1) {
    const std::int64_t at = service_->request_checkpoint();
    if (at < 0) {
      spdlog::warn("SIGUSR1: no --checkpoint-dir, so no checkpoint");
    } else {
      spdlog::info("SIGUSR1: checkpoint at iteration {}'s commit (the workers flush the rows they hold for it)", at);
    }
  }
  if (member_) {
    if (auto why = member_->failure()) {
      spdlog::error("job failed: {}", *why);
      loop_.exit_status = 6;
      return false;
    }
    if (member_->shutdown_requested()) {
      spdlog::info("every worker finished: stopping");
      return false;
    }
    service_->settle_checkpoints();
  }
  return true;
}

void PsDaemon::write_stats() {
  const double secs = loop_.since.seconds();
  loop_.since.reset();
  const std::uint64_t req = server_->requests_served(), rows = service_->rows_served();
  const double rps = static_cast<double>(req - loop_.last_requests) / secs, rowps = static_cast<double>(rows - loop_.last_rows) / secs;
  ShardStore& store = service_->store();
  spdlog::info("stats: {:.0f} requests/s, {:.0f} rows/s, {:.1f} MB/s of rows, {} rows initialized, {} pending, {} peers dropped", rps,
               rowps, rowps * c_.store.dim * 4 / 1e6, store.initialized_rows(), store.pending(), server_->connections_dropped());
  if (!c_.stats_file.empty()) {
    nlohmann::json j = {{"shard", c_.store.shard},
                        {"requests_s", rps},
                        {"rows_s", rowps},
                        {"initialized_rows", store.initialized_rows()},
                        {"requests", req},
                        {"peers_dropped", server_->connections_dropped()},
                        {"checkpoints", service_->checkpoints_written()},
                        {"checkpoint_failures", service_->checkpoint_failures()}};
    if (rdma_server_ != nullptr) j["bytes_sent_in_place"] = rdma_server_->bytes_sent_in_place();
    write_file_atomic(c_.stats_file, j.dump() + "\n");
  }
  loop_.last_requests = req;
  loop_.last_rows = rows;
}

void PsDaemon::exit_checkpoint() {
  CheckpointDir dir(c_.checkpoint_dir, c_.store.shard, c_.store.shards, c_.keep_checkpoints);
  CheckpointCoordinator::ExitWait wait;
  wait.job_alive = member_ && !member_->failure();
  wait.in_job = member_ != nullptr;
  if (wait.job_alive) dir.set_peers(peers_);
  wait.job_failed = [this] { return member_->failure().has_value(); };
  // Longer on the coordinator's shard while another is still in the job (see above).
  wait.limit_s = [this] {
    const bool others_here = coord_ && coord_->ps_left() + 1 < c_.store.shards;
    return others_here ? kCoordinatorExitCheckpointWait : kExitCheckpointWait;
  };
  service_->checkpoints().write_exit_checkpoint(std::move(dir), wait);
}

void PsDaemon::write_summary(int exit_status) {
  if (c_.summary_file.empty()) return;
  try {
    const CheckpointCoordinator& cp = service_->checkpoints();
    nlohmann::json summary{{"shard", c_.store.shard},
                           {"requests", server_->requests_served()},
                           {"rows_served", service_->rows_served()},
                           {"served", served_json(service_->served())},
                           {"peers_dropped", server_->connections_dropped()},
                           {"checkpoints_written", cp.written()},
                           {"checkpoints_incremental", cp.incremental_written()},
                           {"checkpoint_cost", cost_json(cp)},
                           {"checkpoint_failures", cp.failures() + cp.exit_failures()},
                           {"exit_status", exit_status},
                           {"peak_rss_bytes", peak_rss_bytes()}};
    if (const auto t = service_->store().tier_stats()) {
      summary["tier"] = tier_json(*t);
      if (const auto c = service_->tier_at_last_commit()) summary["tier"]["at_last_commit"] = tier_json(*c);
    }
    write_file_atomic(c_.summary_file, summary.dump() + "\n");
  } catch (const std::exception& e) {
    spdlog::error("--summary-file: {}", e.what());
  }
}

void PsDaemon::leave_job() {
  service_->checkpoint_peers(std::nullopt);  // before the control member goes
  if (member_) member_->leave();
  if (coord_) coord_->wait_ps_left(std::chrono::milliseconds(3000));  // let the others hear the shutdown first
}

}  // namespace ember::ps
