// ember-bench scale: the scheduler from 8 to 1024 workers, as one process of the job
// runs it. At each size, in two child processes on the same global batches (herald,
// hosts of --workers-per-host workers, the same key space and per-worker cache at every size):
//   the whole job's scheduler: one Scheduler modelling every worker's cache (what every
//     worker ran before schedulers per host);
//   one host's scheduler: host 0's (SchedulerConfig::model_host), given the other
//     hosts' evictions of each iteration (recorded by the first run) as the job's
//     exchange gives them; its time includes applying them.
// Each reports the median ms per global batch, us per sample, its scheduler state and
// the child's max RSS; host 0's plans are checked against the whole job's.
#include "bench_scale.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/common/error.h"
#include "ember/common/option_registry.h"
#include "ember/common/process.h"
#include "ember/data/synthetic.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/simulator.h"
#include "sched_batches.h"

namespace ember::bench {
namespace fs = std::filesystem;
namespace {

// What a child reports (a plain struct: it crosses a pipe).
struct Run {
  double ms = 0;        // median per batch
  double apply_ms = 0;  // of which applying the other hosts' evictions (median)
  std::uint64_t bytes = 0;
  std::uint64_t transmissions = 0;
  double evictions_in = 0;  // the other hosts' evictions per batch (mean)
  int agree = 1;
  long max_rss_kb = 0;
};

// Runs f in a child process: its Run, with the child's max RSS. Error if it fails.
template <typename F>
Run in_child(F&& f) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    Run r{};
    int rc = 0;
    try {
      r = f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ember-bench scale: %s\n", e.what());
      rc = 1;
    }
    if (::write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) rc = 1;
    ::_exit(rc);
  }
  ::close(fds[1]);
  Run r{};
  const ssize_t got = ::read(fds[0], &r, sizeof r);
  ::close(fds[0]);
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  if (got != static_cast<ssize_t>(sizeof r) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) throw Error("a benchmark child failed");
  r.max_rss_kb = ru.ru_maxrss;
  return r;
}

std::vector<std::uint32_t> parse_sizes(const std::string& text) {
  std::vector<std::uint32_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      v.push_back(static_cast<std::uint32_t>(std::stoul(item)));
    } catch (const std::exception&) {
      throw ConfigError("--workers '" + text + "': comma-separated worker counts");
    }
  }
  if (v.empty()) throw ConfigError("--workers: no size given");
  return v;
}

// The hash of the plans of host 0's workers (0 .. per_host - 1).
std::uint64_t host0_hash(const std::vector<scheduler::StepPlan>& plans, std::uint32_t per_host) {
  std::uint64_t h = 0;
  for (std::uint32_t w = 0; w < per_host && w < plans.size(); ++w) h = scheduler::plan_hash(plans[w], h);
  return h;
}

// The scheduler's config at W workers, hosts of --workers-per-host.
scheduler::SchedulerConfig scale_config(const ScaleBenchOptions& o, const data::Dataset& ds, std::uint32_t W, std::uint64_t batches) {
  scheduler::SchedulerOptions so;
  so.workers = W;
  so.batch_per_worker = o.batch_per_worker;
  so.cache_ratio = o.cache_ratio;
  so.policy = "herald";
  so.seed = 1;
  so.lookahead = o.lookahead;
  so.eviction = o.lookahead > 0 ? "lookahead" : "lru";
  so.refine_allocation = o.refine;
  so.iterations = batches;  // the job's length (the window must not reach past it)
  so.table_rows = data::synthetic_table_rows(data::SourceFormat::kCriteoTsv, o.scale);
  scheduler::SchedulerConfig c = scheduler::make_scheduler_config(ds, so);
  c.host_of.resize(W);
  for (std::uint32_t w = 0; w < W; ++w) c.host_of[w] = w / o.per_host;
  return c;
}

// One job size: its config, its global batches and the file of the other hosts'
// evictions that the whole job's run writes and host 0's reads.
struct SizeBench {
  const ScaleBenchOptions& o;
  std::uint32_t W;
  scheduler::SchedulerConfig c;
  std::uint64_t n;  // samples per global batch
  std::vector<scheduler::GlobalBatch> gb;
  fs::path log;

  SizeBench(const ScaleBenchOptions& o, const data::Dataset& ds, const fs::path& dir, std::uint32_t W, std::uint64_t batches)
      : o(o),
        W(W),
        c(scale_config(o, ds, W, batches)),
        n(std::uint64_t{W} * o.batch_per_worker),
        gb(global_batches(ds, n, batches, c.table_offsets)),
        log(dir / fmt::format("evictions-{}.bin", W)) {}

  // The batches are all in memory (so that only scheduling is timed): part of each
  // child's RSS, printed apart.
  std::size_t batch_bytes() const {
    std::size_t batch_bytes = 0;
    for (const auto& x : gb) batch_bytes += x.keys.size() * sizeof(Key);
    return batch_bytes;
  }

