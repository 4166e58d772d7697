// Which of a host's gradient parts may cross to the shard as one sum (per-host
// aggregation, docs/checkpoints.md "Flushes under per-host aggregation").
//
// A shard sums one host's parts of a row (one iteration's gradients, one per trainer on
// that host) in an order fixed by their bytes, whichever phase each left in. A part that
// is already a sum of some of them ((a + b), with c to come) rounds unlike that, so a
// phase may sum a host's parts of a row only when it pushes all of them; then the host
// sums them in the shard's order. When the parts leave in different phases (evicted at
// one iteration, pushed at the next, or all at a flush) each goes on its own.
// HostParts counts, for one host, the parts each row has still to push. The workers
// (worker/src/host/host_plans.cc) and ember-sim (links_aggregated) decide with it, from
// the same plans in the same order: the phases of an iteration before its training
// (sync, evictions), the rows trained, then the end pushes and a flush.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/scheduler/step_plan.h"

namespace ember::scheduler {

class HostParts {
 public:
  // The host's plans of one iteration: each row trained there whose gradient goes to a
  // shard on another host (`across`) has a part per worker that trains it.
  void trained(const std::vector<const StepPlan*>& host_plans, const std::function<bool(Key)>& across);
  // A phase pushes `parts` of the row's parts from this host: whether they may leave as
  // one sum (all the row's parts, or a row not counted here). Counts them off.
  bool take(Key key, std::uint32_t parts);
  // Rows with parts still to push.
  std::size_t pending() const { return rows_.size(); }

 private:
  struct Parts {
    std::uint32_t trainers = 0;  // the host's trainers of the row in its iteration
    std::uint32_t left = 0;      // parts not pushed yet
  };
  U64Map<Parts> rows_;
};

}  // namespace ember::scheduler
