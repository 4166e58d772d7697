// The DoI profiler of adaptive LAIA (Herald 4.3; SchedulerConfig::budget_ms > 0): counts
// each row's accesses, estimates each table's DoI every few iterations from a sample of
// the cached rows, and picks the tables LAIA scores: the k of highest DoI that fit the
// scoring budget. Without a budget it scores every table. A copyable value.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/worker_cache.h"

namespace ember::scheduler {

class DoiProfiler {
 public:
  DoiProfiler() = default;
  DoiProfiler(const SchedulerConfig& c, std::uint32_t tables);

  // After LAIA scored iteration `iteration`'s batch in scoring_ms: counts its rows'
  // accesses and the scoring cost per table; every kDoiInterval iterations profiles the
  // DoI over the caches `lru` and picks the tables to score.
  void record(const SchedulerConfig& c, const GlobalBatch& batch, double scoring_ms, std::uint64_t iteration, const WorkerCaches& lru);

  // Each table's DoI as last profiled, and the tables to score (ascending).
  const std::vector<double>& doi() const { return doi_; }
  const std::vector<std::uint32_t>& scored_tables() const { return scored_tables_; }
  std::size_t memory_bytes() const { return access_.capacity() * sizeof(std::uint32_t); }

 private:
  void profile(const SchedulerConfig& c, std::uint64_t iteration, const WorkerCaches& lru);

  std::uint32_t tables_ = 0;
  std::vector<std::uint32_t> access_;  // accesses per key (with a budget)
  std::vector<double> doi_;
  std::vector<std::uint32_t> scored_tables_;
  double table_cost_ms_ = 0;  // EMA of scoring time per table per batch
};

}  // namespace ember::scheduler
