// The Scheduler: its state, and the iteration's order of work. What each step does is
// in a file of its own (docs/scheduler.md "Code"): allocation.cc, batch_rows.cc, the
// sync modes (sync_mode.h), doi_profiler.cc.
#include "ember/scheduler/scheduler.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "allocation.h"
#include "bits.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "scheduler_state.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kNoSlot = cache::LruIndex::kNone;

// ConfigError for settings no Scheduler runs with (the placement's and fae's cache
// checks follow in cache_capacity and cache_groups).
void validate(const SchedulerConfig& c, std::uint32_t tables) {
  if (c.workers == 0 || c.workers > Scheduler::kMaxWorkers)
    throw ConfigError("--workers must be in [1, " + std::to_string(Scheduler::kMaxWorkers) + "]");
  if (c.batch_per_worker == 0) throw ConfigError("--batch-per-worker must be positive");
  if (c.cache_rows == 0) throw ConfigError("cache capacity must be at least one row");
  if (tables == 0 || c.num_keys == 0) throw ConfigError("no embedding tables");
  if (c.partitions == 0 || c.batch_per_worker % c.partitions != 0) {
    throw ConfigError("--partitions must divide --batch-per-worker");
  }
  check_lookahead(c);
  if (c.refine_allocation && c.policy.allocation() != Allocation::kLaia) {
    throw ConfigError("--refine-allocation refines LAIA's allocation (laia, herald), not " + c.policy.name() + "'s");
  }
  const auto needs_hosts = [&](const char* flag) {
    if (c.host_of.size() != c.workers) {
      throw ConfigError(std::string(flag) + " needs every worker's host (" + std::to_string(c.host_of.size()) + " given for " +
                        std::to_string(c.workers) + " workers; ember-sim: --hosts)");
    }
  };
  if (c.peer_sync) {
    if (c.policy.sync() != Sync::kOnDemand) {
      throw ConfigError("--peer-sync moves rows between the workers of a host: on-demand sync (plan, herald), not " + c.policy.name() +
                        "'s");
    }
    needs_hosts("--peer-sync");
  }
  if (c.model_host >= 0) {
    needs_hosts("a scheduler of one host");
    if (std::ranges::find(c.host_of, static_cast<std::uint32_t>(c.model_host)) == c.host_of.end()) {
      throw ConfigError("the scheduler models host " + std::to_string(c.model_host) + ", which has no worker");
    }
    if (c.hand_evaluated_rows)
      throw ConfigError("a scheduler of one host cannot hand evaluated rows to worker 0 (it plans its host's only)");
    if (c.policy.allocation() == Allocation::kBrute || c.budget_ms > 0) {
      throw ConfigError("brute force and adaptive LAIA (--budget-ms) model every worker's cache: not for a scheduler of one host");
    }
  }
  if (c.admission != Admission::kNone) {
    // Not yet: peer sync's hand-offs and a host's scheduler (which does not see the
    // other hosts' victims) would need admission's decision for rows of other workers.
    if (c.policy.sync() == Sync::kBoundedStaleness || c.peer_sync || c.model_host >= 0) {
      throw ConfigError(std::string("--cache-admission ") + admission_name(c.admission) + " does not apply " +
                        (c.peer_sync         ? "with --peer-sync"
                         : c.model_host >= 0 ? "with --scheduler-per-host"
                                             : "to " + c.policy.name()) +
                        " (yet)");
    }
  }
  if (c.policy.sync() == Sync::kBoundedStaleness && c.workers > 64) {
    throw ConfigError(c.policy.name() + " tracks each row's copies as a 64-bit mask: at most 64 workers, not " + std::to_string(c.workers));
  }
  if (c.host_allocation) {
    if (c.policy.allocation() != Allocation::kLaia) {
      throw ConfigError("--host-allocation allocates LAIA's way, by host (laia, herald), not " + c.policy.name() + "'s");
    }
    needs_hosts("--host-allocation");
  }
  if (c.policy.allocation() == Allocation::kBrute && (c.batch_per_worker != 1 || c.workers > 8)) {
    throw ConfigError("brute force needs --batch-per-worker 1 and at most 8 workers (it tries all W! allocations)");
  }
  if (c.policy.replicates_frequent_rows() && c.replicated.size() != c.num_keys)
    throw ConfigError("fae: the hot-row profile must cover every key");
  if (!c.replicated.empty() && c.replicated.size() != c.num_keys) throw ConfigError("the replicated rows must be given for every key");
  if (!c.uncached.empty() && c.uncached.size() != c.num_keys) throw ConfigError("the uncached rows must be given for every key");
  if (!c.treatments.empty() && c.treatments.size() != tables) throw ConfigError("a placement must give every table a treatment");
  if (c.policy.sync() == Sync::kBoundedStaleness && (!c.treatments.empty() || !c.uncached.empty())) {
    throw ConfigError("a placement does not apply to " + c.policy.name() + ": its copies are kept by version, not by treatment");
  }
}

