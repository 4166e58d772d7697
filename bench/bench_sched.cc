// ember-bench sched: scheduling time per global batch (allocation + plan + cache-state
// update) of the Scheduler, single-threaded and with 2 threads, next to a straightforward
// Algorithm 1 measured in the same run on the same batches.
#include "bench_sched.h"

#include <fmt/format.h>

#include "bench_common.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/data/synthetic.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/scheduler/scheduler_config.h"
#include "naive_scheduler.h"
#include "sched_batches.h"

namespace ember::bench {

void add_sched_options(CLI::App& app, SchedBenchOptions& o) {
  scheduler::add_scheduler_options(app, o.shape, kShapeProgram);
  app.add_option("--scale", o.scale, "Criteo Kaggle cardinalities x scale")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed iterations first")->capture_default_str();
  app.add_option("--iterations", o.iterations, "timed iterations")->capture_default_str();
  app.add_option("--lookahead", o.lookahead, "also time a window of L batches with lookahead eviction (0: skip)")->capture_default_str();
  app.add_option("--baseline-iterations", o.baseline_iterations, "timed iterations of the straightforward version")->capture_default_str();
}

int run_sched_bench(const SchedBenchOptions& o, bool json) {
  Output out{json};
  const TempDir dir("ember-bench-sched");
  const std::uint64_t n = static_cast<std::uint64_t>(o.shape.workers) * o.shape.batch_per_worker;
  const std::uint64_t batches = o.warmup + std::max(o.iterations, o.baseline_iterations) + o.lookahead;
  const data::Dataset ds = criteo_like(dir.path(), batches * n, o.scale, out);

  scheduler::SchedulerOptions so = o.shape;
  so.policy = "herald";
  so.seed = 1;
  // Key space of the full tables (the file holds a sample of them), as in Herald.
  so.table_rows = data::synthetic_table_rows(data::SourceFormat::kCriteoTsv, o.scale);
  const scheduler::SchedulerConfig c = scheduler::make_scheduler_config(ds, so);

  // All batches in memory first, so only scheduling is timed.
  const std::vector<scheduler::GlobalBatch> gb = global_batches(ds, n, batches, c.table_offsets);
  // Median ms per batch; with a window of L, showing the batch entering it is timed too.
  auto time_scheduler = [&](int threads, std::uint32_t L, std::size_t& bytes, scheduler::TrafficCounts& traffic, std::uint64_t counted) {
    scheduler::SchedulerConfig cc = c;
    cc.threads = threads;
    cc.lookahead = L;
    cc.eviction = L > 0 ? scheduler::Eviction::kLookahead : scheduler::Eviction::kLru;
    scheduler::Scheduler s(cc);
    std::vector<scheduler::StepPlan> plans;
    std::vector<double> ms;
    for (std::uint64_t i = 0; i < L; ++i) s.look_ahead(gb[i]);
    for (std::uint64_t i = 0; i < o.warmup + o.iterations; ++i) {
      Stopwatch sw;
      if (L > 0) s.look_ahead(gb[i + L]);
      auto st = s.schedule(gb[i], plans);
      const double took = sw.millis();
      if (i >= o.warmup) {
        ms.push_back(took);
        if (i < o.warmup + counted) traffic += st.traffic;
      }
    }
    bytes = s.memory_bytes();
    return median(ms);
  };
  std::size_t bytes = 0, bytes2 = 0;
  scheduler::TrafficCounts t1, t2;
  double m1 = time_scheduler(1, 0, bytes, t1, o.baseline_iterations);
  double m2 = time_scheduler(2, 0, bytes2, t2, o.baseline_iterations);
  std::size_t bytes_l = 0;
  scheduler::TrafficCounts tl;
  const double ml = o.lookahead > 0 ? time_scheduler(1, o.lookahead, bytes_l, tl, 0) : 0.0;

  // The straightforward version on the same batches; its decisions must match.
  NaiveHeraldScheduler naive(o.shape.workers, o.shape.batch_per_worker, c.cache_rows, c.seed);
  std::vector<double> base;
  scheduler::TrafficCounts tb;
  for (std::uint64_t i = 0; i < o.warmup + o.baseline_iterations; ++i) {
    Stopwatch sw;
    auto t = naive.schedule(gb[i]);
    double ms = sw.millis();
    if (i >= o.warmup) {
      base.push_back(ms);
      tb += t;
    }
  }
  double mb = median(base);
  bool agree = tb.transmissions() == t1.transmissions() && tb.hits == t1.hits && t1.transmissions() == t2.transmissions();
  if (!agree) {
    throw Error(fmt::format("the straightforward scheduler disagrees: {} vs {} transmissions", tb.transmissions(), t1.transmissions()));
  }
  const double slots = static_cast<double>(c.cache_rows) * o.shape.workers;
  out.text(fmt::format(
      "herald, {} workers x {} samples, {} tables, {} key rows, cache {} rows per worker; median over {} batches after {} warm-up\n"
      "{:<44}{:>12}\n{:<44}{:>12.3f}\n{:<44}{:>12.3f}\n{:<44}{:>12.3f}\n{:<44}{:>12.1f}\n{:<44}{:>12.1f}\n{:<44}{:>12.0f}\n{:<44}{:>12}\n",
      o.shape.workers, o.shape.batch_per_worker, c.table_offsets.size(), c.num_keys, c.cache_rows, o.iterations, o.warmup, "figure",
      "value", "median ms per batch, 1 thread", m1, "median ms per batch, 2 threads", m2,
      fmt::format("straightforward Algorithm 1, median ms ({} it.)", o.baseline_iterations), mb, "speedup vs straightforward (1 thread)",
      mb / m1, "scheduler bytes per cache slot", static_cast<double>(bytes) / slots, "scheduler MB", static_cast<double>(bytes) / 1e6,
      "decisions agree with the straightforward version", agree ? "yes" : "no"));
  if (o.lookahead > 0) {
    out.text(fmt::format("{:<44}{:>12.3f}\n{:<44}{:>12.2f}\n{:<44}{:>12.1f}\n",
                         fmt::format("lookahead {} + its eviction, median ms, 1 thread", o.lookahead), ml,
                         fmt::format("lookahead {} vs none (same run)", o.lookahead), ml / m1, "scheduler MB with lookahead",
                         static_cast<double>(bytes_l) / 1e6));
    out.text("target: lookahead 4 at most 2x the time of none\n");
  }
  out.text("targets: <= 2 ms per batch on one core, >= 10x the straightforward version\n");
  out.row({{"bench", "sched"},
           {"workers", o.shape.workers},
           {"batch_per_worker", o.shape.batch_per_worker},
           {"tables", c.table_offsets.size()},
           {"key_rows", c.num_keys},
           {"cache_rows", c.cache_rows},
           {"median_ms", m1},
           {"median_ms_2threads", m2},
           {"baseline_median_ms", mb},
           {"speedup", mb / m1},
           {"bytes_per_cache_slot", static_cast<double>(bytes) / slots},
           {"scheduler_mb", static_cast<double>(bytes) / 1e6},
           {"agree", agree},
           {"lookahead", o.lookahead},
           {"lookahead_median_ms", ml},
           {"lookahead_ratio", o.lookahead > 0 ? ml / m1 : 0.0},
           {"lookahead_scheduler_mb", static_cast<double>(bytes_l) / 1e6}});
  return 0;
}

}  // namespace ember::bench
