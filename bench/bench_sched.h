#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

namespace ember::bench {

struct SchedBenchOptions {
  std::uint32_t workers = 8;
  std::uint32_t batch_per_worker = 128;
  double cache_ratio = 0.1;
  double scale = 1.0;  // Criteo Kaggle cardinalities x scale
  std::uint64_t warmup = 100;
  std::uint64_t iterations = 200;
  std::uint64_t baseline_iterations = 30;
  std::uint32_t lookahead = 4;  // also timed with this window and lookahead eviction (0: not)
};

void add_sched_options(CLI::App& app, SchedBenchOptions& o);
int run_sched_bench(const SchedBenchOptions& o, bool json);

}  // namespace ember::bench
