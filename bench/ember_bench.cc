// ember-bench: Ember's benchmarks. Each subcommand measures a baseline in the same run
// and prints ratios against it (shared machines are noisy: absolute times are not).
#include <CLI/CLI.hpp>

#include "bench_bags.h"
#include "bench_cache.h"
#include "bench_data.h"
#include "bench_ps.h"
#include "bench_scale.h"
#include "bench_sched.h"
#include "ember/common/main.h"

int main(int argc, char** argv) {
  CLI::App app{"ember-bench: Ember's benchmarks"};
  app.require_subcommand(1);
  app.fallthrough();  // --json before or after the subcommand (subcommands inherit this)
  ember::bench::DataBenchOptions data_opts;
  bool json = false;
  app.add_flag("--json", json, "one JSON object per result line");
  auto* data = app.add_subcommand("data", "prep throughput vs plain read, peak RSS, reader samples/s");
  ember::bench::add_data_options(*data, data_opts);
  ember::bench::SchedBenchOptions sched_opts;
  auto* sched = app.add_subcommand("sched", "scheduling time per global batch vs a straightforward Algorithm 1");
  ember::bench::add_sched_options(*sched, sched_opts);
  ember::bench::ScaleBenchOptions scale_opts;
  auto* scale = app.add_subcommand("scale", "the scheduler from 8 to 1024 workers: the whole job's vs one host's, per process");
  ember::bench::add_scale_options(*scale, scale_opts);
  ember::bench::PsBenchOptions ps_opts;
  auto* ps = app.add_subcommand("ps", "PS pull/push throughput over TCP loopback vs raw sockets; small-pull latency");
  ember::bench::add_ps_options(*ps, ps_opts);
  ember::bench::CacheBenchOptions cache_opts;
  auto* cache = app.add_subcommand("cache", "embedding cache gather / scatter-add GB/s vs a copy of the same bytes (GPU or host)");
  ember::bench::add_cache_options(*cache, cache_opts);
  ember::bench::BagsBenchOptions bags_opts;
  auto* bags = app.add_subcommand("bags", "a worker's embedding work on a dataset's ids: the fused kernels vs a bare loop (ns per id)");
  ember::bench::add_bags_options(*bags, bags_opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ember::guarded_main("ember-bench", [&] {
    if (*data) return ember::bench::run_data_bench(data_opts, json);
    if (*sched) return ember::bench::run_sched_bench(sched_opts, json);
    if (*scale) return ember::bench::run_scale_bench(scale_opts, json);
    if (*cache) return ember::bench::run_cache_bench(cache_opts, json);
    if (*bags) return ember::bench::run_bags_bench(bags_opts, json);
    return ember::bench::run_ps_bench(ps_opts, json);
  });
}