// The rows of a worker's cache: fae's hot rows are replicated on every worker and take
// their share of the cache (a replicated table's rows do not: the plan gives them memory
// of their own).
std::uint32_t cache_capacity(const SchedulerConfig& c, std::uint32_t tables) {
  std::uint32_t capacity = c.cache_rows;
  if (!c.policy.replicates_frequent_rows()) return capacity;
  std::uint64_t replicated = 0;
  for (std::uint32_t t = 0; t < tables; ++t) {
    if (!c.treatments.empty() && c.treatments[t] == Treatment::kReplicated) continue;
    replicated += static_cast<std::uint64_t>(std::ranges::count(c.in_table(c.replicated, t), 1));
  }
  if (replicated >= capacity)
    throw ConfigError("fae: the hot set (" + std::to_string(replicated) + " rows) fills the whole cache of " + std::to_string(capacity) +
                      " rows");
  return capacity - static_cast<std::uint32_t>(replicated);
}

// The LRU groups of a worker's cache (WorkerCache): one of `capacity` rows, or with cache
// shares group 0, the pool, then one per table with a share; group_of_key: each key's
// group (null with one group).
std::vector<std::uint32_t> cache_groups(const SchedulerConfig& c, std::uint32_t tables, std::uint32_t capacity,
                                        std::shared_ptr<const std::vector<std::uint8_t>>& group_of_key) {
  std::vector<std::uint32_t> groups{capacity};
  if (c.cache_shares.empty()) return groups;
  // Group 0 is the pool; each table with a share gets the next group and its rows.
  if (c.cache_shares.size() != tables) throw ConfigError("cache shares must be given for every table");
  auto group = std::make_shared<std::vector<std::uint8_t>>(c.num_keys, 0);
  std::uint64_t shared = 0;
  for (std::uint32_t t = 0; t < tables; ++t) {
    if (c.cache_shares[t] == 0) continue;
    if (!c.treatments.empty() && c.treatments[t] != Treatment::kCache) throw ConfigError("a cache share for a table that is not cached");
    if (groups.size() == 255) throw ConfigError("cache shares for more than 254 tables");
    std::ranges::fill(c.in_table(*group, t), static_cast<std::uint8_t>(groups.size()));
    groups.push_back(c.cache_shares[t]);
    shared += c.cache_shares[t];
  }
  if (shared >= capacity) {
    throw ConfigError("the tables' cache shares (" + std::to_string(shared) + " rows) leave no pool in the cache of " +
                      std::to_string(capacity) + " rows");
  }
  groups[0] = capacity - static_cast<std::uint32_t>(shared);
  group_of_key = std::move(group);
  return groups;
}

// Runs the three phases of an iteration (docs/design.md) with sync mode `mode`.
template <SyncMode M>
void run_phases(M& mode, Iteration& it) {
  // 1. Sync: what must reach the PS before anyone pulls.
  mode.sync(it);
  // 2. Pulls, worker by worker (independent: in parallel when threads > 1), of the
  // modelled workers; then the partial copies they evicted leave the location map.
  const std::vector<std::uint32_t>& workers = it.modelled;
  const auto n = static_cast<std::uint32_t>(workers.size());
  if (it.config.threads > 1 && n > 1) {
    tbb::parallel_for(0u, n, [&](std::uint32_t j) { mode.pull(it, workers[j]); });
  } else {
    for (std::uint32_t w : workers) mode.pull(it, w);
  }
  for (std::uint32_t w : workers) {
    for (const RowEviction& e : it.rows.evicted[w]) {
      if (e.partial) it.loc.remove_partial(e.key, w, true);
    }
  }
  // From here on, what changes the PS's rows before the next iteration's pulls: this
  // iteration's evictions, its end pushes (step 3), a flush, the next sync.
  if (it.config.prefetch) it.pushed.restart(it.plans);
  // 3. Train: the rows' states after the iteration's updates.
  mode.train(it);
}

