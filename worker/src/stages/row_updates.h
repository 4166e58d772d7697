// Stage 4, the row updates after training, as the row-state contract has them
// (docs/design.md): a row this worker trained alone gets the sparse optimizer here, with
// the PS's own code (latest-dirty under on-demand policies, latest-clean under full-set
// ones, whose end push already told the PS); a row several workers trained keeps its
// gradient as a partial (on-demand) or had it pushed (full-set: zeroed here), as had an
// uncached row. (The plan's drops leave the scheduler's model of the cache; a dropped slot
// is simply filled again when the plan reuses it.)
#pragma once

#include <cstdint>

#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/step_plan.h"
#include "ember/worker/row_cache.h"
#include "stages/ps_exchange.h"

namespace ember::worker {

void update_rows(const scheduler::StepPlan& p, std::uint64_t t, bool on_demand, const ps::OptimizerConfig& optimizer, RowCache& cache,
                 PsExchange& exchange);

}  // namespace ember::worker
