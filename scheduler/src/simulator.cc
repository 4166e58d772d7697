#include "ember/scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <set>
#include <type_traits>

#include "ember/common/checkpoint_schedule.h"
#include "ember/common/error.h"
#include "ember/common/hash.h"
#include "ember/scheduler/batch_stream.h"
#include "tier_model.h"

namespace ember::scheduler {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
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
  for (const PullEntry& e : p.pulls) {
    h = mix64(mix64(h ^ e.key) ^ (static_cast<std::uint64_t>(e.slot) << 8 | static_cast<std::uint8_t>(e.kind)) ^ e.evicted);
    if (e.prefetch) h = mix64(h ^ 0x9f);  // (plans without prefetch hash as before)
    if (e.peer) h = mix64(h ^ 0x7e);      // (and without peer sync)
  }
  for (const auto* list : {&p.hand_values, &p.hand_grads})
    for (const HandValue& v : *list) h = mix64(mix64(h ^ v.key) ^ (static_cast<std::uint64_t>(v.slot) << 16 | v.to));
  for (const RowRef& r : p.rows) h = mix64(h ^ r.key ^ (static_cast<std::uint64_t>(r.slot) << 1 | r.shared()));
  // (plans without replicated rows hash as before)
  for (const auto* list : {&p.replicated, &p.replicated_flush}) {
    if (!list->empty()) h = hash_vec(*list, mix64(h + list->size()));
  }
  return h;
}

void count_per_table(const std::vector<StepPlan>& plans, const std::vector<std::uint64_t>& offsets, bool flush,
                     std::vector<TrafficCounts>& per_table) {
  count_per_group(
      plans, flush,
      [&](WorkerId, Key k) {
        auto it = std::upper_bound(offsets.begin(), offsets.end(), k);
        return static_cast<std::size_t>(it - offsets.begin()) - 1;
      },
      per_table);
}

void count_per_group(const std::vector<StepPlan>& plans, bool flush, const std::function<std::size_t(WorkerId, Key)>& group_of,
                     std::vector<TrafficCounts>& per_group, bool peer_within) {
  for (const StepPlan& p : plans) {
    auto of = [&](Key k) -> TrafficCounts& { return per_group[group_of(p.worker, k)]; };
    if (flush) {
      for (const KeySlot& ks : p.push_grads) ++of(ks.key).flush_grad;
      for (const KeySlot& ks : p.push_values) ++of(ks.key).flush_value;
      for (Key k : p.replicated_flush) ++of(k).hot_flush;
      for (const KeySlot& ks : p.eval_hands) ++of(ks.key).eval_handed;
      continue;
    }
    for (Key k : p.replicated) ++of(k).hot_sync;
    for (const KeySlot& ks : p.push_grads) ++of(ks.key).push_grad;
    for (const KeySlot& ks : p.end_pushes) ++of(ks.key).push_grad;
    for (const KeySlot& ks : p.push_values) ++of(ks.key).push_value;
    for (const HandValue& v : p.hand_grads) ++(peer_within ? per_group[0] : of(v.key)).peer_grad;
    for (const PullEntry& e : p.pulls) {
      if (e.kind == EvictKind::kDirty || e.kind == EvictKind::kPartial) {
        // An eviction counts for the table of the row that leaves (whether the row that
        // takes its slot is pulled or handed by a peer).
        TrafficCounts& ev = of(e.evicted);
        ++ev.push_evict;
        ev.evict_partial += e.kind == EvictKind::kPartial;
      }
      if (e.peer) {
        // Handed within the worker's host, whatever the row's shard.
        ++(peer_within ? per_group[0] : of(e.key)).peer_value;
        continue;
      }
      TrafficCounts& c = of(e.key);
      ++c.pulls;
      c.pull_state += e.with_state;
      c.prefetched += e.prefetch;
    }
    // Every distinct row of the micro-batch is a hit or a pull.
    for (const RowRef& r : p.rows) ++of(r.key).hits;
    for (const PullEntry& e : p.pulls) --of(e.key).hits;
  }
}

