#pragma once

#include <CLI/CLI.hpp>

namespace ember::bench {

struct PsBenchOptions {
  double seconds = 1.0;          // per case
  std::uint32_t rows_per_request = 1024;
  std::uint64_t num_keys = 1u << 20;
};

void add_ps_options(CLI::App& app, PsBenchOptions& o);
int run_ps_bench(const PsBenchOptions& o, bool json);

}  // namespace ember::bench