  double us_per_sample(const Run& r) const { return r.ms * 1e3 / static_cast<double>(n); }

  // A run over the batches: look ahead, schedule, then `after(i, plans, s, r)`.
  template <typename After>
  Run run(scheduler::SchedulerConfig cc, After&& after) const {
    scheduler::Scheduler s(cc);
    std::vector<scheduler::StepPlan> plans;
    std::vector<double> ms, apply;
    for (std::uint32_t i = 0; i < o.lookahead; ++i) s.look_ahead(gb[i]);
    Run r;
    for (std::uint64_t i = 0; i < o.warmup + o.iterations; ++i) {
      Stopwatch sw;
      if (o.lookahead > 0) s.look_ahead(gb[i + o.lookahead]);
      const auto st = s.schedule(gb[i], plans);
      const double took = sw.millis();
      Stopwatch sa;
      after(i, plans, s, r);
      const double applied = sa.millis();
      if (i >= o.warmup) {
        ms.push_back(took + (cc.model_host >= 0 ? applied : 0.0));
        apply.push_back(applied);
        r.transmissions += st.traffic.transmissions();
      }
    }
    r.ms = median(ms);
    r.apply_ms = cc.model_host >= 0 ? median(apply) : 0.0;
    r.bytes = s.memory_bytes();
    return r;
  }

  // The whole job's scheduler, recording the other hosts' evictions and host 0's plans.
  Run whole_job() const {
    scheduler::SchedulerConfig cc = c;
    cc.list_evictions = true;
    std::ofstream f(log, std::ios::binary);
    std::vector<scheduler::RowEviction> others;
    return run(cc, [&](std::uint64_t, const std::vector<scheduler::StepPlan>& plans, scheduler::Scheduler& s, Run&) {
      const std::uint64_t h = host0_hash(plans, o.per_host);
      others.clear();
      for (const auto& e : s.evictions()) {
        if (e.worker >= o.per_host) others.push_back(e);
      }
      const std::uint64_t count = others.size();
      f.write(reinterpret_cast<const char*>(&h), sizeof h);
      f.write(reinterpret_cast<const char*>(&count), sizeof count);
      f.write(reinterpret_cast<const char*>(others.data()), static_cast<std::streamsize>(count * sizeof(scheduler::RowEviction)));
      if (!f) throw Error("cannot write " + log.string());
    });
  }

  // Host 0's scheduler, given the others' evictions after each batch.
  Run host0() const {
    scheduler::SchedulerConfig cc = c;
    cc.model_host = 0;
    cc.hand_evaluated_rows = false;  // one host's plans: its evaluations push
    std::ifstream f(log, std::ios::binary);
    std::vector<scheduler::RowEviction> others;
    double in = 0;
    Run last = run(cc, [&](std::uint64_t, const std::vector<scheduler::StepPlan>& plans, scheduler::Scheduler& s, Run& r) {
      std::uint64_t h = 0, count = 0;
      f.read(reinterpret_cast<char*>(&h), sizeof h);
      f.read(reinterpret_cast<char*>(&count), sizeof count);
      others.resize(count);
      f.read(reinterpret_cast<char*>(others.data()), static_cast<std::streamsize>(count * sizeof(scheduler::RowEviction)));
      if (!f) throw Error("cannot read " + log.string());
      if (h != host0_hash(plans, o.per_host)) r.agree = 0;
      in += static_cast<double>(count);
      if (W > o.per_host) s.apply_evictions(others);
    });
    last.evictions_in = in / static_cast<double>(o.warmup + o.iterations);
    return last;
  }

  // One size's line of the table, or its JSON row.
  void print(const Output& out, const Run& whole, const Run& host) const {
    const bool same = host.agree != 0;
    const std::size_t batch_bytes = this->batch_bytes();
    const double whole_us = us_per_sample(whole), host_us = us_per_sample(host);
    const double host_mb = static_cast<double>(host.bytes) / 1e6;
    out.text(
        fmt::format("{:>7}{:>6}{:>9.0f} | {:>10.2f}{:>9.2f}{:>10.1f}{:>9.0f} | {:>10.2f}{:>9.2f}{:>9.2f}{:>10.1f}{:>9.0f}{:>11.0f} | {}\n",
                    W, W / o.per_host, static_cast<double>(batch_bytes) / 1e6, whole.ms, whole_us, static_cast<double>(whole.bytes) / 1e6,
                    static_cast<double>(whole.max_rss_kb) / 1e3, host.ms, host.apply_ms, host_us, host_mb,
                    static_cast<double>(host.max_rss_kb) / 1e3, host.evictions_in, same ? "yes" : "NO"));
    out.row({{"bench", "scale"},
             {"workers", W},
             {"hosts", W / o.per_host},
             {"batch_per_worker", o.batch_per_worker},
             {"key_rows", c.num_keys},
             {"cache_rows", c.cache_rows},
             {"batch_bytes", batch_bytes},
             {"lookahead", o.lookahead},
             {"refine", o.refine},
             {"whole_ms", whole.ms},
             {"whole_us_per_sample", whole_us},
             {"whole_state_bytes", whole.bytes},
             {"whole_max_rss_bytes", whole.max_rss_kb * 1024},
             {"host_ms", host.ms},
             {"host_exchange_ms", host.apply_ms},
             {"host_us_per_sample", host_us},
             {"host_state_bytes", host.bytes},
             {"host_max_rss_bytes", host.max_rss_kb * 1024},
             {"evictions_in_per_batch", host.evictions_in},
             {"transmissions", whole.transmissions},
             {"same_plans", same}});
  }
};

}  // namespace