// Every worker's plan emptied and numbered, with its samples; Error unless balanced.
void deal_samples(const SchedulerConfig& c, std::uint64_t iteration, const std::vector<std::uint32_t>& worker_of, std::uint32_t n,
                  std::vector<StepPlan>& plans) {
  const std::uint32_t W = c.workers;
  plans.resize(W);
  for (std::uint32_t w = 0; w < W; ++w) {
    plans[w].clear();
    plans[w].iteration = iteration;
    plans[w].worker = w;
  }
  for (std::uint32_t i = 0; i < n; ++i) plans[worker_of[i]].samples.push_back(i);
  for (std::uint32_t w = 0; w < W; ++w) {
    if (plans[w].samples.size() != c.batch_per_worker) throw Error("allocation is not balanced");
  }
}

}  // namespace

Scheduler::State::State(const SchedulerConfig& c)
    : tables(static_cast<std::uint32_t>(c.table_offsets.size())),
      iteration(c.first_iteration),
      loc(std::max<std::uint64_t>(c.num_keys, 1), std::max<std::uint32_t>(c.workers, 1)) {
  validate(c, tables);
  const std::uint32_t capacity = cache_capacity(c, tables);
  std::shared_ptr<const std::vector<std::uint8_t>> group_of_key;
  const std::vector<std::uint32_t> groups = cache_groups(c, tables, capacity, group_of_key);
  lru.resize(c.workers);
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    if (!c.models(w)) continue;
    lru[w].emplace(groups, c.eviction != Eviction::kLru, group_of_key);
    modelled.push_back(w);
  }
  if (c.lookahead > 0) window.emplace(c.num_keys, c.first_iteration);
  sync = make_sync_mode(c, capacity);
  doi = DoiProfiler(c, tables);
  seen = KeyBits(c.num_keys);
  if (c.replicates()) replicated_trained = ReplicatedLog(c.num_keys);
  if (c.prefetch) pushed = PushMarks(c.num_keys);
  evaluated = KeyBits(c.num_keys);  // none: an evaluation without a validation split flushes nothing
  for (Key k : c.evaluated_rows) {
    if (k < c.num_keys && evaluated.set(k)) evaluated_keys.push_back(k);
  }
  std::sort(evaluated_keys.begin(), evaluated_keys.end());
  if (c.admission != Admission::kNone) sketch = FrequencySketch(std::uint64_t{capacity} * c.workers);  // it counts every worker's rows
}

Scheduler::Scheduler(SchedulerConfig config)
    : config_(std::move(config)), state_(std::make_unique<State>(config_)), scratch_(std::make_unique<Scratch>()) {}

Scheduler::~Scheduler() = default;

Scheduler::Scheduler(const Scheduler& o)
    : config_(o.config_), state_(std::make_unique<State>(*o.state_)), scratch_(std::make_unique<Scratch>()) {}

std::uint64_t Scheduler::iteration() const { return state_->iteration; }
const WorkerCache& Scheduler::cache_of(WorkerId w) const {
  if (!config_.models(w)) throw Error("Scheduler::cache_of: worker " + std::to_string(w) + " is another host's");
  return *state_->lru[w];
}
const cache::LocationMap& Scheduler::locations() const { return state_->loc; }
const std::vector<double>& Scheduler::table_doi() const { return state_->doi.doi(); }
const std::vector<std::uint32_t>& Scheduler::scored_tables() const { return state_->doi.scored_tables(); }

void Scheduler::drop_rows(std::span<const Key> keys) {
  check_evictions_applied("drop_rows");
  State& s = *state_;
  if (s.window) throw Error("rows of dynamic tables cannot be dropped under a lookahead window");
  for (const Key k : keys) {
    if (k >= config_.num_keys)
      throw Error("dropped row " + std::to_string(k) + " is outside the " + std::to_string(config_.num_keys) + " keys");
  }
  // Dropped rows are scattered: fetch each one's location 16 rows ahead, and its
  // owner's cache entry 8 ahead.
  constexpr std::size_t kLocationAhead = 16, kCacheAhead = 8;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i + kLocationAhead < keys.size()) s.loc.prefetch(keys[i + kLocationAhead]);
    if (i + kCacheAhead < keys.size()) {
      const std::uint16_t o = s.loc.owner(keys[i + kCacheAhead]);
      if (o != cache::LocationMap::kNoOwner && s.lru[o]) s.lru[o]->prefetch(keys[i + kCacheAhead]);
    }
    const Key k = keys[i];
    // A cache holds a row only as its one latest holder or as a partial holder (design.md,
    // row states): those copies alone leave.
    const std::uint16_t owner = s.loc.owner(k);
    if (owner != cache::LocationMap::kNoOwner && s.lru[owner]) s.lru[owner]->erase(k);
    s.loc.for_each_partial(k, [&](WorkerId w) {
      if (s.lru[w]) s.lru[w]->erase(k);
    });
    s.loc.clear_owner(k);
    s.loc.clear_partials(k);
    s.loc.set_clean(k);
    s.seen.reset(k);
  }
}

