// ember-bench bags. Both loops read the same rows in the same order: every id of every
// bag (a one-hot table's one id), sample by sample. The bare loop adds rows straight from
// the table by key; the fused kernels go through one pointer per distinct row of the
// batch (built before the clock starts, as the scheduler's plan gives it to a worker).
#include "bench_bags.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/cache/bag_pool.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/data/dataset.h"
#include "sched_batches.h"

namespace ember::bench {
namespace {

// [0, n) split over `threads` threads of their own (one: inline).
void split(std::size_t n, std::uint32_t threads, const std::function<void(std::size_t, std::size_t, std::uint32_t)>& f) {
  if (threads <= 1) return f(0, n, 0);
  std::vector<std::thread> ts;
  for (std::uint32_t t = 0; t < threads; ++t) ts.emplace_back([&, t] { f(n * t / threads, n * (t + 1) / threads, t); });
  for (auto& t : ts) t.join();
}

struct Batch {
  const scheduler::GlobalBatch* g;
  std::vector<std::uint32_t> offsets;  // bags + 1 (one-hot: one id a bag)
  std::vector<std::uint32_t> ids;      // per id: its distinct row
  std::vector<const float*> values;    // per distinct row
  std::vector<float*> grads;
};

Batch prepare(const scheduler::GlobalBatch& g, float* table, float* grads, std::uint32_t dim) {
  Batch b{&g, {}, {}, {}, {}};
  if (g.multi_hot()) {
    b.offsets = g.bags;
  } else {
    b.offsets.resize(g.keys.size() + 1);
    for (std::size_t i = 0; i <= g.keys.size(); ++i) b.offsets[i] = static_cast<std::uint32_t>(i);
  }
  U64Map<std::uint32_t> index;
  for (Key k : g.keys) {
    auto [p, fresh] = index.try_emplace(k, static_cast<std::uint32_t>(b.values.size()));
    if (fresh) {
      b.values.push_back(table + k * dim);
      b.grads.push_back(grads + k * dim);
    }
    b.ids.push_back(*p);
  }
  return b;
}

// The bare loops: a bag's rows summed (or averaged) from the table by key; each id's bag
// gradient added to its row (several threads: each adds the rows it owns, key mod threads).
void bare_forward(const Batch& b, const float* table, std::uint32_t dim, bool mean, float* out, std::uint32_t threads) {
  const auto& keys = b.g->keys;
  split(b.offsets.size() - 1, threads, [&](std::size_t b0, std::size_t b1, std::uint32_t) {
    for (std::size_t bag = b0; bag < b1; ++bag) {
      float* o = out + bag * dim;
      std::memset(o, 0, dim * sizeof(float));
      const float w = mean ? 1.0f / static_cast<float>(std::max<std::uint32_t>(1, b.offsets[bag + 1] - b.offsets[bag])) : 1.0f;
      for (std::uint32_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
        const float* v = table + keys[i] * dim;
        for (std::uint32_t k = 0; k < dim; ++k) o[k] += v[k] * w;
      }
    }
  });
}
void bare_backward(const Batch& b, float* grads, std::uint32_t dim, bool mean, const float* gout, std::uint32_t threads) {
  const auto& keys = b.g->keys;
  split(threads, threads, [&](std::size_t, std::size_t, std::uint32_t t) {
    for (std::size_t bag = 0; bag + 1 < b.offsets.size(); ++bag) {
      const float* src = gout + bag * dim;
      const float w = mean ? 1.0f / static_cast<float>(std::max<std::uint32_t>(1, b.offsets[bag + 1] - b.offsets[bag])) : 1.0f;
      for (std::uint32_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
        if (threads > 1 && keys[i] % threads != t) continue;
        float* g = grads + keys[i] * dim;
        for (std::uint32_t k = 0; k < dim; ++k) g[k] += src[k] * w;
      }
    }
  });
}

cache::ParallelFor parallel_of(std::uint32_t threads) {
  if (threads <= 1) return {};
  return [threads](std::size_t n, std::size_t, const std::function<void(std::size_t, std::size_t)>& f) {
    split(n, threads, [&](std::size_t b0, std::size_t b1, std::uint32_t) { f(b0, b1); });
  };
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void add_bags_options(CLI::App& app, BagsBenchOptions& o) {
  using O = BagsBenchOptions;
  std::vector<OptionDecl<O>> decls = {
      bench_flag("--dataset", &O::dataset, "an ember-data dataset (its training split's first batches)"),
      comma_separated(list_flag("--batch", &O::batches, "samples per batch, one case each")),
      bench_flag("--count", &O::count, "batches per timed pass").checked(CLI::PositiveNumber),
      bench_flag("--dim", &O::dim, "embedding dimension").checked(CLI::PositiveNumber),
      bench_flag("--threads", &O::threads, "threads of both loops (the worker's --torch-threads)").checked(CLI::PositiveNumber),
      bench_flag("--pooling", &O::pooling, "sum or mean (bags)").checked(CLI::IsMember({"sum", "mean"})),
      bench_flag("--repeats", &O::repeats, "timed passes; medians reported").checked(CLI::PositiveNumber),
  };
  for (OptionDecl<O>& d : decls) d = d.default_hidden();  // bags' --help has shown no defaults
  add_options(app, decls, o, kBenchProgram);
  app.get_option("--dataset")->required();
}

int run_bags_bench(const BagsBenchOptions& o, bool json) {
  const Output out{json};
  const data::Dataset ds = data::Dataset::open(o.dataset);
  const auto offsets = ds.manifest().table_offsets();
  const std::uint64_t rows = ds.manifest().total_table_rows();
  const bool mean = o.pooling == "mean";
  std::vector<float> table(rows * o.dim), grads(rows * o.dim, 0.0f);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i % 97) * 1e-3f;
  out.text(fmt::format("{} rows of dim {}, {} thread(s), {} pooling; ns per id, median of {}\n\n", rows, o.dim, o.threads, o.pooling,
                       o.repeats));
  out.text(
      "| batch | ids/sample | bare gather-pool | bare scatter-add | bare total | fused forward | fused backward | fused total | fused / "
      "bare |\n");
  out.text("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (std::uint32_t batch : o.batches) {
    const auto gbs = global_batches(ds, batch, o.count, offsets);
    if (gbs.empty()) throw ConfigError("--dataset " + o.dataset + " has no batch of " + std::to_string(batch) + " samples");
    std::vector<Batch> prepared;
    std::size_t ids = 0, bags = 0;
    for (const auto& g : gbs) {
      prepared.push_back(prepare(g, table.data(), grads.data(), o.dim));
      ids += g.keys.size();
      bags = std::max(bags, prepared.back().offsets.size() - 1);
    }
    std::vector<float> pooled(bags * o.dim), gout(bags * o.dim, 1e-3f);
    const cache::ParallelFor parallel = parallel_of(o.threads);
    cache::RowBags scratch;
    std::vector<double> bf, bb, ff, fb;
    for (int r = 0; r <= o.repeats; ++r) {  // the first pass warms the pages
      double t[4] = {0, 0, 0, 0};
      for (const Batch& b : prepared) {
        const cache::BagBatch bb_{b.ids, b.offsets, mean};
        t[0] += seconds_of([&] { bare_forward(b, table.data(), o.dim, mean, pooled.data(), o.threads); });
        t[1] += seconds_of([&] { bare_backward(b, grads.data(), o.dim, mean, gout.data(), o.threads); });
        t[2] += seconds_of([&] { cache::pool_forward(bb_, b.values, o.dim, pooled.data(), parallel); });
        t[3] += seconds_of([&] { cache::pool_backward(bb_, gout.data(), b.grads, o.dim, scratch, parallel); });
      }
      if (r == 0) continue;
      bf.push_back(t[0] * 1e9 / ids);
      bb.push_back(t[1] * 1e9 / ids);
      ff.push_back(t[2] * 1e9 / ids);
      fb.push_back(t[3] * 1e9 / ids);
    }
    const double per_sample = static_cast<double>(ids) / (static_cast<double>(gbs.size()) * batch);
    const double bare = median(bf) + median(bb), fused = median(ff) + median(fb);
    out.row({{"bench", "bags"},
             {"batch", batch},
             {"ids_per_sample", per_sample},
             {"dim", o.dim},
             {"threads", o.threads},
             {"pooling", o.pooling},
             {"bare_forward_ns_id", median(bf)},
             {"bare_backward_ns_id", median(bb)},
             {"bare_ns_id", bare},
             {"fused_forward_ns_id", median(ff)},
             {"fused_backward_ns_id", median(fb)},
             {"fused_ns_id", fused},
             {"fused_vs_bare", fused / bare}});
    out.text(fmt::format("| {} | {:.0f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f}x |\n", batch, per_sample, median(bf),
                         median(bb), bare, median(ff), median(fb), fused, fused / bare));
  }
  return 0;
}

}  // namespace ember::bench
