#include "ember/planner/cost_model.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "ember/common/error.h"
#include "ember/data/stats.h"
#include "ember/ps/shard_store.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/simulator.h"
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
  if (topo.shards < 1) throw ConfigError("--ps must be at least 1");
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

// A row's predicted rows (pulls, with state, pushes) added to its shard's.
void add_to_shard(std::vector<ShardCost>& shards, Key key, double pulls, double pull_state, double pushes) {
  ShardCost& s = shards[ps::owner_shard(key, static_cast<std::uint32_t>(shards.size()))];
  s.pulls += pulls;
  s.pull_state += pull_state;
  s.pushes += pushes;
}

// Bytes of each shard's rows, as table_bytes counts a table's.
void shard_bytes(std::vector<ShardCost>& shards, scheduler::RowFormat row) {
  for (ShardCost& s : shards) {
    TableCost tc;
    tc.pulls = s.pulls;
    tc.pull_state = s.pull_state;
    tc.push_grad = s.pushes;
    s.bytes = table_bytes(tc, row);
  }
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
    tf.max_bag = ds.manifest().multi_hot ? info.max_bag : 1;
    tf.counts = data::row_counts(ds, split, t, /*once_per_sample=*/true);
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

  // Every accessed row's model, table by table, and its key (the tables' rows laid end
  // to end, as scheduler::key_space lays them out for the dataset).
  std::vector<std::vector<RowModel>> models(f.tables.size());
  std::vector<std::vector<Key>> keys(f.tables.size());
  const double n = static_cast<double>(f.samples);
  Key offset = 0;
  for (std::size_t ti = 0; ti < f.tables.size(); ++ti) {
    auto& ms = models[ti];
    const auto& counts = f.tables[ti].counts;
    for (std::size_t id = 0; id < counts.size(); ++id) {
      if (counts[id] == 0) continue;
      ms.push_back(row_model(static_cast<double>(counts[id]) / n, b, W));
      keys[ti].push_back(offset + id);
    }
    offset += f.tables[ti].rows;
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

  out.shards.assign(topo.shards, ShardCost{});
  for (std::size_t ti = 0; ti < f.tables.size(); ++ti) {
    TableCost tc;
    tc.name = f.tables[ti].name;
    tc.rows = f.tables[ti].rows;
    tc.accessed = models[ti].size();
    for (std::size_t i = 0; i < models[ti].size(); ++i) {
      const RowModel& m = models[ti][i];
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
      add_to_shard(out.shards, keys[ti][i], W * m.q * (1 - held), W * m.q * (1 - held) * alone, W * m.q);
    }
    tc.bytes = table_bytes(tc, row);
    out.tables.push_back(std::move(tc));
  }
  shard_bytes(out.shards, row);
  return out;
}

namespace {

// Vanilla's rows of table `t` replayed in the training split's order, summed over the
// counted iterations into `tc` and, per shard, `ts`: a row's held copy is the one its last
// training left a worker alone with, alive while younger than the LRU's `life`.
void replay_table_in_order(const data::Dataset& ds, const Topology& topo, int t, std::uint64_t offset, double life, TableCost& tc,
                           std::vector<ShardCost>& ts) {
  const std::uint32_t W = topo.workers;
  const std::uint64_t n = static_cast<std::uint64_t>(W) * topo.batch_per_worker;
  const std::uint64_t t0 = topo.warmup, t1 = topo.warmup + topo.iterations;
  const double dn = static_cast<double>(n), db = static_cast<double>(topo.batch_per_worker);
  const std::uint64_t rows = ds.manifest().tables[static_cast<std::size_t>(t)].rows;
  // Per row: its count in the current batch, the last batch that trained it and the
  // probability that a given worker trained it alone there (then it holds it latest).
  std::vector<std::uint32_t> count(rows, 0);
  std::vector<std::int64_t> last(rows, -1);
  std::vector<double> sole(rows, 0.0);
  std::vector<std::uint64_t> touched;
  // Multi-hot: the sample (+ 1) and batch that last counted each row.
  const bool bags = ds.manifest().multi_hot;
  std::vector<std::uint32_t> sample_of(bags ? rows : 0, 0);
  std::vector<std::int64_t> last_batch(bags ? rows : 0, -1);
  data::BatchReader reader(ds.split(data::Split::kTrain), {static_cast<std::size_t>(n), false, 0, true});
  data::Batch batch;
  tc.distinct_per_worker = tc.pulls = tc.pull_state = tc.push_grad = tc.hits = 0;
  for (std::uint64_t it = 0; it < t1 && reader.next(batch); ++it) {
    touched.clear();
    // A sample counts once per row (an id repeated in its bag is one row).
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch.for_each_id(t, i, [&](std::uint64_t id) {
        if (bags) {
          if (sample_of[id] == i + 1 && last_batch[id] == static_cast<std::int64_t>(it)) return;
          sample_of[id] = static_cast<std::uint32_t>(i + 1);
          last_batch[id] = static_cast<std::int64_t>(it);
        }
        if (count[id]++ == 0) touched.push_back(id);
      });
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
        add_to_shard(ts, offset + id, W * q * (1 - held), W * alone * (1 - held), W * q);
      }
      last[id] = static_cast<std::int64_t>(it);
      sole[id] = alone;
      count[id] = 0;
    }
  }
}

