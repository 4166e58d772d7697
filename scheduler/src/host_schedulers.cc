#include "ember/scheduler/host_schedulers.h"

#include <string>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/process.h"

namespace ember::scheduler {

HostSchedulers::HostSchedulers(const SchedulerConfig& c) : config_(c) {
  if (c.host_of.size() != c.workers) {
    throw ConfigError("a scheduler per host needs every worker's host (" + std::to_string(c.host_of.size()) + " given for " +
                      std::to_string(c.workers) + " workers)");
  }
  const std::uint32_t H = *std::max_element(c.host_of.begin(), c.host_of.end()) + 1;
  hosts_.reserve(H);
  for (std::uint32_t h = 0; h < H; ++h) {
    SchedulerConfig one = c;
    one.model_host = static_cast<int>(h);
    one.hand_evaluated_rows = false;  // worker 0 would not know the other hosts' rows
    hosts_.emplace_back(std::move(one));
  }
  last_ms_.assign(H, 0.0);
}

void HostSchedulers::look_ahead(const GlobalBatch& batch) {
  for (Scheduler& s : hosts_) s.look_ahead(batch);
}

void HostSchedulers::take_plans(std::uint32_t h, std::vector<StepPlan>& plans) {
  for (std::uint32_t w = 0; w < config_.workers; ++w) {
    if (config_.host_of[w] == h) plans[w] = std::move(mine_[w]);
  }
}

IterationStats HostSchedulers::schedule(const GlobalBatch& batch, std::vector<StepPlan>& plans) {
  plans.resize(config_.workers);
  IterationStats all;
  for (std::uint32_t h = 0; h < hosts(); ++h) {
    Stopwatch sw;
    const IterationStats st = hosts_[h].schedule(batch, mine_);
    last_ms_[h] = sw.millis();
    all.traffic += st.traffic;
    all.sched_ms = std::max(all.sched_ms, st.sched_ms);
    all.scoring_ms = std::max(all.scoring_ms, st.scoring_ms);
    all.laia_tables = st.laia_tables;
    take_plans(h, plans);
  }
  // The exchange: each host gets every other host's evictions.
  if (hosts() > 1) {
    others_.clear();
    for (const Scheduler& s : hosts_) others_.insert(others_.end(), s.evictions().begin(), s.evictions().end());
    for (Scheduler& s : hosts_) s.apply_evictions(others_);
  }
  return all;
}

TrafficCounts HostSchedulers::flush(std::vector<StepPlan>& plans, bool evaluation) {
  plans.resize(config_.workers);
  TrafficCounts all;
  for (std::uint32_t h = 0; h < hosts(); ++h) {
    all += hosts_[h].flush(mine_, evaluation);
    take_plans(h, plans);
  }
  return all;
}

}  // namespace ember::scheduler
