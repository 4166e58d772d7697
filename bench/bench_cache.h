#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::bench {

// ember-bench cache: the embedding cache's gather and scatter-add (the worker step's row
// traffic) against a plain copy of the same bytes, on the GPU (CudaEmbeddingCache vs
// cudaMemcpy device to device) or the host (EmbeddingCache vs memcpy).
struct CacheBenchOptions {
  std::string device = "cuda";  // cuda or cpu
  std::vector<std::uint32_t> dims{16, 64, 128};
  std::vector<std::uint32_t> rows{16384, 65536, 262144};  // cache slots, and ids per batch
  int repeats = 20;                                       // timed launches per case; medians reported
  std::uint64_t seed = 1;
};

void add_cache_options(CLI::App& app, CacheBenchOptions& o);
int run_cache_bench(const CacheBenchOptions& o, bool json);

}  // namespace ember::bench
