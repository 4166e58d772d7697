#include "row_updates.h"

#include <algorithm>
#include <vector>

namespace ember::worker {

void update_rows(const scheduler::StepPlan& p, std::uint64_t t, bool on_demand, const ps::OptimizerConfig& optimizer, RowCache& cache,
                 PsExchange& exchange) {
  std::vector<std::uint32_t> sole, pushed;
  // Peer sync's host-applied rows: applied by their first trainer once the others'
  // gradients are in (PsExchange::finish_host_apply); handed over and dropped by the others.
  std::vector<std::uint32_t> handed;
  for (const auto& g : p.hand_grads) handed.push_back(g.slot);
  std::sort(handed.begin(), handed.end());
  for (const auto& r : p.rows) {
    if (r.host_apply) {
      if (std::binary_search(handed.begin(), handed.end(), r.slot)) pushed.push_back(r.slot);
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