template <typename List>
std::uint64_t AggregatedLinks::summed(const std::vector<StepPlan>& plans, List&& list) {
  std::map<std::pair<std::uint32_t, Key>, std::uint32_t> parts;  // (host, row) -> parts in this phase
  for (const StepPlan& p : plans) {
    const std::uint32_t h = host_of_(p.worker);
    list(p, [&](Key k) {
      if (link_of_(p.worker, k) == 1) ++parts[{h, k}];
    });
  }
  std::uint64_t n = 0;
  for (const auto& [at, c] : parts)
    if (parts_[at.first].take(at.second, c)) n += c - 1;
  return n;
}

void AggregatedLinks::count(const std::vector<StepPlan>& plans, bool flush, std::vector<TrafficCounts>* per_link) {
  // Everything as without aggregation, then the cross-host pulls of each host made
  // distinct (the repeats handed within the host) and its gradients summed where it may
  // (the repeats summed within the host), phase by phase as the workers do.
  const auto grads = [](const std::vector<KeySlot>& rows, auto&& add) {
    for (const KeySlot& ks : rows) add(ks.key);
  };
  std::uint64_t summed_grads = 0, summed_partial = 0;
  summed_grads += summed(plans, [&](const StepPlan& p, auto&& add) { grads(p.push_grads, add); });
  std::set<std::pair<std::uint32_t, Key>> pulled, pulled_state, prefetched;
  std::uint64_t pulls = 0;
  if (!flush) {
    summed_partial = summed(plans, [](const StepPlan& p, auto&& add) {
      for (const PullEntry& e : p.pulls)
        if (e.kind == EvictKind::kPartial) add(e.evicted);
    });
    for (const StepPlan& p : plans) {
      const std::uint32_t h = host_of_(p.worker);
      for (const PullEntry& e : p.pulls) {
        if (e.peer || link_of_(p.worker, e.key) != 1) continue;
        ++pulls;
        pulled.insert({h, e.key});
        if (e.with_state) pulled_state.insert({h, e.key});
        if (e.prefetch) prefetched.insert({h, e.key});
      }
    }
    std::map<std::uint32_t, std::vector<const StepPlan*>> by_host;
    for (const StepPlan& p : plans) by_host[host_of_(p.worker)].push_back(&p);
    for (const auto& [h, host_plans] : by_host) {
      const WorkerId w = host_plans.front()->worker;
      parts_[h].trained(host_plans, [&](Key k) { return link_of_(w, k) == 1; });
    }
    summed_grads += summed(plans, [&](const StepPlan& p, auto&& add) { grads(p.end_pushes, add); });
  }
  if (per_link == nullptr) return;
  std::vector<TrafficCounts> flat(2);
  count_per_group(plans, flush, link_of_, flat, true);
  TrafficCounts& in = flat[0];
  TrafficCounts& out = flat[1];
  // Pulls: one per host and row; a copy with state where any worker asked for it.
  if (!flush) {
    const std::uint64_t handed = pulls - pulled.size();
    out.pulls -= handed;
    in.pulls += handed;
    out.pull_state = pulled_state.size();
    out.prefetched = prefetched.size();
  }
  // Gradients: sync, end and flush pushes, and partial evictions, summed in the host.
  (flush ? out.flush_grad : out.push_grad) -= summed_grads;
  (flush ? in.flush_grad : in.push_grad) += summed_grads;
  out.push_evict -= summed_partial;
  out.evict_partial -= summed_partial;
  in.push_evict += summed_partial;
  in.evict_partial += summed_partial;
  for (std::size_t l = 0; l < 2; ++l) (*per_link)[l] += flat[l];
}