std::size_t Scheduler::memory_bytes() const {
  const State& s = *state_;
  std::size_t b =
      s.loc.memory_bytes() + s.doi.memory_bytes() + s.seen.memory_bytes() + s.pushed.memory_bytes() + s.replicated_trained.memory_bytes();
  b += std::visit([](const auto& mode) { return mode.memory_bytes(); }, s.sync);
  for (const auto& l : s.lru) b += l ? l->memory_bytes() : 0;
  b += s.sketch.memory_bytes();
  if (s.window) b += s.window->memory_bytes();
  return b;
}

void Scheduler::look_ahead(const GlobalBatch& batch) {
  check_evictions_applied("look_ahead");
  State& s = *state_;
  if (!s.window) throw Error("Scheduler::look_ahead without --lookahead");
  if (s.window->size() > config_.lookahead) {
    throw Error("Scheduler::look_ahead: " + std::to_string(s.window->size()) + " batches already shown for a lookahead of " +
                std::to_string(config_.lookahead));
  }
  if (config_.eviction == Eviction::kLru) {
    s.window->add(batch, [](Key, std::uint32_t) {});
    return;
  }
  // A row the window did not need before and a coming batch needs now: its cached copies
  // (the latest holder's, or the partial holders') leave the LRU order, kept by next use.
  const bool replicates = config_.replicates();
  s.window->add(batch, [&](Key k, std::uint32_t next_use) {
    if (replicates && config_.replicated[k]) return;
    auto keep = [&](std::uint32_t w) {
      std::uint32_t slot = s.lru[w]->find(k);
      if (slot != kNoSlot) s.lru[w]->keep_until(slot, next_use);
    };
    const std::uint16_t o = s.loc.owner(k);
    if (o != cache::LocationMap::kNoOwner && config_.models(o)) keep(o);
    s.loc.for_each_partial(k, keep);
  });
}

std::size_t Scheduler::window_size() const { return state_->window ? state_->window->size() : 0; }

std::uint64_t Scheduler::shown_until() const { return state_->window ? state_->window->end() : state_->iteration; }

void Scheduler::check_evictions_applied(const char* what) const {
  if (state_->awaiting_evictions) {
    throw Error(std::string("Scheduler::") + what + " before the other hosts' evictions of iteration " +
                std::to_string(state_->iteration - 1) + " were applied (apply_evictions)");
  }
}

const std::vector<RowEviction>& Scheduler::evictions() const { return scratch_->evictions; }

void Scheduler::apply_evictions(const std::vector<RowEviction>& evictions) {
  State& s = *state_;
  if (!s.awaiting_evictions) throw Error("Scheduler::apply_evictions: no iteration awaits the other hosts' evictions");
  for (const RowEviction& e : evictions) {
    if (e.worker >= config_.workers || e.key >= config_.num_keys) {
      throw Error("an eviction of row " + std::to_string(e.key) + " by worker " + std::to_string(e.worker) + " outside the job");
    }
    if (config_.models(e.worker)) continue;
    if (e.partial) {
      s.loc.remove_partial(e.key, e.worker, false);
    } else if (s.loc.owner(e.key) == e.worker) {
      s.loc.clear_owner(e.key);
    }
    if (e.pushes && config_.prefetch) s.pushed.note(e.key);
  }
  s.awaiting_evictions = false;
}

