// HostSchedulers: the job's schedulers as a job of several hosts runs them, one per host
// (SchedulerConfig::model_host), side by side in one process. Each models its own
// host's caches and every row's state; after each iteration each one's evictions go to
// all the others (Scheduler::evictions, apply_evictions), as the hosts exchange them.
// Every worker's plan comes from its own host's scheduler, and equals the plan of one
// Scheduler that models every worker (tests check it; `ember-sim --scheduler-per-host` shows it).
// What one host's scheduler holds and takes is what one process of the job holds and
// takes (docs/scheduler.md "State per process").
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ember/scheduler/scheduler.h"

namespace ember::scheduler {

class HostSchedulers {
 public:
  // c.host_of: every worker's host (hosts numbered from 0, each with a worker).
  explicit HostSchedulers(const SchedulerConfig& c);

  std::uint32_t hosts() const { return static_cast<std::uint32_t>(hosts_.size()); }
  const Scheduler& host(std::uint32_t h) const { return hosts_[h]; }
  const SchedulerConfig& config() const { return config_; }

  // As Scheduler's, for every host.
  void look_ahead(const GlobalBatch& batch);
  template <typename Next>
  void look_ahead_through(std::uint64_t t, std::uint64_t end, Next&& next) {
    for (std::uint64_t until = std::min<std::uint64_t>(end, t + config_.lookahead + 1); config_.lookahead > 0 && shown_until() < until;) {
      next(batch_);
      look_ahead(batch_);
    }
  }
  std::uint64_t shown_until() const { return hosts_.front().shown_until(); }
  // Every worker's plan, each from its host's scheduler; the traffic summed over the
  // hosts; sched_ms: the slowest host's (the job waits for it), scoring likewise.
  IterationStats schedule(const GlobalBatch& batch, std::vector<StepPlan>& plans);
  TrafficCounts flush(std::vector<StepPlan>& plans, bool evaluation = false);
  // Each host's scheduling time of the last batch (ms), and its state's bytes.
  const std::vector<double>& last_ms() const { return last_ms_; }
  std::size_t memory_bytes(std::uint32_t h) const { return hosts_[h].memory_bytes(); }
  // The most any host's scheduler holds: what one process of the job holds.
  std::size_t memory_bytes() const {
    std::size_t b = 0;
    for (const Scheduler& s : hosts_) b = std::max(b, s.memory_bytes());
    return b;
  }
  const WorkerCache& cache_of(WorkerId w) const { return hosts_[config_.host_of[w]].cache_of(w); }

 private:
  // Host h's workers' plans (in mine_, its scheduler's) moved into the job's.
  void take_plans(std::uint32_t h, std::vector<StepPlan>& plans);

  SchedulerConfig config_;
  std::vector<Scheduler> hosts_;
  std::vector<double> last_ms_;
  std::vector<StepPlan> mine_;       // one host's plans
  std::vector<RowEviction> others_;  // the evictions a host gets
  GlobalBatch batch_;
};

}  // namespace ember::scheduler
