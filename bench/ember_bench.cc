// ember-bench: Ember's benchmarks. Each subcommand measures a baseline in the same run
// and prints ratios against it (shared machines are noisy: absolute times are not).
#include <CLI/CLI.hpp>

#include "bench_bags.h"
#include "bench_cache.h"
#include "bench_data.h"
#include "bench_options.h"
#include "bench_ps.h"
#include "bench_scale.h"
#include "bench_sched.h"
#include "ember/common/cli.h"
#include "ember/common/main.h"

namespace {

using namespace ember::bench;

// ember-bench's command line: the flag of every subcommand, and each one's options (each
// declares its own, bench_*.cc).
struct Flags {
  bool json = false;
  DataBenchOptions data;
  SchedBenchOptions sched;
  ScaleBenchOptions scale;
  PsBenchOptions ps;
  CacheBenchOptions cache;
  BagsBenchOptions bags;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-bench: Ember's benchmarks"};
  app.require_subcommand(1);
  app.fallthrough();  // --json before or after the subcommand (subcommands inherit this)
  Flags f;
  ember::add_options(app, {bench_flag("--json", &Flags::json, "one JSON object per result line")}, f, ember::kBenchProgram);
  auto* data = app.add_subcommand("data", "prep throughput vs plain read, peak RSS, reader samples/s");
  add_data_options(*data, f.data);
  auto* sched = app.add_subcommand("sched", "scheduling time per global batch vs a straightforward Algorithm 1");
  add_sched_options(*sched, f.sched);
  auto* scale = app.add_subcommand("scale", "the scheduler from 8 to 1024 workers: the whole job's vs one host's, per process");
  add_scale_options(*scale, f.scale);
  auto* ps = app.add_subcommand("ps", "PS pull/push throughput over TCP loopback vs raw sockets; small-pull latency");
  add_ps_options(*ps, f.ps);
  auto* cache = app.add_subcommand("cache", "embedding cache gather / scatter-add GB/s vs a copy of the same bytes (GPU or host)");
  add_cache_options(*cache, f.cache);
  auto* bags = app.add_subcommand("bags", "a worker's embedding work on a dataset's ids: the fused kernels vs a bare loop (ns per id)");
  add_bags_options(*bags, f.bags);

  if (const int status = ember::parse_command_line(app, argc, argv, "ember-bench"); status >= 0) return status;
  return ember::guarded_main("ember-bench", [&] {
    if (*data) return run_data_bench(f.data, f.json);
    if (*sched) return run_sched_bench(f.sched, f.json);
    if (*scale) return run_scale_bench(f.scale, f.json);
    if (*cache) return run_cache_bench(f.cache, f.json);
    if (*bags) return run_bags_bench(f.bags, f.json);
    return run_ps_bench(f.ps, f.json);
  });
}