// Every shard's disk tier, without hints and with them (SimResult::per_shard_tier).
class Tiers {
 public:
  Tiers(const SimOptions& o) : o_(o) {
    for (std::uint32_t s = 0; s < o.shards; ++s) {
      plain_.emplace_back(o.tier_budget_bytes, o.tier_row_bytes);
      hinted_.emplace_back(o.tier_budget_bytes, o.tier_row_bytes);
    }
  }
  // The rows the plans' requests read or write at the shards, in iteration `it`: each
  // pull and value push, and a row's gradients once (the shard holds them apart and
  // applies their sum to the row once, after the pulls: shard_store.h).
  void touch(std::uint64_t it, const std::vector<StepPlan>& plans) {
    auto row = [&](Key k) {
      const std::uint32_t s = o_.shard_of(k);
      plain_[s].touch(it, k / o_.shards);
      hinted_[s].touch(it, k / o_.shards);
    };
    grads_.clear();
    for (const StepPlan& p : plans) {
      for (const PullEntry& e : p.pulls) {
        if (!e.peer) row(e.key);
        if (e.kind == EvictKind::kDirty) row(e.evicted);
        if (e.kind == EvictKind::kPartial) grads_.push_back(e.evicted);
      }
      for (const KeySlot& ks : p.push_values) row(ks.key);
      for (const auto* list : {&p.push_grads, &p.end_pushes})
        for (const KeySlot& ks : *list) grads_.push_back(ks.key);
    }
    std::sort(grads_.begin(), grads_.end());
    grads_.erase(std::unique(grads_.begin(), grads_.end()), grads_.end());
    for (Key k : grads_) row(k);
  }
  // A hint at iteration `now` of the batch of iteration `until`.
  void hint(std::uint64_t now, std::uint64_t until, const GlobalBatch& g) {
    for (Key k : g.keys) hinted_[o_.shard_of(k)].hint(now, until, k / o_.shards);
  }
  // The counts so far.
  void read(std::vector<TierReads>& plain, std::vector<TierReads>& hinted) const {
    auto of = [](const std::vector<TierModel>& m, std::vector<TierReads>& out) {
      out.clear();
      for (const TierModel& t : m) out.push_back({t.rows_touched(), t.reads(), t.critical_reads()});
    };
    of(plain_, plain);
    of(hinted_, hinted);
  }

 private:
  const SimOptions& o_;
  std::vector<TierModel> plain_, hinted_;
  std::vector<Key> grads_;  // touch's scratch
};

namespace {

// A plan's rows counted per table, per PS shard and per link class (SimOptions), the
// flushes' apart; the aggregated links see every iteration (their hosts' state).
class GroupCounts {
 public:
  // `by_table`: keys fall in the tables' ranges of `offsets` (not so for dynamic tables'
  // slots: no per-table counts).
  GroupCounts(const SimOptions& o, const std::vector<std::uint64_t>& offsets, bool by_table, SimResult& r)
      : o_(o), offsets_(offsets), by_table_(by_table), r_(r), shard_of_([&o](WorkerId, Key k) -> std::size_t { return o.shard_of(k); }) {
    if (by_table_) r.per_table.assign(offsets.size(), TrafficCounts{});
    if (o.shards > 0 && !o.shard_of) throw ConfigError("per-shard counts need SimOptions::shard_of");
    r.per_shard.assign(o.shards, TrafficCounts{});
    if (o.link_of) r.per_link.assign(2, TrafficCounts{});
    if (o.link_of && o.host_of) {
      r.per_link_aggregated.assign(2, TrafficCounts{});
      aggregated_.emplace(o.link_of, o.host_of);
    }
  }

  void count(const std::vector<StepPlan>& plans, bool flush, bool counted) {
    if (counted) {
      if (by_table_) count_per_table(plans, offsets_, flush, r_.per_table);
      if (o_.shards > 0) count_per_group(plans, flush, shard_of_, r_.per_shard);
      if (o_.link_of) count_per_group(plans, flush, o_.link_of, r_.per_link, true);
    }
    if (aggregated_) aggregated_->count(plans, flush, counted ? &r_.per_link_aggregated : nullptr);
  }

 private:
  const SimOptions& o_;
  const std::vector<std::uint64_t>& offsets_;
  const bool by_table_;
  SimResult& r_;
  const std::function<std::size_t(WorkerId, Key)> shard_of_;
  std::optional<AggregatedLinks> aggregated_;
};

// A tier's reads since the warm-up: `all` less what `warm` had read by then.
void subtract(std::vector<TierReads>& all, const std::vector<TierReads>& warm) {
  for (std::size_t s = 0; s < all.size() && s < warm.size(); ++s) {
    all[s].rows_touched -= warm[s].rows_touched;
    all[s].reads -= warm[s].reads;
    all[s].critical_reads -= warm[s].critical_reads;
  }
}

}  // namespace

