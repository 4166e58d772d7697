// A placement: per embedding table, how the system serves it (docs/planner.md). Written
// by `ember-plan --plan-out`, read by ember-worker, ember-sim and the launcher
// (--placement plan.json); no placement = every table on the PS + cache.
//   cache       rows on the PS, cached by the workers under the policy (the default);
//   replicated  every worker holds the whole table and its optimizer state; the rows a
//               global batch touches are all-reduced with the dense gradients (fae's
//               mechanism): the PS and the cache never see them during training;
//   uncached    rows pulled for the iteration into staging slots (no cache slot), their
//               gradients pushed at its end, the copies dropped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ember/data/dataset.h"

namespace ember::scheduler {

enum class Treatment : std::uint8_t { kCache, kReplicated, kUncached };
const char* treatment_name(Treatment t);  // "cache", "replicated", "uncached"
Treatment parse_treatment(const std::string& s);

// The plan file: format version, the dataset's tables and rows, per table the treatment,
// the cache rows per worker (the LRU the cached tables share), and the samples per worker
// the plan was made for (its staging and cache depend on them; 0: not said).
inline constexpr int kPlanFormat = 1;
struct PlanFile {
  std::vector<std::string> names;
  std::vector<std::uint64_t> rows;
  std::vector<Treatment> treatments;
  std::uint32_t cache_rows = 0;
  std::uint32_t batch_per_worker = 0;
  // Per table, rows of the cache it holds alone (a cached table's LRU of its own), or 0:
  // it shares the rest of cache_rows (the pool) with the other cached tables. Empty: all share.
  std::vector<std::uint32_t> cache_shares;
};
// Written whole or not at all (a temporary file, then renamed). Throws IoError.
void write_plan(const std::filesystem::path& path, const PlanFile& plan);
// Throws ConfigError naming the first table that differs from the dataset's (one line).
PlanFile read_plan(const std::filesystem::path& path, const data::Dataset& ds);

}  // namespace ember::scheduler
