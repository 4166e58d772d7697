#include "stages/row_updates.h"

#include <vector>

namespace ember::worker {

void update_rows(const scheduler::StepPlan& p, std::uint64_t t, bool on_demand, const ps::OptimizerConfig& optimizer, RowCache& cache,
                 PsExchange& exchange) {
  std::vector<std::uint32_t> sole, pushed;
  for (const auto& r : p.rows) {
    // Peer sync's host-applied rows: applied by their first trainer once the others'
    // gradients are in (HostExchange::finish_apply); handed over and dropped by the others.
    if (r.host == scheduler::HostApply::kApplies) continue;
    if (r.host == scheduler::HostApply::kHands) {
      pushed.push_back(r.slot);
    } else if (r.uncached) {
      pushed.push_back(r.slot);  // its gradient went out with the end pushes; dropped below
    } else if (r.trainers == 1) {
      sole.push_back(r.slot);
    } else if (on_demand) {
      exchange.keep_partial(r.slot, t, r.trainers);
    } else {
      pushed.push_back(r.slot);  // its gradient went out with the end pushes
    }
  }
  cache.apply(sole, optimizer, optimizer.lr);
  cache.zero_grad(pushed);
}

}  // namespace ember::worker