IterationStats Scheduler::schedule(const GlobalBatch& batch, std::vector<StepPlan>& plans) {
  check_evictions_applied("schedule");
  Stopwatch sw;
  IterationStats alloc;
  index_batch(config_, state_->tables, batch, state_->loc, state_->seen, scratch_->rows);
  std::vector<std::uint32_t>& worker_of = scratch_->worker_of;
  allocate(batch, worker_of, alloc);
  IterationStats st = plan_iteration(batch, worker_of, plans);
  st.sched_ms = sw.millis();
  st.scoring_ms = alloc.scoring_ms;
  st.laia_tables = alloc.laia_tables;
  return st;
}

IterationStats Scheduler::schedule_with(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of,
                                        std::vector<StepPlan>& plans) {
  check_evictions_applied("schedule_with");
  Stopwatch sw;
  index_batch(config_, state_->tables, batch, state_->loc, state_->seen, scratch_->rows);
  IterationStats st = plan_iteration(batch, worker_of, plans);
  st.sched_ms = sw.millis();
  return st;
}

void Scheduler::allocate(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st) {
  State& s = *state_;
  worker_of.resize(batch.samples);
  switch (config_.policy.allocation()) {
    case Allocation::kLaia: {
      const LaiaStats laia = (config_.host_allocation ? allocate_laia_by_host : allocate_laia)(
          config_, s.iteration, batch, scratch_->rows, s.doi.scored_tables(), scratch_->laia, worker_of);
      st.scoring_ms = laia.scoring_ms;
      st.laia_tables = laia.laia_tables;
      if (config_.budget_ms > 0) s.doi.record(config_, batch, st.scoring_ms, s.iteration, s.lru);
      if (config_.refine_allocation) refine_allocation(config_, batch, scratch_->rows, s.loc, worker_of);
      break;
    }
    case Allocation::kBrute: {
      // Each allocation planned on a copy of the scheduler; its rows moved are its cost.
      std::vector<StepPlan> plans;
      auto cost = [&](const std::vector<std::uint32_t>& perm) {
        Scheduler trial(*this);
        return trial.schedule_with(batch, perm, plans).traffic.transmissions();
      };
      allocate_brute(config_.workers, cost, worker_of);
      break;
    }
    case Allocation::kRandom:
      allocate_random(config_, s.iteration, batch.samples, worker_of);
      break;
  }
}

IterationStats Scheduler::plan_iteration(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of,
                                         std::vector<StepPlan>& plans) {
  State& s = *state_;
  BatchRows& rows = scratch_->rows;
  const std::uint32_t W = config_.workers, n = batch.samples, B = config_.batch_per_worker;
  if (n != W * B) {
    throw ConfigError("global batch of " + std::to_string(n) + " samples; expected workers x batch-per-worker = " + std::to_string(W * B));
  }
  // The window's next uses move past this batch: a row of it is next needed later.
  if (s.window) s.window->pop(batch);
  deal_samples(config_, s.iteration, worker_of, n, plans);
  index_trainers(config_, s.iteration, batch, plans, *s.lru[s.modelled.front()], rows);
  const FrequencySketch* admission = nullptr;
  if (config_.admission != Admission::kNone) {
    // The batch's rows counted before its pulls: a row's appearance now counts toward
    // its admission now (replicated and uncached rows never take a cache slot).
    std::vector<Key>& counted = scratch_->counted;
    counted.clear();
    for (std::uint32_t d = 0; d < rows.size(); ++d) {
      if (!rows.replicated_d[d] && !rows.uncached_d[d]) counted.push_back(rows.keys[d]);
    }
    s.sketch.record(counted);
    admission = &s.sketch;
  }
  Iteration it{config_,  rows, s.lru, s.modelled, s.loc, s.pushed, plans, s.window ? &*s.window : nullptr, config_.prefetch && s.planned,
               admission};
  std::visit([&](auto& mode) { run_phases(mode, it); }, s.sync);
  if (config_.id_rows_for >= 0) index_ids(batch, static_cast<std::uint32_t>(config_.id_rows_for), rows, plans[config_.id_rows_for]);
  return finish_iteration(plans);
}

