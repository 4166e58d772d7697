// A disk tier's prediction as ember-sim and ember-plan report it (--ram-budget-mb, the
// "tier" object of --json): one shape, so that the two tools compare key for key.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "ember/scheduler/simulator.h"

namespace ember::scheduler {

// {"ram_budget_bytes", "row_bytes", "shards": [{"shard", "no_hints": RATES, "hints":
// RATES}]}, RATES: rows_touched_per_iteration, reads_per_iteration,
// critical_reads_per_iteration, critical_per_row_touched. Per shard: without hints, with.
nlohmann::ordered_json tier_json(std::uint64_t budget_bytes, std::uint64_t row_bytes,
                                 const std::vector<std::pair<TierRates, TierRates>>& shards);

}  // namespace ember::scheduler
