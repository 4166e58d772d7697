// ember-bench sched: scheduling time per global batch (allocation + plan + cache-state
// update) of the Scheduler at each thread count asked, next to a straightforward
// Algorithm 1 measured in the same run on the same batches; with --multi-hot, on bags
// and on one-hot data of the same tables, per id and per sample.
#include "bench_sched.h"

#include <fmt/format.h>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/data/synthetic.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/simulator.h"
#include "naive_scheduler.h"
#include "sched_batches.h"

namespace ember::bench {
namespace {

// One data shape's figures: median ms per batch at each thread count (as asked), the
// straightforward version's, ids per batch.
struct ShapeTimes {
  std::string name;
  std::vector<double> ms;
  double baseline_ms = 0;
  double ids = 0, samples = 0;
  std::size_t bytes = 0;
  double lookahead_ms = 0;
  std::size_t lookahead_bytes = 0;
  double ns_per_id(std::size_t i = 0) const { return ms[i] * 1e6 / ids; }
  double us_per_sample(std::size_t i = 0) const { return ms[i] * 1e3 / samples; }
};

// Median ms per batch of herald on `gb` with `threads` and a window of L; the traffic of
// the first `counted` batches after the warm-up (timed or not).
double time_scheduler(const scheduler::SchedulerConfig& c, const SchedBenchOptions& o, const std::vector<scheduler::GlobalBatch>& gb,
                      int threads, std::uint32_t L, std::size_t& bytes, scheduler::TrafficCounts& traffic, std::uint64_t counted) {
  scheduler::SchedulerConfig cc = c;
  cc.threads = threads;
  cc.lookahead = L;
  cc.eviction = L > 0 ? scheduler::Eviction::kLookahead : scheduler::Eviction::kLru;
  scheduler::Scheduler s(cc);
  std::vector<scheduler::StepPlan> plans;
  std::vector<double> ms;
  for (std::uint64_t i = 0; i < L; ++i) s.look_ahead(gb[i]);
  // Past the timed batches when more are counted (--baseline-iterations above
  // --iterations): the comparison needs the same batches on both sides.
  for (std::uint64_t i = 0; i < o.warmup + std::max(o.iterations, counted); ++i) {
    Stopwatch sw;
    if (L > 0) s.look_ahead(gb[i + L]);  // showing the batch entering the window is timed too
    auto st = s.schedule(gb[i], plans);
    const double took = sw.millis();
    if (i < o.warmup) continue;
    if (i < o.warmup + o.iterations) ms.push_back(took);
    if (i < o.warmup + counted) traffic += st.traffic;
  }
  bytes = s.memory_bytes();
  return median(ms);
}

// Times one data shape: every thread count (the plans' traffic must not depend on it),
// the straightforward version (its decisions must match), and lookahead if asked.
ShapeTimes time_shape(const std::string& name, const data::Dataset& ds, const SchedBenchOptions& o, bool lookahead) {
  const std::uint64_t n = static_cast<std::uint64_t>(o.shape.workers) * o.shape.batch_per_worker;
  scheduler::SchedulerOptions so = o.shape;
  so.policy = "herald";
  so.seed = 1;
  // Key space of the full tables (the file holds a sample of them), as in Herald.
  so.table_rows = data::synthetic_table_rows(data::SourceFormat::kCriteoTsv, o.scale);
  const scheduler::SchedulerConfig c = scheduler::make_scheduler_config(ds, so);
  const std::uint64_t batches = o.warmup + std::max(o.iterations, o.baseline_iterations) + o.lookahead;
  // All batches in memory first, so only scheduling is timed.
  const std::vector<scheduler::GlobalBatch> gb = global_batches(ds, n, batches, c.table_offsets);
  ShapeTimes r;
  r.name = name;
  for (std::uint64_t i = o.warmup; i < o.warmup + o.iterations; ++i) r.ids += static_cast<double>(gb[i].keys.size());
  r.ids /= static_cast<double>(o.iterations);
  r.samples = static_cast<double>(n);
  std::vector<scheduler::TrafficCounts> traffic(o.thread_counts.size());
  for (std::size_t j = 0; j < o.thread_counts.size(); ++j) {
    std::size_t bytes = 0;
    r.ms.push_back(time_scheduler(c, o, gb, o.thread_counts[j], 0, bytes, traffic[j], o.baseline_iterations));
    if (j == 0) r.bytes = bytes;
    if (traffic[j].transmissions() != traffic[0].transmissions() || traffic[j].hits != traffic[0].hits) {
      throw Error(fmt::format("{}: {} threads plan {} transmissions, {} thread(s) {}", name, o.thread_counts[j], traffic[j].transmissions(),
                              o.thread_counts[0], traffic[0].transmissions()));
    }
  }
  if (lookahead && o.lookahead > 0) {
    scheduler::TrafficCounts unused;
    r.lookahead_ms = time_scheduler(c, o, gb, o.thread_counts[0], o.lookahead, r.lookahead_bytes, unused, 0);
  }
  if (c.admission != scheduler::Admission::kNone) return r;  // the straightforward version admits every row
  NaiveHeraldScheduler naive(o.shape.workers, o.shape.batch_per_worker, c.cache_rows, c.seed);
  std::vector<double> base;
  scheduler::TrafficCounts tb;
  for (std::uint64_t i = 0; i < o.warmup + o.baseline_iterations; ++i) {
    Stopwatch sw;
    auto t = naive.schedule(gb[i]);
    const double ms = sw.millis();
    if (i >= o.warmup) {
      base.push_back(ms);
      tb += t;
    }
  }
  r.baseline_ms = median(base);
  if (tb.transmissions() != traffic[0].transmissions() || tb.hits != traffic[0].hits) {
    throw Error(fmt::format("{}: the straightforward scheduler disagrees: {} vs {} transmissions", name, tb.transmissions(),
                            traffic[0].transmissions()));
  }
  return r;
}

// Herald on the same rows with hashed ids and with the vocabulary's rows, batch by batch
// in turn (so that the machine's drift falls on both): for hashed ids each batch's ids are
// made slots by the KeyDirectory (timed with the scheduling), with the vocabulary's cache
// rows, at the first thread count. Medians of ms a batch and of the per-batch ratios.
struct HashedTimes {
  double vocabulary_ms = 0, hashed_ms = 0, ratio = 0;
  std::size_t hashed_bytes = 0;
};

// `expire_after`, `cap`: the directory's expiry and cap (0: none; with either, it keeps
// its recency lists, and drops rows).
HashedTimes time_hashed(const data::Dataset& hashed, const data::Dataset& vocab, const SchedBenchOptions& o, std::uint64_t expire_after,
                        std::uint64_t cap) {
  scheduler::SchedulerOptions so = o.shape;
  so.expire_after = expire_after;
  so.shard_max_rows = cap;
  so.policy = "herald";
  so.seed = 1;
  so.table_rows = data::synthetic_table_rows(data::SourceFormat::kCriteoTsv, o.scale);
  scheduler::SchedulerConfig cv = scheduler::make_scheduler_config(vocab, so);
  so.table_rows.clear();
  const std::uint64_t batches = o.warmup + o.iterations;
  scheduler::KeyDirectory dir = scheduler::make_key_directory(hashed, so, 1, batches);
  so.dynamic_slots = dir.slot_count();
  scheduler::SchedulerConfig ch = scheduler::make_scheduler_config(hashed, so);
  cv.threads = ch.threads = o.thread_counts[0];
  ch.cache_rows = cv.cache_rows;
  const std::uint64_t n = static_cast<std::uint64_t>(o.shape.workers) * o.shape.batch_per_worker;
  const std::vector<scheduler::GlobalBatch> gv = global_batches(vocab, n, batches, cv.table_offsets);
  const std::vector<scheduler::GlobalBatch> gh = global_batches(hashed, n, batches, ch.table_offsets);
  scheduler::Scheduler sv(cv), sh(ch);
  std::vector<scheduler::StepPlan> plans;
  std::vector<double> v_ms, h_ms, ratios;
  scheduler::GlobalBatch g;
  std::vector<Key> dropped;
  for (std::uint64_t i = 0; i < batches; ++i) {
    Stopwatch v;
    sv.schedule(gv[i], plans);
    const double vt = v.millis();
    g = gh[i];
    Stopwatch h;
    dir.admit(i, g);
    sh.schedule(g, plans);
    dropped.clear();
    dir.end_iteration(i, &dropped);
    sh.drop_rows(dropped);
    const double ht = h.millis();
    if (i < o.warmup) continue;
    v_ms.push_back(vt);
    h_ms.push_back(ht);
    ratios.push_back(ht / vt);
  }
  return {median(v_ms), median(h_ms), median(ratios), sh.memory_bytes() + dir.memory_bytes()};
}

void print_shape(const ShapeTimes& r, const SchedBenchOptions& o, const Output& out) {
  std::string text = fmt::format("{}: {:.0f} ids a batch ({:.1f} a sample)\n", r.name, r.ids, r.ids / r.samples);
  for (std::size_t j = 0; j < r.ms.size(); ++j) {
    text += fmt::format("  {:>2} thread(s): {:>9.3f} ms a batch {:>9.2f} us a sample {:>8.1f} ns an id {:>6.2f}x {} thread(s)\n",
                        o.thread_counts[j], r.ms[j], r.us_per_sample(j), r.ns_per_id(j), r.ms[0] / r.ms[j], o.thread_counts[0]);
  }
  text += r.baseline_ms > 0 ? fmt::format("  straightforward Algorithm 1: {:.3f} ms ({:.1f}x slower); decisions agree\n", r.baseline_ms,
                                          r.baseline_ms / r.ms[0])
                            : std::string("  straightforward Algorithm 1: not run (it has no cache admission)\n");
  out.text(text);
  nlohmann::ordered_json j = {{"bench", "sched"},
                              {"shape", r.name},
                              {"workers", o.shape.workers},
                              {"batch_per_worker", o.shape.batch_per_worker},
                              {"ids_per_batch", r.ids},
                              {"baseline_median_ms", r.baseline_ms},
                              {"scheduler_mb", static_cast<double>(r.bytes) / 1e6}};
  for (std::size_t i = 0; i < r.ms.size(); ++i) {
    const std::string t = std::to_string(o.thread_counts[i]);
    j["median_ms_" + t + "threads"] = r.ms[i];
    j["ns_per_id_" + t + "threads"] = r.ns_per_id(i);
    j["us_per_sample_" + t + "threads"] = r.us_per_sample(i);
  }
  if (r.lookahead_ms > 0) j["lookahead_median_ms"] = r.lookahead_ms;
  out.row(j);
}

}  // namespace

void add_sched_options(CLI::App& app, SchedBenchOptions& o) {
  using O = SchedBenchOptions;
  scheduler::add_scheduler_options(app, o.shape, kShapeProgram);  // the job's shape, as ember-plan's
  const std::vector<OptionDecl<O>> decls = {
      bench_flag("--scale", &O::scale, "Criteo Kaggle cardinalities x scale"),
      bench_flag("--warmup", &O::warmup, "untimed iterations first"),
      bench_flag("--iterations", &O::iterations, "timed iterations"),
      bench_flag("--lookahead", &O::lookahead, "also time a window of L batches with lookahead eviction (0: skip)"),
      bench_flag("--baseline-iterations", &O::baseline_iterations, "timed iterations of the straightforward version"),
      bench_flag("--multi-hot", &O::multi_hot, "also time bags ('mlperf', one size, or one per table), beside one-hot data"),
      bench_flag("--multi-hot-dist", &O::multi_hot_dist, "the bags' extra ids: uniform or zipf"),
      comma_separated(
          list_flag("--thread-counts", &O::thread_counts, "scheduler threads to time, comma-separated (the first is the reference)")),
  };
  add_options(app, decls, o, kBenchProgram);
}

int run_sched_bench(const SchedBenchOptions& o, bool json) {
  if (o.thread_counts.empty() || *std::min_element(o.thread_counts.begin(), o.thread_counts.end()) < 1)
    throw ConfigError("--thread-counts: one or more counts of at least 1");
  Output out{json};
  const TempDir dir("ember-bench-sched");
  const std::uint64_t n = static_cast<std::uint64_t>(o.shape.workers) * o.shape.batch_per_worker;
  const std::uint64_t rows = (o.warmup + std::max(o.iterations, o.baseline_iterations) + o.lookahead) * n;
  out.text(fmt::format("herald, {} workers x {} samples, cache ratio {}; median over {} batches after {} warm-up\n", o.shape.workers,
                       o.shape.batch_per_worker, o.shape.cache_ratio, o.iterations, o.warmup));
  const ShapeTimes one = time_shape("one-hot", criteo_like(dir.path(), "one-hot", rows, o.scale, "", "uniform", out), o, true);
  print_shape(one, o, out);
  {
    // The same rows with hashed ids: the scheduler on the KeyDirectory's slots.
    const data::Dataset vocab = criteo_like(dir.path(), "one-hot-twin", rows, o.scale, "", "uniform", out);
    const data::Dataset hashed = criteo_like_hashed(dir.path(), "hashed", rows, o.scale, out);
    out.text(
        fmt::format("hashed 64-bit ids (KeyDirectory + herald, {} thread(s), batch by batch beside the vocabulary's; median "
                    "ratios, target at most 1.3x):\n",
                    o.thread_counts[0]));
    // Rows made at first use and kept; then expired after 50 idle iterations and capped
    // at a million rows (the recency lists kept, rows dropped).
    for (const auto& [expire, cap] : {std::pair<std::uint64_t, std::uint64_t>{0, 0}, {50, 1000000}}) {
      const HashedTimes h = time_hashed(hashed, vocab, o, expire, cap);
      const std::string what = cap == 0 ? "no drops" : fmt::format("--expire-after {} --shard-max-rows {}", expire, cap);
      out.text(fmt::format("  {:<42} {:.3f} ms a batch against {:.3f}: {:.2f}x; scheduler and directory {:.1f} MB\n", what, h.hashed_ms,
                           h.vocabulary_ms, h.ratio, static_cast<double>(h.hashed_bytes) / 1e6));
      out.row({{"bench", "sched"}, {"hashed", what}, {"hashed_median_ms", h.hashed_ms}, {"hashed_vs_vocabulary", h.ratio}});
    }
  }
  if (one.lookahead_ms > 0) {
    out.text(fmt::format("  lookahead {} + its eviction: {:.3f} ms, {:.2f}x none (same run), scheduler {:.1f} MB\n", o.lookahead,
                         one.lookahead_ms, one.lookahead_ms / one.ms[0], static_cast<double>(one.lookahead_bytes) / 1e6));
  }
  if (o.multi_hot.empty()) {
    out.text("targets: <= 2 ms per batch on one core, >= 10x the straightforward version, lookahead 4 at most 2x none\n");
    return 0;
  }
  const std::string name = fmt::format("bags {} ({})", o.multi_hot, o.multi_hot_dist);
  const ShapeTimes bags = time_shape(name, criteo_like(dir.path(), "bags", rows, o.scale, o.multi_hot, o.multi_hot_dist, out), o, false);
  print_shape(bags, o, out);
  out.text(fmt::format("bags vs one-hot, ns an id at {} thread(s): {:.2f}x (target at most 2x)\n", o.thread_counts[0],
                       bags.ns_per_id() / one.ns_per_id()));
  out.row({{"bench", "sched"}, {"bags_vs_one_hot_per_id", bags.ns_per_id() / one.ns_per_id()}});
  return 0;
}

}  // namespace ember::bench