// Replays the job's batches through `sched` (a Scheduler, or HostSchedulers).
// Dynamic tables: the rows the directory drops after iteration `it` leave the scheduler.
template <typename S>
void drop_rows_after(std::uint64_t it, KeyDirectory& dir, S& sched, std::vector<Key>& dropped) {
  dropped.clear();
  dir.end_iteration(it, &dropped);
  if constexpr (std::is_same_v<S, Scheduler>) sched.drop_rows(dropped);  // HostSchedulers: refused (check_dynamic_tables)
}

// With `dir` (dynamic tables), each batch's ids become its slots and the rows it drops
// after each iteration leave the scheduler.
template <typename S>
SimResult replay(S& sched, BatchStream& batches, const std::string& policy, bool flushes, std::uint64_t total, const SimOptions& o,
                 KeyDirectory* dir) {
  SimResult r;
  r.policy = policy;
  r.cache_rows = sched.config().cache_rows;
  std::vector<StepPlan> plans;
  std::vector<double> times;
  data::Batch b;
  GlobalBatch g;
  const auto& offsets = sched.config().table_offsets;
  const FlushSchedule flush_schedule{total, o.scheduler.eval_every, CheckpointSchedule(o.checkpoint_every)};
  double tables_sum = 0, scoring_sum = 0;
  GroupCounts groups(o, offsets, dir == nullptr, r);
  std::vector<Key> dropped;
  std::optional<Tiers> tiers;
  std::vector<TierReads> tier_warm, tier_warm_hinted;  // at the end of the warmup
  std::uint64_t now = 0;
  if (o.tier_budget_bytes > 0) {
    if (o.shards == 0) throw ConfigError("a disk tier's prediction needs the PS shards (--ps)");
    tiers.emplace(o);
    batches.on_ahead([&](std::uint64_t until, const GlobalBatch& next) { tiers->hint(now, until, next); });
  }
  for (std::uint64_t it = 0; it < total; ++it) {
    now = it;
    if (tiers && it == o.warmup) tiers->read(tier_warm, tier_warm_hinted);
    batches.next(b, g);
    if (dir != nullptr) dir->admit(it, g);
    batches.look_ahead(sched, it, total);
    IterationStats st = sched.schedule(g, plans);
    if (tiers) tiers->touch(it, plans);
    const bool counted = it >= o.warmup;
    groups.count(plans, false, counted);
    if (o.digest) {
      for (const StepPlan& p : plans) r.plan_digest = plan_hash(p, r.plan_digest);
    }
    // The flushes a job makes after this iteration (worker/src/loader.cc).
    if (flushes && flush_schedule.flushes_after(it)) {
      TrafficCounts f = sched.flush(plans, flush_schedule.evaluation_only_after(it));
      if (tiers) tiers->touch(it, plans);
      groups.count(plans, true, counted);
      st.traffic.flush_grad += f.push_grad;
      st.traffic.flush_value += f.push_value;
      st.traffic.hot_flush += f.hot_flush;
      st.traffic.eval_handed += f.eval_handed;
    }
    if (dir != nullptr) drop_rows_after(it, *dir, sched, dropped);
    if (counted) {
      r.traffic += st.traffic;
      r.per_iteration.push_back(st.traffic);
      times.push_back(st.sched_ms);
      tables_sum += st.laia_tables;
      scoring_sum += st.scoring_ms;
      ++r.iterations;
    }
    if (o.on_progress) o.on_progress(policy, it + 1, total);
  }
  if (!times.empty()) {
    r.sched_ms_mean = std::accumulate(times.begin(), times.end(), 0.0) / static_cast<double>(times.size());
    r.sched_ms_median = median(times);
    r.laia_tables_mean = tables_sum / static_cast<double>(times.size());
    r.scoring_ms_mean = scoring_sum / static_cast<double>(times.size());
  }
  if (tiers) {
    tiers->read(r.per_shard_tier, r.per_shard_tier_hinted);
    subtract(r.per_shard_tier, tier_warm);
    subtract(r.per_shard_tier_hinted, tier_warm_hinted);
  }
  r.scheduler_bytes = sched.memory_bytes();
  if (dir != nullptr) {
    for (std::uint32_t s = 0; s < dir->options().shards; ++s) r.per_shard_rows.push_back(dir->shard_counts(s));
    r.directory_bytes = dir->memory_bytes();
    r.dynamic_slots = dir->slot_count();
  }
  for (std::uint32_t w = 0; w < sched.config().workers; ++w) r.cached_rows += sched.cache_of(w).size();
  return r;
}

