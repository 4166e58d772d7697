#include "job.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/transport/rdma.h"

namespace ember::worker {

namespace {

PsConfig parse_ps_config(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    PsConfig p;
    p.num_keys = j.at("num_keys");
    p.dim = j.at("dim");
    p.optimizer.kind = ps::parse_optimizer(j.at("optimizer"));
    p.optimizer.lr = j.at("lr");
    p.optimizer.weight_decay = j.at("weight_decay");
    p.seed = j.at("seed");
    p.transport = j.value("transport", "tcp");
    p.checkpoint_every = j.value("checkpoint_every", std::uint64_t{0});
    p.checkpoints = j.value("checkpoints", p.checkpoint_every > 0);
    p.restored_iteration = j.value("restored_iteration", std::int64_t{-1});
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("the PS published a malformed configuration: ") + e.what());
  }
}

}  // namespace

Job::Job(const TrainConfig& c) : c_(c) {
  if (c_.transport == "rdma") {
    fabric_ = transport::verbs::make_ibverbs_fabric();  // one line, exit 2, without a device
  } else if (c_.transport != "tcp") {
    throw ConfigError("--transport '" + c_.transport + "': choose tcp or rdma");
  }
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
  spdlog::info("joining the job at {}", c_.coordinator);
  control_ = std::make_unique<transport::ControlMember>(mo);
  rank_ = control_->rank();
  if (control_->shape().workers != c_.workers) {
    throw ConfigError("--workers " + std::to_string(c_.workers) + " but the job has " + std::to_string(control_->shape().workers) +
                      " workers");
  }
  ps_ = parse_ps_config(control_->lookup("ps_config", c_.join_timeout));
  const std::uint64_t rows = ds.manifest().total_table_rows();
  if (ps_.num_keys != rows) {
    throw ConfigError("dataset mismatch: " + c_.dataset + " has " + std::to_string(rows) + " embedding rows in its tables, the PS serves " +
                      std::to_string(ps_.num_keys) + " (was ember-ps started with another --dataset?)");
  }
  if (ps_.transport != c_.transport) {
    throw ConfigError("--transport " + c_.transport + " but the PS shards serve " + ps_.transport + " (start both with the same --transport)");
  }
  state_ = ps::state_floats(ps_.optimizer.kind, ps_.dim);
  std::vector<ps::ShardAddress> shards;
  for (const auto& p : control_->peers_of(transport::Role::kPs)) shards.push_back(ps::parse_address(p.data_address));
  if (fabric_) {
    transport::RdmaOptions ro;
    ro.slot_bytes = c_.rdma_slot_mib << 20;
    ro.timeout = c_.timeout;
    client_ = std::make_unique<ps::PsClient>(shards, ps_.dim, state_, ps::rdma_connector(*fabric_, c_.token, ro), c_.ps_connections);
  } else {
    client_ = std::make_unique<ps::PsClient>(shards, ps_.dim, state_,
                                             ps::tcp_connector(c_.token, c_.timeout, c_.socket_buffer_kib << 10), c_.ps_connections);
  }
  spdlog::info("worker {}/{}: {} PS shard(s), {} rows of dim {}, sparse optimizer {} (lr {})", rank_, c_.workers, shards.size(),
               ps_.num_keys, ps_.dim, ps::optimizer_name(ps_.optimizer.kind), ps_.optimizer.lr);
}

}  // namespace ember::worker
