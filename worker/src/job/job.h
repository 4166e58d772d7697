// The job around the stages: this worker's place in it (the control plane it joined,
// its rank), what the PS shards serve (their published configuration, checked against
// this worker's data), and its data connections to every shard. The dense collective is
// in collective.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/ps/job_config.h"
#include "ember/ps/ps_client.h"
#include "ember/transport/control.h"
#include "ember/transport/transport.h"
#include "ember/worker/train_config.h"
#include "job/hosts.h"

namespace ember::worker {

// The control plane's barrier generations of the workers' barriers: one before each
// commit of iteration t, one before the commit that follows a flush after t, and the
// last one before leaving after `end` iterations. They must differ, and every worker
// must count them alike.
inline std::uint64_t barrier_before_commit(std::uint64_t t) { return 2 * t; }
inline std::uint64_t barrier_after_flush(std::uint64_t t) { return 2 * t + 1; }
inline std::uint64_t barrier_before_leaving(std::uint64_t end) { return 2 * end + 2; }

class Job {
 public:
  // Opens the data plane's transport (RDMA: says in one line when there is no device),
  // before anything else can fail slowly.
  explicit Job(const TrainConfig& c);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Joins the control plane, checks what the PS serves against `ds` and this worker's
  // options against worker 0's (job_options.h: worker 0 publishes them as the job forms,
  // the others refuse at once on a difference), connects to every shard. Throws
  // ConfigError for a job that does not fit this worker.
  //
  // From then on a watchdog ends the process (exit 6, JobFailed's code) a few seconds
  // after the control plane reports the job failed, if the training thread has not
  // ended it first: a worker blocked where it cannot see the failure (in the all-reduce
  // with a stopped peer, on a PS request) exits within the heartbeat timeout plus
  // kWatchdogGrace, not after Gloo's or the PS client's timeouts.
  void join(const data::Dataset& ds);

  // What to throw for an exception out of training. When the job failed elsewhere (the
  // control plane's word; for an error a peer may have caused, such as a closed
  // connection, waited for up to the heartbeat timeout) it is JobFailed naming that
  // member and cause. Otherwise this worker is the one that failed: it tells the
  // coordinator why (the job fails naming it) and the original error is rethrown.
  [[noreturn]] void fail(std::exception_ptr error);

  static constexpr std::chrono::milliseconds kWatchdogGrace{3000};

  transport::ControlMember& control() { return *control_; }
  ps::PsClient& ps() { return *client_; }
  const ps::JobConfig& ps_config() const { return ps_; }
  std::uint32_t rank() const { return rank_; }
  std::uint32_t dim() const { return ps_.dim; }
  std::uint32_t state_floats() const { return state_; }
  // Which workers share a host (every worker stated its own at the join).
  const HostMap& hosts() const { return hosts_; }

 private:
  // Not worker 0: ConfigError naming every option on which `mine` (job_options.h's
  // OptionValues) differs from worker 0's, by flag, with both values.
  void check_options(const std::vector<std::pair<std::string, std::string>>& mine);

  const TrainConfig& c_;
  transport::Transport data_plane_;
  std::unique_ptr<transport::ControlMember> control_;
  std::unique_ptr<ps::PsClient> client_;
  ps::JobConfig ps_;
  HostMap hosts_;
  std::uint32_t rank_ = 0, state_ = 0;
  std::atomic<bool> watchdog_stop_{false};
  std::thread watchdog_;
};

}  // namespace ember::worker
