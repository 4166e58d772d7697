#include "ember/planner/cost_model.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ember/common/error.h"
#include "ember/data/stats.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/step_plan.h"

namespace ember::planner {
namespace {

// One accessed row under vanilla, for W workers of b samples each (every iteration's
// batch independent of the others: the rows drawn by their frequency).
struct RowModel {
  double q = 0;      // P(the row is in one worker's micro-batch) = 1 - (1 - P(e))^b
  double a = 0;      // P(one given worker alone trains it in an iteration)
  double log_r = 0;  // log P(no worker trains it in an iteration); -inf when certain
  double one_r = 0;  // 1 - r

  // r^t, t >= 0 real.
  double r_pow(double t) const { return t == 0 ? 1.0 : std::exp(t * log_r); }
  // Rows a worker holds as latest after t iterations with copies living `life` iterations:
  // sum over j = 1 .. min(t, life) of r^(j-1) a (the last iteration that trained the row
  // was j ago and its sole trainer was this worker).
  double held(double t, double life) const { return one_r > 0 ? a * (1 - r_pow(std::min(t, life))) / one_r : a * std::min(t, life); }
  // Mean over t = t0 .. t1 - 1 of held(t, life).
  double mean_held(std::uint64_t t0, std::uint64_t t1, double life) const {
    const double n = static_cast<double>(t1 - t0);
    if (one_r <= 0) {  // never absent (cannot happen for q > 0 but keeps the algebra total)
      double s = 0;
      for (std::uint64_t t = t0; t < t1; ++t) s += std::min(static_cast<double>(t), life);
      return a * s / n;
    }
    // sum over t of r^min(t, life): r^t below ceil(life), r^life from there on.
    const double m = std::isinf(life) ? static_cast<double>(t1) : std::ceil(life);
    const double tc = std::clamp(m, static_cast<double>(t0), static_cast<double>(t1));
    const double part1 = (r_pow(static_cast<double>(t0)) - r_pow(tc)) / one_r;
    const double part2 = (static_cast<double>(t1) - tc) * (std::isinf(life) ? 0.0 : r_pow(life));
    return a * (n - part1 - part2) / (one_r * n);
  }
};

RowModel row_model(double p, std::uint32_t b, std::uint32_t W) {
  RowModel m;
  if (p >= 1) {
    m.q = 1;
    m.a = W == 1 ? 1 : 0;
    m.log_r = -std::numeric_limits<double>::infinity();
    m.one_r = 1;
    return m;
  }
  const double lq = static_cast<double>(b) * std::log1p(-p);  // log(1 - q)
  m.q = -std::expm1(lq);
  m.a = m.q * std::exp(static_cast<double>(W - 1) * lq);
  m.log_r = static_cast<double>(W) * lq;
  m.one_r = -std::expm1(m.log_r);
  return m;
}

void check(const Topology& topo) {
  if (topo.workers < 1 || topo.workers > 64) throw ConfigError("--workers must be in 1..64");
  if (topo.batch_per_worker < 1) throw ConfigError("--batch-per-worker must be at least 1");
  if (topo.iterations < 1) throw ConfigError("--iterations must be at least 1");
}

// Payload bytes of a table's rows per iteration, as ember-sim counts them (wire_bytes of
// one row of each kind).
double table_bytes(const TableCost& tc, scheduler::RowFormat row) {
  scheduler::TrafficCounts one;
  one.pulls = one.pull_state = 1;
  const double pull_with_state = static_cast<double>(scheduler::wire_bytes(one, row).pull);
  one.pull_state = 0;
  const double pull_plain = static_cast<double>(scheduler::wire_bytes(one, row).pull);
  one = {};
  one.push_grad = 1;
  const double grad = static_cast<double>(scheduler::wire_bytes(one, row).push_grad);
  return tc.pull_state * pull_with_state + (tc.pulls - tc.pull_state) * pull_plain + tc.push_grad * grad;
}

// A global batch of n samples split at random into micro-batches of b: for a row that c
// samples of the batch access, P(one given worker's micro-batch holds none of them) and
// P(it holds all of them).
double p_absent(double n, double b, double c) {
  return n - c < b ? 0.0 : std::exp(std::lgamma(n - c + 1) - std::lgamma(n - c - b + 1) + std::lgamma(n - b + 1) - std::lgamma(n + 1));
}
double p_all(double n, double b, double c) {
  return c > b ? 0.0 : std::exp(std::lgamma(b + 1) - std::lgamma(b - c + 1) + std::lgamma(n - c + 1) - std::lgamma(n + 1));
}

}  // namespace

Frequencies load_frequencies(const data::Dataset& ds, data::Split split) {
  Frequencies f;
  f.samples = ds.split(split).rows();
  if (f.samples == 0) throw ConfigError(std::string("split ") + data::kSplitNames[static_cast<int>(split)] + " is empty");
  const int nt = ds.num_tables();
  f.tables.resize(static_cast<std::size_t>(nt));
  tbb::parallel_for(0, nt, [&](int t) {
    const data::TableInfo& info = ds.manifest().tables[static_cast<std::size_t>(t)];
    TableFrequencies& tf = f.tables[static_cast<std::size_t>(t)];
    tf.name = info.name;
    tf.rows = info.rows;
    tf.counts = data::row_counts(ds, split, t);
  });
  return f;
}

CostEstimate vanilla_cost(const Frequencies& f, const Topology& topo, scheduler::RowFormat row) {
  check(topo);
  if (f.samples == 0) throw ConfigError("no samples to take frequencies from");
  const std::uint32_t W = topo.workers, b = topo.batch_per_worker;
  std::uint64_t total_rows = 0;
  for (const auto& t : f.tables) total_rows += t.rows;
  CostEstimate out;
  out.policy = "vanilla";
  out.cache_rows = scheduler::cache_rows_for(topo.cache_ratio, total_rows);
  const std::uint64_t t0 = topo.warmup, t1 = topo.warmup + topo.iterations;

  // Every accessed row's model, table by table.
  std::vector<std::vector<RowModel>> models(f.tables.size());
  const double n = static_cast<double>(f.samples);
  for (std::size_t ti = 0; ti < f.tables.size(); ++ti) {
    auto& ms = models[ti];
    for (std::uint32_t c : f.tables[ti].counts) {
      if (c > 0) ms.push_back(row_model(static_cast<double>(c) / n, b, W));
    }
  }
  // The LRU: a worker's latest copies are the rows it last trained alone (vanilla drops
  // every other copy), its recency their last training. Without evictions it holds
  // sum_e held(t) rows at iteration t; where that exceeds the cache, an LRU keeps the
  // copies of the last `life` iterations (Che's approximation), life solving
  // sum_e held(life) = cache_rows.
  auto demand = [&](double t, double life) {
    double s = 0;
    for (const auto& ms : models) {
      for (const RowModel& m : ms) s += m.held(t, life);
    }
    return s;
  };
  const double C = static_cast<double>(out.cache_rows);
  const double inf = std::numeric_limits<double>::infinity();
  out.cache_demand = demand(static_cast<double>(t1 - 1), inf) / C;
  out.lifetime = inf;
  if (out.cache_demand > 1) {
    double lo = 0, hi = static_cast<double>(t1 - 1);
    for (int i = 0; i < 60 && hi - lo > 1e-3; ++i) {
      double mid = 0.5 * (lo + hi);
      (demand(mid, mid) > C ? hi : lo) = mid;
    }
    out.lifetime = lo;
  }

  for (std::size_t ti = 0; ti < f.tables.size(); ++ti) {
    TableCost tc;
    tc.name = f.tables[ti].name;
    tc.rows = f.tables[ti].rows;
    tc.accessed = models[ti].size();
    for (const RowModel& m : models[ti]) {
      // Trained rows: every worker pushes each row it trained; it pulls those it does
      // not hold as latest, with the state when it trains the row alone.
      const double held = m.mean_held(t0, t1, out.lifetime);
      // P(held | trains now) = P(held): the iterations are independent.
      const double alone = m.q < 1 ? std::exp(static_cast<double>(W - 1) * std::log1p(-m.q)) : (W == 1 ? 1.0 : 0.0);
      tc.distinct_per_worker += m.q;
      tc.push_grad += W * m.q;
      tc.hits += W * m.q * held;
      tc.pulls += W * m.q * (1 - held);
      tc.pull_state += W * m.q * (1 - held) * alone;
    }
    tc.bytes = table_bytes(tc, row);
    out.tables.push_back(std::move(tc));
  }
  return out;
}

CostEstimate vanilla_cost_in_order(const data::Dataset& ds, const Topology& topo, scheduler::RowFormat row) {
  check(topo);
  // The LRU's limit from the frequencies (the same cache, the same rows).
  CostEstimate out = vanilla_cost(load_frequencies(ds), topo, row);
  out.policy = "vanilla";
  const std::uint32_t W = topo.workers;
  const std::uint64_t n = static_cast<std::uint64_t>(W) * topo.batch_per_worker;
  const std::uint64_t t0 = topo.warmup, t1 = topo.warmup + topo.iterations;
  const data::SplitData& train = ds.split(data::Split::kTrain);
  if (train.rows() / n < t1) {
    throw ConfigError("the training split holds " + std::to_string(train.rows() / n) +
                      " global batches; --warmup + --iterations = " + std::to_string(t1));
  }
  const double dn = static_cast<double>(n), db = static_cast<double>(topo.batch_per_worker);
  const double life = out.lifetime;
  const int nt = ds.num_tables();
  tbb::parallel_for(0, nt, [&](int t) {
    const std::uint64_t rows = ds.manifest().tables[static_cast<std::size_t>(t)].rows;
    // Per row: its count in the current batch, the last batch that trained it and the
    // probability that a given worker trained it alone there (then it holds it latest).
    std::vector<std::uint32_t> count(rows, 0);
    std::vector<std::int64_t> last(rows, -1);
    std::vector<double> sole(rows, 0.0);
    std::vector<std::uint64_t> touched;
    data::BatchReader reader(train, {static_cast<std::size_t>(n), false, 0, true});
    data::Batch batch;
    TableCost& tc = out.tables[static_cast<std::size_t>(t)];
    tc.distinct_per_worker = tc.pulls = tc.pull_state = tc.push_grad = tc.hits = 0;
    for (std::uint64_t it = 0; it < t1 && reader.next(batch); ++it) {
      touched.clear();
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const std::uint64_t id = batch.id(t, i);
        if (count[id]++ == 0) touched.push_back(id);
      }
      const bool counted = it >= t0;
      for (std::uint64_t id : touched) {
        const double c = count[id];
        const double q = 1 - p_absent(dn, db, c);  // in a given worker's micro-batch
        const double alone = p_all(dn, db, c);     // ... and in no other's
        if (counted) {
          const bool alive = last[id] >= 0 && static_cast<double>(static_cast<std::int64_t>(it) - last[id]) <= life;
          const double held = alive ? sole[id] : 0.0;
          tc.distinct_per_worker += q;
          tc.push_grad += W * q;
          tc.hits += W * q * held;
          tc.pulls += W * q * (1 - held);
          tc.pull_state += W * alone * (1 - held);
        }
        last[id] = static_cast<std::int64_t>(it);
        sole[id] = alone;
        count[id] = 0;
      }
    }
    const double iters = static_cast<double>(topo.iterations);
    tc.distinct_per_worker /= iters;
    tc.push_grad /= iters;
    tc.hits /= iters;
    tc.pulls /= iters;
    tc.pull_state /= iters;
    tc.bytes = table_bytes(tc, row);
  });
  return out;
}

}  // namespace ember::planner
