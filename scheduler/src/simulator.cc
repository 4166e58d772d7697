#include "ember/scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ember/common/error.h"
#include "ember/common/hash.h"

namespace ember::scheduler {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

data::BatchReader make_reader(const data::Dataset& ds, const SimOptions& o) {
  const std::uint64_t n = static_cast<std::uint64_t>(o.workers) * o.batch_per_worker;
  const data::SplitData& train = ds.split(data::Split::kTrain);
  if (n > train.rows()) {
    throw ConfigError("a global batch of " + std::to_string(n) + " samples (workers x batch-per-worker) exceeds the " +
                      std::to_string(train.rows()) + " training rows");
  }
  return data::BatchReader(train, {static_cast<std::size_t>(n), o.shuffle, o.seed, true});
}

template <typename T>
std::uint64_t hash_vec(const std::vector<T>& v, std::uint64_t seed) {
  return XXH3_64bits_withSeed(v.data(), v.size() * sizeof(T), seed);
}

}  // namespace

std::uint64_t plan_hash(const StepPlan& p, std::uint64_t h) {
  h = mix64(h ^ p.iteration ^ (static_cast<std::uint64_t>(p.worker) << 48));
  h = hash_vec(p.samples, h);
  // Hash fields one by one: struct padding bytes are not part of a plan.
  for (const auto* list : {&p.push_grads, &p.push_values, &p.end_pushes, &p.drops}) {
    for (const KeySlot& ks : *list) h = mix64(h ^ ks.key) ^ ks.slot;
    h = mix64(h + list->size());
  }
  for (const PullEntry& e : p.pulls) h = mix64(mix64(h ^ e.key) ^ (static_cast<std::uint64_t>(e.slot) << 8 | static_cast<std::uint8_t>(e.kind)) ^ e.evicted);
  for (const RowRef& r : p.rows) h = mix64(h ^ r.key ^ (static_cast<std::uint64_t>(r.slot) << 1 | r.shared()));
  return h;
}

std::vector<std::uint64_t> key_space(const data::Dataset& ds, const SimOptions& o) {
  const auto& tables = ds.manifest().tables;
  if (!o.table_rows.empty() && o.table_rows.size() != tables.size()) {
    throw ConfigError("table_rows has " + std::to_string(o.table_rows.size()) + " entries for " + std::to_string(tables.size()) + " tables");
  }
  std::vector<std::uint64_t> off;
  std::uint64_t acc = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    off.push_back(acc);
    acc += o.table_rows.empty() ? tables[t].rows : std::max(tables[t].rows, o.table_rows[t]);
  }
  off.push_back(acc);
  return off;
}

std::uint32_t cache_rows_for(double ratio, std::uint64_t total_rows) {
  if (!(ratio > 0 && ratio <= 1)) throw ConfigError("--cache-ratio must be in (0, 1]");
  double rows = std::ceil(ratio * static_cast<double>(total_rows));
  if (rows > 4e9) throw ConfigError("cache of " + std::to_string(rows) + " rows exceeds 2^32");
  return static_cast<std::uint32_t>(rows);
}

std::vector<std::uint8_t> profile_hot_rows(const data::Dataset& ds, const SimOptions& o, double fraction) {
  auto offsets = key_space(ds, o);
  const std::uint64_t num_keys = offsets.back();
  offsets.pop_back();
  std::vector<std::uint32_t> count(num_keys, 0);
  data::BatchReader reader = make_reader(ds, o);
  data::Batch b;
  GlobalBatch g;
  for (std::uint64_t it = 0; it < o.warmup + o.iterations && reader.next(b); ++it) {
    to_global_batch(b, offsets, g);
    for (Key k : g.keys) ++count[k];
  }
  const auto hot_rows = static_cast<std::uint64_t>(std::floor(fraction * static_cast<double>(num_keys)));
  std::vector<std::uint64_t> order(num_keys);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) { return count[a] > count[b]; });
  std::vector<std::uint8_t> hot(num_keys, 0);
  for (std::uint64_t i = 0; i < hot_rows && count[order[i]] > 0; ++i) hot[order[i]] = 1;
  return hot;
}

SimResult simulate(const data::Dataset& ds, const Policy& policy, const SimOptions& o) {
  SchedulerConfig c;
  c.workers = o.workers;
  c.batch_per_worker = o.batch_per_worker;
  c.table_offsets = key_space(ds, o);
  c.num_keys = c.table_offsets.back();
  c.table_offsets.pop_back();
  c.cache_rows = cache_rows_for(o.cache_ratio, c.num_keys);
  c.policy = policy;
  c.seed = o.seed;
  c.threads = o.threads;
  c.budget_ms = o.budget_ms;
  c.partitions = o.partitions;
  if (policy.kind == PolicyKind::kFae) c.hot = profile_hot_rows(ds, o, policy.hot_fraction);
  data::BatchReader reader = make_reader(ds, o);
  const std::uint64_t total = o.warmup + o.iterations;
  if (reader.batches_per_epoch() < total) {
    throw ConfigError("the training split holds " + std::to_string(reader.batches_per_epoch()) + " global batches; --warmup + --iterations = " +
                      std::to_string(total));
  }
  Scheduler sched(std::move(c));
  SimResult r;
  r.policy = policy.name;
  r.cache_rows = sched.config().cache_rows;
  std::vector<StepPlan> plans;
  std::vector<double> times;
  data::Batch b;
  GlobalBatch g;
  const auto& offsets = sched.config().table_offsets;
  double tables_sum = 0, scoring_sum = 0;
  for (std::uint64_t it = 0; it < total; ++it) {
    if (!reader.next(b)) break;
    to_global_batch(b, offsets, g);
    IterationStats st = sched.schedule(g, plans);
    if (o.digest) {
      for (const StepPlan& p : plans) r.plan_digest = plan_hash(p, r.plan_digest);
    }
    if (it >= o.warmup) {
      r.traffic += st.traffic;
      r.per_iteration.push_back(st.traffic);
      times.push_back(st.sched_ms);
      tables_sum += st.laia_tables;
      scoring_sum += st.scoring_ms;
      ++r.iterations;
    }
    if (o.on_progress) o.on_progress(policy.name, it + 1, total);
  }
  if (!times.empty()) {
    r.sched_ms_mean = std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
    r.sched_ms_median = median(times);
    r.laia_tables_mean = tables_sum / static_cast<double>(times.size());
    r.scoring_ms_mean = scoring_sum / static_cast<double>(times.size());
  }
  r.scheduler_bytes = sched.memory_bytes();
  for (std::uint32_t w = 0; w < o.workers; ++w) r.cached_rows += sched.cache_of(w).size();
  return r;
}

}  // namespace ember::scheduler
