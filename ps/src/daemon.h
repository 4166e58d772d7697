// PsDaemon: one ember-ps shard's life, from the flags (DaemonConfig, read by ember_ps.cc)
// to its exit status. run() reads as that life in order: open the store (restoring a
// checkpoint), serve, join the control plane and publish the job's configuration, take
// signals until the job ends (a stop at a checkpoint included), drain, the exit
// checkpoint, the summary, leave.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ember/common/process.h"
#include "ember/common/signals.h"
#include "ember/monitor/exporter.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/ps_service.h"
#include "ember/transport/control.h"
#include "ember/transport/job_connection.h"
#include "ember/transport/rdma.h"
#include "ember/transport/transport.h"

namespace ember::ps {

// ember-ps's options, checked and resolved (token read, rows counted, optimizer parsed):
// the job connection's (coordinator, token, transport, host ...: the flags ember-worker
// takes too), and the shard's own.
struct DaemonConfig : transport::JobConnection {
  StoreConfig store;
  std::string optimizer_name = "sgd";  // for the log; store.optimizer.kind holds it
  ShardAddress listen;                 // default 127.0.0.1, any free port
  std::string port_file, restore_dir, checkpoint_dir, stats_file;
  int io_threads = 2;
  std::string apply_commits = "auto";
  std::uint32_t apply_threads = 0;  // 0: as many as io_threads
  double stats_interval = 10;
  int drain_ms = 5000;
  bool checkpoint_on_exit = false;
  double stop_wait_s = 60;
  std::uint64_t checkpoint_every = 0;
  // One checkpoint in N whole, those between incremental (CheckpointCoordinator); 0: 8
  // with a disk tier (its table may be far larger than its changes), else 1.
  std::uint32_t checkpoint_full_every = 0;
  // With each checkpoint, a serving delta per shard (serving_delta.h, ember-serve).
  bool serving_deltas = false;
  // Shard 0 asks for a checkpoint (as SIGUSR1 does) every this many seconds; 0: never.
  double checkpoint_every_s = 0;
  std::size_t keep_checkpoints = 3;
  std::string coordinator_file, failure_file, summary_file;
  std::uint32_t max_connections = 1024;
  int hello_timeout_ms = 10000;
  std::uint32_t workers = 0;
  std::uint16_t metrics_port = 0;
  std::string metrics_address;  // empty: the listen host
};

class PsDaemon {
 public:
  explicit PsDaemon(DaemonConfig config) : c_(std::move(config)) {}
  PsDaemon(const PsDaemon&) = delete;
  PsDaemon& operator=(const PsDaemon&) = delete;
  // The shard's life; returns the exit status (0, or 6 when the job failed).
  int run();

 private:
  // Blocks the signals the loop waits for; until then SIGTERM/SIGINT stop at once.
  void take_signals();
  // The memory the tables need here, the data plane, the store and its commit mode, the
  // checkpoint directory, and a restored checkpoint.
  void open_store();
  void report_memory() const;
  transport::TransportOptions transport_options();
  void restore();
  // The data plane's server, the port file, the metrics.
  void serve();
  // The control plane (shard 0 hosts the coordinator): joins, publishes the restored
  // iteration and (shard 0) the job's configuration, hands the checkpoints their peers.
  void join_job();
  void host_coordinator(std::string& endpoint, const transport::ControlTimeouts& timeouts);
  void publish_job_config();
  // Signals, the job's end, stats; returns the exit status.
  int signal_loop();
  // One SIGTERM/SIGINT, SIGUSR1 or tick of the loop; false when the loop ends.
  bool on_signal(int sig);
  void write_stats();
  // After the loop: the exit checkpoint, the summary, leaving the job.
  void exit_checkpoint();
  void write_summary(int exit_status);
  void leave_job();

  DaemonConfig c_;
  sigset_t signals_{};
  std::optional<SignalThread> before_serving_;
  // Declared in the order they are built, so destroyed in reverse: the server before the
  // service it calls, the control member before the coordinator, the metrics first.
  std::optional<transport::Transport> data_plane_;
  std::optional<PsService> service_;
  std::unique_ptr<transport::Server> server_;
  const transport::RdmaServer* rdma_server_ = nullptr;  // for its in-place bytes in the stats
  std::unique_ptr<transport::Coordinator> coord_;
  std::unique_ptr<transport::ControlMember> member_;
  std::optional<CheckpointPeers> peers_;  // with a control plane
  std::atomic<const transport::Coordinator*> coordinator_seen_{nullptr};
  std::unique_ptr<monitor::Exporter> metrics_;
  // The signal loop's state.
  struct Loop {
    Stopwatch since, stats_clock, stop_clock, timed_checkpoint_clock;
    std::uint64_t last_requests = 0, last_rows = 0;
    int exit_status = 0;
    bool stopping = false;  // stopping the job at a checkpoint the workers flush for
  } loop_;
};

}  // namespace ember::ps