// A table's and its shards' sums over the counted iterations made means per iteration
// (the table's bytes from its means).
void per_iteration(const Topology& topo, scheduler::RowFormat row, TableCost& tc, std::vector<ShardCost>& ts) {
  const double iters = static_cast<double>(topo.iterations);
  tc.distinct_per_worker /= iters;
  tc.push_grad /= iters;
  tc.hits /= iters;
  tc.pulls /= iters;
  tc.pull_state /= iters;
  tc.bytes = table_bytes(tc, row);
  for (ShardCost& sc : ts) {
    sc.pulls /= iters;
    sc.pull_state /= iters;
    sc.pushes /= iters;
  }
}

}  // namespace

CostEstimate vanilla_cost_in_order(const data::Dataset& ds, const Topology& topo, scheduler::RowFormat row) {
  check(topo);
  // The LRU's limit from the frequencies (the same cache, the same rows).
  CostEstimate out = vanilla_cost(load_frequencies(ds), topo, row);
  out.policy = "vanilla";
  const std::uint32_t W = topo.workers;
  const std::uint64_t n = static_cast<std::uint64_t>(W) * topo.batch_per_worker;
  const std::uint64_t t1 = topo.warmup + topo.iterations;
  const data::SplitData& train = ds.split(data::Split::kTrain);
  if (train.rows() / n < t1) {
    throw ConfigError("the training split holds " + std::to_string(train.rows() / n) +
                      " global batches; --warmup + --iterations = " + std::to_string(t1));
  }
  const double life = out.lifetime;
  const int nt = ds.num_tables();
  const std::vector<std::uint64_t> offsets = scheduler::key_space(ds, {});
  // Per table, its rows' load on each shard (summed after the tables' parallel loop).
  std::vector<std::vector<ShardCost>> table_shards(static_cast<std::size_t>(nt), std::vector<ShardCost>(topo.shards));
  tbb::parallel_for(0, nt, [&](int t) {
    auto& ts = table_shards[static_cast<std::size_t>(t)];
    TableCost& tc = out.tables[static_cast<std::size_t>(t)];
    replay_table_in_order(ds, topo, t, offsets[static_cast<std::size_t>(t)], life, tc, ts);
    per_iteration(topo, row, tc, ts);
  });
  out.shards.assign(topo.shards, ShardCost{});
  for (const auto& ts : table_shards) {
    for (std::size_t s = 0; s < ts.size(); ++s) {
      out.shards[s].pulls += ts[s].pulls;
      out.shards[s].pull_state += ts[s].pull_state;
      out.shards[s].pushes += ts[s].pushes;
    }
  }
  shard_bytes(out.shards, row);
  return out;
}