DynamicTableOptions dynamic_table_options(const SchedulerOptions& o, std::uint32_t shards) {
  DynamicTableOptions d;
  d.shards = std::max<std::uint32_t>(1, shards);
  d.create_after = o.create_after;
  d.create_filter_bytes = static_cast<std::uint64_t>(o.create_filter_mb * 1024 * 1024);
  d.expire_after = o.expire_after;
  d.shard_max_rows = o.shard_max_rows;
  return d;
}

std::uint64_t batch_ids_bound(const data::Dataset& ds, const SchedulerOptions& o) {
  const data::Manifest& m = ds.manifest();
  std::uint64_t ids_per_sample = 0;
  for (const auto& t : m.tables) ids_per_sample += m.multi_hot ? t.max_bag : 1;
  return std::uint64_t{o.workers} * o.batch_per_worker * ids_per_sample;
}

KeyDirectory make_key_directory(const data::Dataset& ds, const SchedulerOptions& o, std::uint32_t shards, std::uint64_t iterations) {
  const DynamicTableOptions d = dynamic_table_options(o, shards);
  const std::uint64_t batch_ids = batch_ids_bound(ds, o);
  std::uint64_t slots = 0;
  if (o.shard_max_rows > 0) {
    slots = KeyDirectory::slots_needed(o.shard_max_rows, batch_ids);
  } else {
    const double per_shard = static_cast<double>(batch_ids * iterations) / d.shards;
    slots = static_cast<std::uint64_t>(per_shard + 6 * std::sqrt(per_shard)) + 1024;
  }
  return KeyDirectory(d, slots);
}

SimResult simulate(const data::Dataset& ds, const SimOptions& o) {
  const std::uint64_t total = o.warmup + o.iterations;
  SchedulerOptions job = o.scheduler;
  job.iterations = total;
  std::optional<KeyDirectory> dir;
  if (ds.manifest().hashed_ids) {
    dir.emplace(o.slots_per_shard > 0 ? KeyDirectory(dynamic_table_options(job, o.shards), o.slots_per_shard)
                                      : make_key_directory(ds, job, o.shards, total));
    job.dynamic_slots = dir->slot_count();
  }
  SchedulerConfig c = make_scheduler_config(ds, job);
  if ((c.host_allocation || c.peer_sync || o.scheduler.scheduler_per_host) && o.host_of) {
    for (WorkerId w = 0; w < c.workers; ++w) c.host_of.push_back(o.host_of(w));
  }
  if (job.stream.empty()) {
    const data::BatchReader reader = global_batch_reader(ds, job);
    if (reader.batches_per_epoch() < total) {
      throw ConfigError("the training split holds " + std::to_string(reader.batches_per_epoch()) +
                        " global batches; --warmup + --iterations = " + std::to_string(total));
    }
  }
  BatchStream batches = job_batches(ds, job, c.table_offsets, c.lookahead);
  const std::string policy = c.policy.name();
  const bool flushes = c.policy.sync() != Sync::kBoundedStaleness;
  if (o.scheduler.scheduler_per_host) {
    if (!o.host_of) throw ConfigError("--scheduler-per-host needs the workers' hosts (--hosts or --host-map)");
    HostSchedulers sched(c);
    return replay(sched, batches, policy, flushes, total, o, dir ? &*dir : nullptr);
  }
  Scheduler sched(std::move(c));
  return replay(sched, batches, policy, flushes, total, o, dir ? &*dir : nullptr);
}

}  // namespace ember::scheduler
