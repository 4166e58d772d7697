#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::bench {

// ember-bench bags: the memory's rate for a worker's embedding work on a dataset's real
// ids. For each batch size, the dataset's first global batches (its ids, its bags) are
// gathered and pooled from a table of its rows, then their gradients scatter-added back:
// by a bare loop (no prefetch, no dedup, the plainest C) and by the fused embedding
// path's kernels (cache/bag_pool.h), on the same threads. scripts/bench_pipeline.py sets
// the whole pipeline's cost per id beside the bare loop's.
struct BagsBenchOptions {
  std::string dataset;
  std::vector<std::uint32_t> batches{1024, 4096};  // samples per batch
  std::uint32_t count = 8;                         // batches timed per repeat
  std::uint32_t dim = 16;
  std::uint32_t threads = 1;
  std::string pooling = "sum";
  int repeats = 5;  // medians reported
};

void add_bags_options(CLI::App& app, BagsBenchOptions& o);
int run_bags_bench(const BagsBenchOptions& o, bool json);

}  // namespace ember::bench
