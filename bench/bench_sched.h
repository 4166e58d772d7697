#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/scheduler/scheduler_config.h"

namespace ember::bench {

struct SchedBenchOptions {
  // The job's shape (workers, batch_per_worker, cache_ratio: --workers, ...); the
  // benchmark schedules herald with seed 1.
  scheduler::SchedulerOptions shape;
  double scale = 1.0;  // Criteo Kaggle cardinalities x scale
  std::uint64_t warmup = 100;
  std::uint64_t iterations = 200;
  std::uint64_t baseline_iterations = 30;
  std::uint32_t lookahead = 4;  // also timed with this window and lookahead eviction (0: not)
  // Bags (ember-data gen --multi-hot, e.g. "mlperf"): timed beside one-hot data of the
  // same tables in the same run; empty: one-hot only.
  std::string multi_hot;
  std::string multi_hot_dist = "uniform";  // the bags' extra ids: uniform or zipf
  std::vector<int> thread_counts{1, 2};    // scheduler threads timed, in order (the first is the reference)
};

void add_sched_options(CLI::App& app, SchedBenchOptions& o);
int run_sched_bench(const SchedBenchOptions& o, bool json);

}  // namespace ember::bench
