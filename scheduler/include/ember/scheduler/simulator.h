// The cache simulator behind `ember-sim`: replays a dataset's global batches through
// the Scheduler (the same code the workers run) and counts every row that would cross
// the network.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/scheduler/scheduler.h"

namespace ember::scheduler {

struct SimOptions {
  std::uint32_t workers = 8;
  std::uint32_t batch_per_worker = 128;
  double cache_ratio = 0.1;     // cache rows per worker = ceil(ratio x total rows)
  std::uint64_t iterations = 100;
  std::uint64_t warmup = 10;    // first iterations not counted
  std::uint64_t seed = 1;
  bool shuffle = false;         // global batches from a seeded permutation
  int threads = 1;
  double budget_ms = 0;         // adaptive LAIA
  std::uint32_t partitions = 1;
  bool digest = false;          // hash every plan of every worker (determinism checks)
  // Rows per table of the key space (and so of the cache ratio), when the dataset saw
  // only part of each table (a short synthetic file); empty = the manifest's rows.
  std::vector<std::uint64_t> table_rows;
  std::function<void(const std::string& policy, std::uint64_t done, std::uint64_t total)> on_progress;
};

struct SimResult {
  std::string policy;
  TrafficCounts traffic;        // summed over the counted iterations
  std::uint64_t iterations = 0; // counted
  std::uint32_t cache_rows = 0;
  double sched_ms_mean = 0, sched_ms_median = 0;
  double laia_tables_mean = 0;
  double scoring_ms_mean = 0;
  std::size_t scheduler_bytes = 0;
  std::uint64_t cached_rows = 0;  // rows held in all caches at the end
  std::uint64_t plan_digest = 0;  // with SimOptions::digest
  std::vector<TrafficCounts> per_iteration;  // counted iterations only

  double hit_rate() const {
    double total = static_cast<double>(traffic.hits + traffic.pulls);
    return total > 0 ? static_cast<double>(traffic.hits) / total : 0.0;
  }
};

// Global key offsets per table: from SimOptions::table_rows when given (each at least
// the manifest's rows), else from the manifest. The last element is the key space size.
std::vector<std::uint64_t> key_space(const data::Dataset& ds, const SimOptions& o);

// Cache rows per worker for a ratio of the key space.
std::uint32_t cache_rows_for(double ratio, std::uint64_t total_rows);

// Rows of the `fraction` most frequently accessed keys in the first `batches` global
// batches (FAE's offline profile); hot[k] = 1.
std::vector<std::uint8_t> profile_hot_rows(const data::Dataset& ds, const SimOptions& o, double fraction);

// A stable hash of a worker's plan (every list, in order).
std::uint64_t plan_hash(const StepPlan& plan, std::uint64_t seed);

// Runs one policy. Throws ConfigError for impossible configurations.
SimResult simulate(const data::Dataset& ds, const Policy& policy, const SimOptions& options);

}  // namespace ember::scheduler
