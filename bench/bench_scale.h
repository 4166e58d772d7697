#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ember::bench {

struct ScaleBenchOptions {
  std::string workers = "8,16,32,64,128,256,512,1024";  // the job sizes, comma-separated
  std::uint32_t per_host = 8;                           // workers per host
  std::uint32_t batch_per_worker = 128;
  double scale = 0.01;       // Criteo Kaggle cardinalities x scale: the key space, the same at every size
  double cache_ratio = 0.1;  // cache rows per worker = ratio x key rows: the same at every size
  std::uint64_t warmup = 3;  // untimed iterations first
  std::uint64_t iterations = 8;
  std::uint32_t lookahead = 0;  // also a window of this many batches (lookahead eviction)
  bool refine = false;          // refined allocation
};

void add_scale_options(CLI::App& app, ScaleBenchOptions& o);
int run_scale_bench(const ScaleBenchOptions& o, bool json);

}  // namespace ember::bench
