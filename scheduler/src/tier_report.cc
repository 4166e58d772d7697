#include "ember/scheduler/tier_report.h"

#include <algorithm>

namespace ember::scheduler {

TierRates per_iteration(const TierReads& t, std::uint64_t iterations) {
  const double its = static_cast<double>(std::max<std::uint64_t>(iterations, 1));
  return {static_cast<double>(t.rows_touched) / its, static_cast<double>(t.reads) / its, static_cast<double>(t.critical_reads) / its};
}

nlohmann::ordered_json tier_json(std::uint64_t budget_bytes, std::uint64_t row_bytes,
                                 const std::vector<std::pair<TierRates, TierRates>>& shards) {
  auto side = [](const TierRates& t) {
    return nlohmann::ordered_json{{"rows_touched_per_iteration", t.rows_touched},
                                  {"reads_per_iteration", t.reads},
                                  {"critical_reads_per_iteration", t.critical_reads},
                                  {"critical_per_row_touched", t.rows_touched > 0 ? t.critical_reads / t.rows_touched : 0.0}};
  };
  nlohmann::ordered_json j = {{"ram_budget_bytes", budget_bytes}, {"row_bytes", row_bytes}};
  auto& out = j["shards"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < shards.size(); ++s)
    out.push_back({{"shard", s}, {"no_hints", side(shards[s].first)}, {"hints", side(shards[s].second)}});
  return j;
}

}  // namespace ember::scheduler