void add_scale_options(CLI::App& app, ScaleBenchOptions& o) {
  using O = ScaleBenchOptions;
  const std::vector<OptionDecl<O>> decls = {
      bench_flag("--workers", &O::workers, "job sizes, comma-separated"),
      bench_flag("--workers-per-host", &O::per_host, "workers per host"),
      bench_flag("--batch-per-worker", &O::batch_per_worker, "samples per worker per batch"),
      bench_flag("--scale", &O::scale, "Criteo Kaggle cardinalities x scale: the key space (the same at every size)"),
      bench_flag("--cache-ratio", &O::cache_ratio, "cache rows per worker / key rows (the same at every size)"),
      bench_flag("--warmup", &O::warmup, "untimed iterations first"),
      bench_flag("--iterations", &O::iterations, "timed iterations"),
      bench_flag("--lookahead", &O::lookahead, "a window of this many batches, with lookahead eviction (0: none)"),
      bench_flag("--refine-allocation", &O::refine, "refined allocation, as ember-worker's --refine-allocation"),
  };
  add_options(app, decls, o, kBenchProgram);
  add_renamed_flag(app, "--refine", "--refine-allocation", false);
}

int run_scale_bench(const ScaleBenchOptions& o, bool json) {
  Output out{json};
  const std::vector<std::uint32_t> sizes = parse_sizes(o.workers);
  const std::uint32_t largest = *std::max_element(sizes.begin(), sizes.end());
  for (std::uint32_t W : sizes) {
    if (W == 0 || W % o.per_host != 0) throw ConfigError(fmt::format("--workers-per-host {} does not divide {} workers", o.per_host, W));
  }
  const TempDir tmp("ember-bench-scale");
  const fs::path& dir = tmp.path();
  const std::uint64_t batches = o.warmup + o.iterations + o.lookahead;
  const data::Dataset ds = criteo_like(dir, batches * largest * o.batch_per_worker, o.scale, out);

  out.text(fmt::format("herald, {} samples per worker, hosts of {}, cache ratio {}; median of {} batches after {} warm-up{}{}\n",
                       o.batch_per_worker, o.per_host, o.cache_ratio, o.iterations, o.warmup,
                       o.lookahead > 0 ? fmt::format(", lookahead {}", o.lookahead) : "", o.refine ? ", refined allocation" : ""));
  out.text(fmt::format("{:>7}{:>6}{:>9} | {:>10}{:>9}{:>10}{:>9} | {:>10}{:>9}{:>9}{:>10}{:>9}{:>11} | {}\n", "workers", "hosts",
                       "batch MB", "whole ms", "us/smp", "state MB", "RSS MB", "host ms", "exch ms", "us/smp", "state MB", "RSS MB",
                       "evict in", "same plans"));
  double first_us = 0, first_mb = 0;
  for (std::uint32_t W : sizes) {
    const SizeBench bench(o, ds, dir, W, batches);
    const Run whole = in_child([&] { return bench.whole_job(); });
    const Run host = in_child([&] { return bench.host0(); });
    fs::remove(bench.log);
    const bool same = host.agree != 0;
    const double host_us = bench.us_per_sample(host);
    const double host_mb = static_cast<double>(host.bytes) / 1e6;
    if (first_us == 0) {
      first_us = host_us;
      first_mb = host_mb;
    }
    bench.print(out, whole, host);
    if (!same) throw Error(fmt::format("{} workers: host 0's scheduler planned otherwise than the whole job's", W));
    if (W == sizes.back() && sizes.size() > 1) {
      out.text(fmt::format("one host's scheduler at {} vs {} workers: {:.2f}x the us per sample, {:.2f}x the state (targets: at most 2x)\n",
                           W, sizes.front(), host_us / first_us, host_mb / first_mb));
    }
  }
  return 0;
}

}  // namespace ember::bench
