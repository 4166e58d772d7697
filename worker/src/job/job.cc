#include "job/job.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "ember/common/error.h"
#include "ember/common/host.h"
#include "ember/common/process.h"
#include "job/job_options.h"

namespace ember::worker {

namespace {

transport::TransportOptions data_plane_options(const TrainConfig& c) {
  transport::TransportOptions o;
  o.kind = transport::parse_transport(c.transport);
  o.token = c.token;
  o.timeout = c.timeout;
  o.socket_buffer_bytes = c.socket_buffer_kib << 10;
  o.rdma_slot_bytes = c.rdma_slot_mib << 20;
  return o;
}

}  // namespace

Job::Job(const TrainConfig& c) : c_(c), data_plane_(data_plane_options(c)) {
  if (c_.coordinator.empty()) throw ConfigError("--coordinator is required (the control plane endpoint of ember-ps shard 0)");
  if (c_.token.empty()) throw ConfigError("a job token is required (--token or --token-file)");
}

void Job::join(const data::Dataset& ds) {
  transport::MemberOptions mo;
  mo.coordinator = c_.coordinator;
  mo.token = c_.token;
  mo.role = transport::Role::kWorker;
  mo.rank = c_.rank;
  mo.timeouts.heartbeat_timeout = c_.heartbeat_timeout;
  mo.timeouts.heartbeat_interval = std::max(std::chrono::milliseconds(20), c_.heartbeat_timeout / 10);
  mo.timeouts.join_timeout = c_.join_timeout;
  // Before joining, so that worker 0 publishes them the moment the job forms.
  const OptionValues options = agreed_options(c_, dataset_identity(ds.manifest()));
  spdlog::info("joining the job at {}", c_.coordinator);
  control_ = std::make_unique<transport::ControlMember>(mo);
  rank_ = control_->rank();
  control_->publish(worker_host_key(rank_), c_.host.empty() ? this_host_name() : c_.host);
  control_->publish(worker_machine_key(rank_), this_host_name());
  if (c_.stop != nullptr) c_.stop->set_teller([m = control_.get()](const std::string& why) { m->ending(why); });
  if (rank_ == 0) control_->publish(kWorkerOptionsKey, options_to_json(options));
  watchdog_ = std::thread([this] {
    name_this_thread("watchdog");
    std::optional<std::string> why;
    while (!watchdog_stop_.load() && !(why = control_->failure())) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (Stopwatch w; !watchdog_stop_.load() && w.millis() < kWatchdogGrace.count();)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (watchdog_stop_.load()) return;
    spdlog::error("job failed: {}; this worker did not stop within {} ms (blocked in the all-reduce or on a PS request): exiting", *why,
                  kWatchdogGrace.count());
    spdlog::default_logger()->flush();
    std::_Exit(6);
  });
  if (control_->shape().workers != c_.workers) {
    throw ConfigError("--workers " + std::to_string(c_.workers) + " but the job has " + std::to_string(control_->shape().workers) +
                      " workers");
  }
  ps_ = ps::JobConfig::from_json(control_->lookup(ps::kJobConfigKey, c_.join_timeout));
  const std::uint64_t rows = ds.manifest().total_table_rows();
  if (ds.manifest().hashed_ids) {
    // Dynamic tables: the shards' slots, as many on each (ember-ps --slots-per-shard).
    const std::uint64_t shards = control_->peers_of(transport::Role::kPs).size();
    if (shards == 0 || ps_.num_keys % shards != 0) {
      const std::string data = c_.stream.empty() ? c_.dataset : "--stream " + c_.stream;
      throw ConfigError("dataset mismatch: " + data + " has hashed ids, but the PS's " + std::to_string(ps_.num_keys) +
                        " rows are not slots of " + std::to_string(shards) +
                        " shards (was ember-ps started with a vocabulary's --dataset? dynamic tables take --slots-per-shard)");
    }
  } else if (ps_.num_keys != rows) {
    throw ConfigError("dataset mismatch: " + c_.dataset + " has " + std::to_string(rows) + " embedding rows in its tables, the PS serves " +
                      std::to_string(ps_.num_keys) + " (was ember-ps started with another --dataset?)");
  }
  if (ps_.transport != c_.transport) {
    throw ConfigError("--transport " + c_.transport + " but the PS shards serve " + ps_.transport +
                      " (start both with the same --transport)");
  }
  if (rank_ != 0) check_options(options);
  state_ = ps::state_floats(ps_.optimizer.kind, ps_.dim);
  std::vector<ps::ShardAddress> shards;
  for (const auto& p : control_->peers_of(transport::Role::kPs)) shards.push_back(ps::parse_address(p.data_address));
  hosts_ = host_map(c_.workers, static_cast<std::uint32_t>(shards.size()),
                    [this](const std::string& key) { return control_->lookup(key, c_.join_timeout); });
  if (rank_ == 0) spdlog::info("{}; dense all-reduce {}", hosts_.describe(), c_.allreduce);
  client_ = std::make_unique<ps::PsClient>(shards, ps_.dim, state_, data_plane_.make_connector(), c_.ps_connections);
  spdlog::info("worker {}/{}: {} PS shard(s), {} rows of dim {}, sparse optimizer {} (lr {})", rank_, c_.workers, shards.size(),
               ps_.num_keys, ps_.dim, ps::optimizer_name(ps_.optimizer.kind), ps_.optimizer.lr);
}

void Job::check_options(const std::vector<std::pair<std::string, std::string>>& mine) {
  // Worker 0 published them as the job formed: they are here in a moment, unless it is
  // an ember-worker of a build that publishes none (or it failed: the lookup says so).
  const std::chrono::milliseconds wait = std::max(std::chrono::milliseconds(10000), c_.heartbeat_timeout);
  std::string text;
  try {
    text = control_->lookup(kWorkerOptionsKey, wait);
  } catch (const IoError&) {
    throw ConfigError("worker 0 published no options to compare within " + std::to_string(wait.count()) +
                      " ms (an ember-worker of an older build?): start every worker of a job with the same ember-worker");
  }
  const std::string differ = compare_options(mine, options_from_json(text));
  if (!differ.empty()) {
    throw ConfigError(differ + " (the job's values are worker 0's: start every worker of a job with the same options)");
  }
  spdlog::info("worker {}: the {} options the workers must agree on agree with worker 0's", rank_, mine.size());
}

Job::~Job() {
  if (c_.stop != nullptr) c_.stop->set_teller(nullptr);  // before the member goes
  watchdog_stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
}

void Job::fail(std::exception_ptr error) {
  if (!control_) std::rethrow_exception(error);
  std::string what = "unknown error";
  bool own = false;  // errors of this worker's own input: never caused by a peer
  int status = 1;    // what main() exits with for it
  try {
    std::rethrow_exception(error);
  } catch (const ConfigError& e) {
    what = e.what();
    own = true;
    status = exit_code(e);
  } catch (const DataError& e) {
    what = e.what();
    own = true;
    status = exit_code(e);
  } catch (const std::exception& e) {
    what = e.what();
    status = exit_code(e);
  } catch (...) {
  }
  auto why = control_->failure();
  if (!why && !own) {
    // A peer's death shows here first as a closed connection; the control plane names it
    // once its heartbeat times out. Wait for that word rather than blame this worker.
    control_->wait_shutdown(c_.heartbeat_timeout + std::chrono::milliseconds(2000));
    why = control_->failure();
  }
  if (why) {
    if (what.find(*why) != std::string::npos) throw JobFailed(what);
    throw JobFailed("job failed: " + *why + " (here: " + what + ")");
  }
  control_->abort(what, status);
  std::rethrow_exception(error);
}

}  // namespace ember::worker