CostEstimate sampled_cost(const data::Dataset& ds, const Topology& topo, scheduler::RowFormat row, const std::string& policy,
                          std::uint64_t sample_iterations, bool shuffle, std::uint64_t seed, const scheduler::PlanFile* plan) {
  check(topo);
  if (sample_iterations < 1) throw ConfigError("--sample must be at least 1");
  scheduler::SimOptions o;
  o.scheduler.policy = policy;
  o.scheduler.workers = topo.workers;
  o.scheduler.batch_per_worker = topo.batch_per_worker;
  o.scheduler.cache_ratio = topo.cache_ratio;
  o.scheduler.shuffle = shuffle;
  o.scheduler.lookahead = topo.lookahead;
  o.scheduler.cache_admission = topo.cache_admission;
  o.scheduler.seed = seed;
  if (plan != nullptr) o.scheduler.placement_plan = *plan;
  o.warmup = topo.warmup;
  o.iterations = sample_iterations;
  const std::uint32_t S = topo.shards;
  o.shards = S;
  o.shard_of = [S](Key k) { return ps::owner_shard(k, S); };
  o.tier_budget_bytes = topo.tier_budget_bytes;
  o.tier_row_bytes = row.stored_bytes();
  const auto start = std::chrono::steady_clock::now();
  const scheduler::SimResult r = scheduler::simulate(ds, o);
  CostEstimate out;
  out.policy = r.policy;
  out.sampled = true;
  out.sample_iterations = r.iterations;
  out.sample_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.cache_rows = r.cache_rows;
  out.lifetime = std::numeric_limits<double>::quiet_NaN();  // not modelled
  const double iters = static_cast<double>(std::max<std::uint64_t>(r.iterations, 1));
  // Counted in the iterations (the flush at the sample's end is the job's, not the
  // iteration's: left out, as the analytic model leaves it out).
  auto per_iteration = [&](std::uint64_t v) { return static_cast<double>(v) / iters; };
  for (std::size_t t = 0; t < r.per_table.size(); ++t) {
    const auto& c = r.per_table[t];
    const auto& info = ds.manifest().tables[t];
    TableCost tc;
    tc.name = info.name;
    tc.rows = info.rows;
    tc.pulls = per_iteration(c.pulls);
    tc.pull_state = per_iteration(c.pull_state);
    tc.push_grad = per_iteration(c.push_grad);
    tc.push_value = per_iteration(c.push_value);
    tc.push_evict = per_iteration(c.push_evict);
    tc.hits = per_iteration(c.hits);
    scheduler::TrafficCounts moved = c;
    moved.flush_grad = moved.flush_value = 0;
    tc.bytes = static_cast<double>(scheduler::wire_bytes(moved, row).total()) / iters;
    out.tables.push_back(std::move(tc));
  }
  for (std::size_t s = 0; s < r.per_shard.size(); ++s) {
    const auto& c = r.per_shard[s];
    ShardCost sc;
    if (s < r.per_shard_tier.size()) {
      sc.tier = scheduler::per_iteration(r.per_shard_tier[s], r.iterations);
      sc.tier_hinted = scheduler::per_iteration(r.per_shard_tier_hinted[s], r.iterations);
    }
    sc.pulls = per_iteration(c.pulls);
    sc.pull_state = per_iteration(c.pull_state);
    sc.pushes = per_iteration(c.pushes());
    scheduler::TrafficCounts moved = c;
    moved.flush_grad = moved.flush_value = 0;
    sc.bytes = static_cast<double>(scheduler::wire_bytes(moved, row).total()) / iters;
    out.shards.push_back(sc);
  }
  return out;
}

}  // namespace ember::planner
