#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace ember::bench {

struct DataBenchOptions {
  double size_mb = 1000;     // size of the generated Criteo-like file
  double scale = 1.0;        // table cardinalities (1 = full Kaggle)
  std::string dir;           // work directory (default: a temp dir, removed after)
  int repeats = 3;           // plain-read and reader repeats (medians)
  std::size_t batch = 1024;  // reader global batch (8 workers x 128)
  int threads = 0;
};

void add_data_options(CLI::App& app, DataBenchOptions& o);
int run_data_bench(const DataBenchOptions& o, bool json);

}  // namespace ember::bench