IterationStats Scheduler::finish_iteration(std::vector<StepPlan>& plans) {
  State& s = *state_;
  const BatchRows& rows = scratch_->rows;
  IterationStats st;
  for (Key k : rows.keys) s.seen.set(k);
  for (const auto& c : rows.per_worker) st.traffic += c;
  // Every worker all-reduces the batch's replicated rows; a flush writes them back.
  for (std::uint32_t d : rows.replicated_rows) s.replicated_trained.note(rows.keys[d]);
  for (StepPlan& plan : plans) {
    plan.replicated.resize(rows.replicated_rows.size());
    for (std::size_t j = 0; j < rows.replicated_rows.size(); ++j) plan.replicated[j] = rows.keys[rows.replicated_rows[j]];
  }
  st.traffic.hot_sync = static_cast<std::uint64_t>(s.modelled.size()) * rows.replicated_rows.size();
  // A scheduler of one host: its evictions, for the others.
  if (config_.model_host >= 0 || config_.list_evictions) {
    scratch_->evictions.clear();
    for (std::uint32_t w : s.modelled)
      scratch_->evictions.insert(scratch_->evictions.end(), rows.evicted[w].begin(), rows.evicted[w].end());
    s.awaiting_evictions = s.modelled.size() < config_.workers;
  }
  ++s.iteration;
  s.planned = true;
  return st;
}

TrafficCounts Scheduler::flush(std::vector<StepPlan>& plans, bool evaluation) {
  check_evictions_applied("flush");
  evaluation = evaluation && !config_.evaluation_flushes_all;
  State& s = *state_;
  const std::uint32_t W = config_.workers;
  plans.resize(W);
  TrafficCounts c;
  // Worker 0 takes the handed values into memory at once: at most twice its cache's rows
  // (the memory its own cache holds for their values and gradient sums).
  const bool hand_over = evaluation && config_.hand_evaluated_rows && held_evaluated_rows() <= 2 * std::uint64_t{config_.cache_rows};
  for (std::uint32_t w = 0; w < W; ++w) {
    StepPlan& plan = plans[w];
    plan.clear();
    plan.iteration = s.iteration;
    plan.worker = w;
    if (!config_.models(w)) continue;
    const WorkerCache& lru = *s.lru[w];
    for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
      if (!lru.occupied(slot)) continue;
      const Key k = lru.key_at(slot);
      if (s.loc.flushed(k) || (evaluation && !s.evaluated.test(k))) continue;
      if (s.loc.owner(k) == w) {
        if (s.loc.dirty(k) && hand_over) {
          plan.eval_hands.push_back({k, slot});
          ++c.eval_handed;
        } else if (s.loc.dirty(k)) {
          plan.push_values.push_back({k, slot});
          ++c.push_value;
        }
      } else if (s.loc.is_partial(k, w)) {
        plan.push_grads.push_back({k, slot});
        ++c.push_grad;
      }
    }
  }
  // Every row with an update the PS lacks (a dirty owner's, partial holders') is now
  // flushed, the other hosts' too: marked over the whole key space (or the evaluated
  // rows), as every host must.
  auto mark = [&](Key k) {
    if (s.loc.flushed(k)) return;
    const bool dirty_owner = s.loc.owner(k) != cache::LocationMap::kNoOwner && s.loc.dirty(k);
    if ((!dirty_owner || hand_over) && !s.loc.has_partial(k)) return;
    s.loc.set_flushed(k, true);
    if (config_.prefetch) s.pushed.note(k);
  };
  if (evaluation) {
    for (Key k : s.evaluated_keys) mark(k);
  } else {
    for (Key k = 0; k < config_.num_keys; ++k) mark(k);
  }
  // Worker 0 writes the replicated rows trained since the last flush back to the PS (the
  // replicas agree). Nobody pulls them before the next flush, so prefetch is unaffected.
  if (!s.replicated_trained.keys().empty()) {
    if (config_.models(0)) {
      plans[0].replicated_flush = s.replicated_trained.keys();
      c.hot_flush = s.replicated_trained.keys().size();
    }
    s.replicated_trained.clear();
  }
  return c;
}

std::uint64_t Scheduler::held_evaluated_rows() const {
  const State& s = *state_;
  std::uint64_t n = 0;
  for (Key k : s.evaluated_keys) n += !s.loc.flushed(k) && s.loc.owner(k) != cache::LocationMap::kNoOwner && s.loc.dirty(k);
  return n;
}

std::vector<KeySlot> Scheduler::latest_rows(WorkerId w) const {
  check_evictions_applied("latest_rows");
  std::vector<KeySlot> rows;
  const WorkerCache& lru = cache_of(w);
  for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
    if (lru.occupied(slot) && state_->loc.owner(lru.key_at(slot)) == w) rows.push_back({lru.key_at(slot), slot});
  }
  return rows;
}

}  // namespace ember::scheduler
