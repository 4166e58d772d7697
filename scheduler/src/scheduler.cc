#include "ember/scheduler/scheduler.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/hash.h"
#include "ember/common/process.h"
#include "ember/data/zipf.h"
#include "window.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kNoSlot = cache::LruIndex::kNone;
constexpr std::uint32_t kDoiInterval = 16;  // iterations between DoI updates
constexpr std::uint32_t kDoiSamplesPerWorker = 4096;

inline std::uint64_t bit(std::uint32_t w) { return std::uint64_t{1} << w; }

// std::popcount without -mpopcnt is a library call; this one inlines.
inline int popcount64(std::uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
}

// Calls f(w) for each set bit w of mask, in increasing order.
template <typename F>
void for_each_bit(std::uint64_t mask, F&& f) {
  while (mask != 0) {
    f(static_cast<std::uint32_t>(std::countr_zero(mask)));
    mask &= mask - 1;
  }
}

}  // namespace

// Per-batch working memory, reused across iterations.
struct Scheduler::Scratch {
  U64Map<std::uint32_t> index;                 // key -> d (distinct rows of the batch)
  std::vector<Key> keys;                       // d -> key
  std::vector<std::uint64_t> umask;            // d -> workers training it (U(k))
  std::vector<std::uint32_t> dpos;             // (sample, table) -> d, or kHotD
  std::vector<std::uint32_t> stamp;            // d -> last worker + 1 that listed it
  std::vector<std::vector<std::uint32_t>> kw;  // worker -> its distinct d, first-appearance order
  std::vector<std::uint32_t> dslot;            // d * W + w -> slot of the row in w's cache
  std::vector<std::uint16_t> scores;           // sample * W + w
  std::vector<std::uint32_t> worker_of;
  std::vector<TrafficCounts> per_worker;
  std::vector<std::uint32_t> hot_keys;   // distinct replicated hot rows of the batch (d of index)
  std::vector<std::uint8_t> owner_d;     // d -> latest holder before the iteration
  std::vector<std::uint8_t> partial_d;   // d -> had partial holders before the iteration
  std::vector<std::uint8_t> hot_d;       // d -> replicated hot row
  std::vector<std::uint8_t> cold_d;      // d -> no earlier iteration used the row
  std::vector<std::uint8_t> uncached_d;  // d -> of an uncached table (staged, not cached)
};

Scheduler::Scheduler(SchedulerConfig config)
    : config_(std::move(config)),
      tables_(static_cast<std::uint32_t>(config_.table_offsets.size())),
      loc_(std::max<std::uint64_t>(config_.num_keys, 1), std::max<std::uint32_t>(config_.workers, 1)),
      scratch_(std::make_unique<Scratch>()) {
  const auto& c = config_;
  if (c.workers == 0 || c.workers > cache::LocationMap::kMaxWorkers) throw ConfigError("--workers must be in [1, 64]");
  if (c.batch_per_worker == 0) throw ConfigError("--batch-per-worker must be positive");
  if (c.cache_rows == 0) throw ConfigError("cache capacity must be at least one row");
  if (tables_ == 0 || c.num_keys == 0) throw ConfigError("no embedding tables");
  if (c.partitions == 0 || c.batch_per_worker % c.partitions != 0) {
    throw ConfigError("--partitions must divide --batch-per-worker");
  }
  check_lookahead(c);
  if (c.refine_allocation && c.policy.allocation() != Allocation::kLaia) {
    throw ConfigError("--refine-allocation refines LAIA's allocation (laia, herald), not " + c.policy.name() + "'s");
  }
  if (c.policy.allocation() == Allocation::kBrute && (c.batch_per_worker != 1 || c.workers > 8)) {
    throw ConfigError("brute force needs --batch-per-worker 1 and at most 8 workers (it tries all W! allocations)");
  }
  std::uint32_t capacity = c.cache_rows;
  if (c.policy.replicates_hot_rows() && c.hot.size() != c.num_keys) throw ConfigError("fae: the hot-row profile must cover every key");
  if (!c.hot.empty() && c.hot.size() != c.num_keys) throw ConfigError("the replicated rows must be given for every key");
  if (!c.uncached.empty() && c.uncached.size() != c.num_keys) throw ConfigError("the uncached rows must be given for every key");
  if (!c.treatments.empty() && c.treatments.size() != tables_) throw ConfigError("a placement must give every table a treatment");
  if (c.policy.sync() == Sync::kBoundedStaleness && (!c.treatments.empty() || !c.uncached.empty())) {
    throw ConfigError("a placement does not apply to " + c.policy.name() + ": its copies are kept by version, not by treatment");
  }
  if (c.policy.replicates_hot_rows()) {
    // fae's hot rows are replicated on every worker and take their share of the cache (a
    // replicated table's rows do not: the plan gives them memory of their own).
    std::uint64_t hot = 0;
    for (std::uint32_t t = 0; t < tables_; ++t) {
      if (!c.treatments.empty() && c.treatments[t] == Treatment::kReplicated) continue;
      hot += static_cast<std::uint64_t>(std::ranges::count(c.in_table(c.hot, t), 1));
    }
    if (hot >= capacity)
      throw ConfigError("fae: the hot set (" + std::to_string(hot) + " rows) fills the whole cache of " + std::to_string(capacity) +
                        " rows");
    capacity -= static_cast<std::uint32_t>(hot);
  }
  const bool by_next_use = c.eviction != Eviction::kLru;
  std::vector<std::uint32_t> groups{capacity};
  if (!c.cache_shares.empty()) {
    // Group 0 is the pool; each table with a share gets the next group and its rows.
    if (c.cache_shares.size() != tables_) throw ConfigError("cache shares must be given for every table");
    group_of_key_.assign(c.num_keys, 0);
    std::uint64_t shared = 0;
    for (std::uint32_t t = 0; t < tables_; ++t) {
      if (c.cache_shares[t] == 0) continue;
      if (!c.treatments.empty() && c.treatments[t] != Treatment::kCache) throw ConfigError("a cache share for a table that is not cached");
      if (groups.size() == 255) throw ConfigError("cache shares for more than 254 tables");
      std::ranges::fill(c.in_table(group_of_key_, t), static_cast<std::uint8_t>(groups.size()));
      groups.push_back(c.cache_shares[t]);
      shared += c.cache_shares[t];
    }
    if (shared >= capacity) {
      throw ConfigError("the tables' cache shares (" + std::to_string(shared) + " rows) leave no pool in the cache of " +
                        std::to_string(capacity) + " rows");
    }
    groups[0] = capacity - static_cast<std::uint32_t>(shared);
  }
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    lru_.push_back(std::make_unique<WorkerCache>(groups, by_next_use, group_of_key_.empty() ? nullptr : &group_of_key_));
  }
  if (c.lookahead > 0) window_ = std::make_unique<Window>(c.num_keys, c.first_iteration);
  if (c.policy.sync() == Sync::kBoundedStaleness) {
    ps_version_.assign(c.num_keys, 0);
    copy_version_.assign(c.workers, std::vector<std::uint32_t>(capacity, 0));
  }
  iteration_ = c.first_iteration;
  scored_tables_.resize(tables_);
  std::iota(scored_tables_.begin(), scored_tables_.end(), 0u);
  doi_.assign(tables_, 0.0);
  if (c.budget_ms > 0) access_.assign(c.num_keys, 0);
  seen_.assign((c.num_keys + 7) / 8, 0);
  if (c.replicates()) replica_trained_.assign(c.num_keys, 0);
  if (c.prefetch) pushed_.assign((c.num_keys + 7) / 8, 0);
}

Scheduler::~Scheduler() = default;

Scheduler::Scheduler(const Scheduler& o)
    : config_(o.config_),
      tables_(o.tables_),
      iteration_(o.iteration_),
      group_of_key_(o.group_of_key_),
      loc_(o.loc_),
      ps_version_(o.ps_version_),
      copy_version_(o.copy_version_),
      access_(o.access_),
      seen_(o.seen_),
      doi_(o.doi_),
      scored_tables_(o.scored_tables_),
      table_cost_ms_(o.table_cost_ms_),
      pushed_(o.pushed_),
      pushed_keys_(o.pushed_keys_),
      replica_trained_(o.replica_trained_),
      replica_trained_keys_(o.replica_trained_keys_),
      planned_(o.planned_),
      window_(o.window_ ? std::make_unique<Window>(*o.window_) : nullptr),
      scratch_(std::make_unique<Scratch>()) {
  for (const auto& l : o.lru_) {
    lru_.push_back(std::make_unique<WorkerCache>(*l));
    lru_.back()->bind(&group_of_key_);
  }
}

std::size_t Scheduler::memory_bytes() const {
  std::size_t b = loc_.memory_bytes() + access_.capacity() * sizeof(std::uint32_t) + ps_version_.capacity() * sizeof(std::uint32_t) +
                  seen_.capacity() + pushed_.capacity() + replica_trained_.capacity();
  for (const auto& l : lru_) b += l->memory_bytes();
  for (const auto& v : copy_version_) b += v.capacity() * sizeof(std::uint32_t);
  if (window_) b += window_->memory_bytes();
  return b;
}

void Scheduler::look_ahead(const GlobalBatch& batch) {
  if (!window_) throw Error("Scheduler::look_ahead without --lookahead");
  if (window_->size() > config_.lookahead) {
    throw Error("Scheduler::look_ahead: " + std::to_string(window_->size()) + " batches already shown for a lookahead of " +
                std::to_string(config_.lookahead));
  }
  if (config_.eviction == Eviction::kLru) {
    window_->add(batch, [](Key, std::uint32_t) {});
    return;
  }
  // A row the window did not need before and a coming batch needs now: its cached copies
  // (the latest holder's, or the partial holders') leave the LRU order, kept by next use.
  const bool replicate_hot = config_.replicates();
  window_->add(batch, [&](Key k, std::uint32_t next_use) {
    if (replicate_hot && config_.hot[k]) return;
    auto keep = [&](std::uint32_t w) {
      std::uint32_t slot = lru_[w]->find(k);
      if (slot != kNoSlot) lru_[w]->keep_until(slot, next_use);
    };
    const std::uint8_t o = loc_.owner(k);
    if (o != cache::LocationMap::kNoOwner) keep(o);
    for_each_bit(loc_.partial(k), keep);
  });
}

std::size_t Scheduler::window_size() const { return window_ ? window_->size() : 0; }

std::uint64_t Scheduler::shown_until() const { return window_ ? window_->end() : iteration_; }

IterationStats Scheduler::schedule(const GlobalBatch& batch, std::vector<StepPlan>& plans) {
  Stopwatch sw;
  IterationStats alloc;
  index_batch(batch);
  std::vector<std::uint32_t>& worker_of = scratch_->worker_of;
  allocate(batch, worker_of, alloc);
  IterationStats st = apply(batch, worker_of, plans);
  st.sched_ms = sw.millis();
  st.scoring_ms = alloc.scoring_ms;
  st.laia_tables = alloc.laia_tables;
  return st;
}

IterationStats Scheduler::schedule_with(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of,
                                        std::vector<StepPlan>& plans) {
  Stopwatch sw;
  index_batch(batch);
  IterationStats st = apply(batch, worker_of, plans);
  st.sched_ms = sw.millis();
  return st;
}

void Scheduler::index_batch(const GlobalBatch& batch) {
  Scratch& s = *scratch_;
  const std::uint32_t n = batch.samples, T = batch.tables;
  if (T != tables_)
    throw ConfigError("batch has " + std::to_string(T) + " tables; the scheduler was configured with " + std::to_string(tables_));
  const bool replicate_hot = config_.replicates();
  const bool uncached = !config_.uncached.empty();
  s.index.clear();
  // Sized by the last batch's distinct rows: a small table stays in L2 (it grows when
  // needed).
  s.index.reserve(2 * s.keys.size() + 1024);
  s.keys.clear();
  s.hot_d.clear();
  s.uncached_d.clear();
  s.dpos.resize(static_cast<std::size_t>(n) * T);
  for (std::size_t j = 0; j < s.dpos.size(); ++j) {
    const Key k = batch.keys[j];
    if (k >= config_.num_keys)
      throw ConfigError("key " + std::to_string(k) + " is outside the " + std::to_string(config_.num_keys) + " rows of the tables");
    auto [d, fresh] = s.index.try_emplace(k, static_cast<std::uint32_t>(s.keys.size()));
    if (fresh) {
      s.keys.push_back(k);
      s.hot_d.push_back(replicate_hot && config_.hot[k]);
      s.uncached_d.push_back(uncached && config_.uncached[k]);
      loc_.prefetch(k);
    }
    s.dpos[j] = *d;
  }
  const std::size_t D = s.keys.size();
  s.owner_d.resize(D);
  s.partial_d.resize(D);
  s.cold_d.resize(D);
  for (std::size_t d = 0; d < D; ++d) {
    const Key k = s.keys[d];
    s.owner_d[d] = loc_.owner(k);
    s.partial_d[d] = loc_.has_partial(k);
    s.cold_d[d] = (seen_[k >> 3] >> (k & 7) & 1) == 0;
  }
}

void Scheduler::allocate(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st) {
  worker_of.resize(batch.samples);
  switch (config_.policy.allocation()) {
    case Allocation::kLaia:
      allocate_laia(batch, worker_of, st);
      if (config_.refine_allocation) refine_allocation(batch, worker_of);
      break;
    case Allocation::kBrute:
      allocate_brute(batch, worker_of);
      break;
    case Allocation::kRandom:
      allocate_random(batch.samples, worker_of);
      break;
  }
}

void Scheduler::allocate_random(std::uint32_t n, std::vector<std::uint32_t>& worker_of) {
  // Balanced random partition from (seed, iteration): identical in every process.
  data::SplitMix64 rng(mix64(config_.seed ^ mix64(iteration_ + 0x51ed)));
  std::vector<std::uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  for (std::uint32_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  for (std::uint32_t j = 0; j < n; ++j) worker_of[perm[j]] = j / config_.batch_per_worker;
}

void Scheduler::allocate_laia(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st) {
  const std::uint32_t n = batch.samples, W = config_.workers, T = batch.tables;
  auto& scores = scratch_->scores;
  scores.assign(static_cast<std::size_t>(n) * W, 0);
  Stopwatch sw;
  const auto& tables = scored_tables_;
  auto score_range = [&](std::uint32_t begin, std::uint32_t end) {
    for (std::uint32_t i = begin; i < end; ++i) {
      std::uint16_t* s = &scores[static_cast<std::size_t>(i) * W];
      const std::uint32_t* d = &scratch_->dpos[static_cast<std::size_t>(i) * T];
      for (std::uint32_t t : tables) {
        std::uint8_t o = scratch_->owner_d[d[t]];
        if (o != cache::LocationMap::kNoOwner) ++s[o];
      }
    }
  };
  if (config_.threads > 1) {
    tbb::parallel_for(tbb::blocked_range<std::uint32_t>(0, n, 64),
                      [&](const tbb::blocked_range<std::uint32_t>& r) { score_range(r.begin(), r.end()); });
  } else {
    score_range(0, n);
  }
  st.scoring_ms = sw.millis();
  st.laia_tables = static_cast<std::uint32_t>(tables.size());
  // Algorithm 1: each sample, in batch order, to the highest-scoring worker with room;
  // seeded random ties. Partitions (if any) are allocated independently and in parallel.
  const std::uint32_t P = config_.partitions, per = n / P, cap0 = config_.batch_per_worker / P;
  auto allocate_part = [&](std::uint32_t p) {
    data::SplitMix64 rng(mix64(config_.seed ^ mix64(iteration_ * 131 + p + 0x1a1a)));
    std::vector<std::uint32_t> cap(W, cap0), ties;
    ties.reserve(W);
    const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint16_t* s = &scores[static_cast<std::size_t>(i) * W];
      int best = -1;
      ties.clear();
      for (std::uint32_t w = 0; w < W; ++w) {
        if (cap[w] == 0) continue;
        if (s[w] > best) {
          best = s[w];
          ties.clear();
        }
        if (s[w] == best) ties.push_back(w);
      }
      std::uint32_t w = ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
      worker_of[i] = w;
      --cap[w];
    }
  };
  if (P > 1 && config_.threads > 1) {
    tbb::parallel_for(0u, P, allocate_part);
  } else {
    for (std::uint32_t p = 0; p < P; ++p) allocate_part(p);
  }
  if (config_.budget_ms > 0) profile(batch, st.scoring_ms);
}

void Scheduler::refine_allocation(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of) {
  // The batch's cost of a row trained by the workers U, in hundredths of a row: a pull
  // for each trainer but its latest holder o; on demand, o's value push when another
  // trains it (o dirty), and half a row per trainer of a shared row (its partial
  // gradients are pushed, and it pulled by every trainer, when it is next used);
  // full-set, a gradient push per trainer.
  constexpr std::int64_t kRow = 100, kShared = 50;
  constexpr int kPasses = 3;
  Scratch& s = *scratch_;
  const std::uint32_t n = batch.samples, W = config_.workers, T = batch.tables;
  const std::uint32_t D = static_cast<std::uint32_t>(s.keys.size());
  const bool on_demand = config_.policy.sync() == Sync::kOnDemand;
  std::vector<std::uint64_t> owner_bit(D, 0);
  std::vector<std::uint8_t> dirty(D, 0);
  for (std::uint32_t d = 0; d < D; ++d) {
    const std::uint8_t o = s.owner_d[d];
    if (o == cache::LocationMap::kNoOwner) continue;
    owner_bit[d] = bit(o);
    dirty[d] = on_demand && loc_.dirty(s.keys[d]);
  }
  auto cost = [&](std::uint32_t d, std::uint64_t U) -> std::int64_t {
    const std::uint64_t others = U & ~owner_bit[d];
    const int m = popcount64(U);
    std::int64_t c = kRow * popcount64(others);
    if (!on_demand) return c + kRow * m;
    if (dirty[d] && others != 0) c += kRow;
    if (m > 1) c += kShared * m;
    return c;
  };
  // Samples per (row, worker), and each row's trainers.
  std::vector<std::uint32_t> count(static_cast<std::size_t>(D) * W, 0);
  std::vector<std::uint64_t> trainers(D, 0);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t* dp = &s.dpos[static_cast<std::size_t>(i) * T];
    for (std::uint32_t t = 0; t < T; ++t) {
      ++count[static_cast<std::size_t>(dp[t]) * W + worker_of[i]];
      trainers[dp[t]] |= bit(worker_of[i]);
    }
  }
  // The change in cost if sample i moves from worker a to b.
  auto move_delta = [&](std::uint32_t i, std::uint32_t a, std::uint32_t b) {
    std::int64_t delta = 0;
    const std::uint32_t* dp = &s.dpos[static_cast<std::size_t>(i) * T];
    for (std::uint32_t t = 0; t < T; ++t) {
      const std::uint32_t d = dp[t];
      const std::uint64_t U = trainers[d];
      std::uint64_t U2 = U | bit(b);
      if (count[static_cast<std::size_t>(d) * W + a] == 1) U2 &= ~bit(a);
      if (U2 != U) delta += cost(d, U2) - cost(d, U);
    }
    return delta;
  };
  auto move = [&](std::uint32_t i, std::uint32_t a, std::uint32_t b) {
    const std::uint32_t* dp = &s.dpos[static_cast<std::size_t>(i) * T];
    for (std::uint32_t t = 0; t < T; ++t) {
      const std::uint32_t d = dp[t];
      if (--count[static_cast<std::size_t>(d) * W + a] == 0) trainers[d] &= ~bit(a);
      ++count[static_cast<std::size_t>(d) * W + b];
      trainers[d] |= bit(b);
    }
    worker_of[i] = b;
  };
  // Passes over every pair of workers (a, b) of every partition: the samples of a ranked
  // by the change of moving them to b, those of b by moving to a. In that order, each
  // sample i of a is swapped with the first of the next few unswapped samples j of b
  // whose predicted sum is negative and whose exact change (after i moves) is too.
  constexpr std::size_t kTries = 4;
  const std::uint32_t P = config_.partitions, per = n / P;
  std::vector<std::pair<std::int64_t, std::uint32_t>> ra, rb;
  std::vector<std::uint8_t> taken;
  std::vector<std::vector<std::uint32_t>> members(W);
  for (int pass = 0; pass < kPasses; ++pass) {
    bool swapped = false;
    for (std::uint32_t p = 0; p < P; ++p) {
      const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
      for (auto& m : members) m.clear();
      for (std::uint32_t i = begin; i < end; ++i) members[worker_of[i]].push_back(i);
      for (std::uint32_t a = 0; a < W; ++a) {
        for (std::uint32_t b = a + 1; b < W; ++b) {
          ra.clear();
          rb.clear();
          for (std::uint32_t i : members[a]) ra.emplace_back(move_delta(i, a, b), i);
          for (std::uint32_t j : members[b]) rb.emplace_back(move_delta(j, b, a), j);
          std::sort(ra.begin(), ra.end());
          std::sort(rb.begin(), rb.end());
          taken.assign(rb.size(), 0);
          std::size_t first = 0;  // the first untaken sample of b
          bool moved = false;
          for (const auto& [predicted, i] : ra) {
            while (first < rb.size() && taken[first]) ++first;
            if (first == rb.size() || predicted + rb[first].first >= 0) break;
            const std::int64_t di = move_delta(i, a, b);
            move(i, a, b);
            bool done = false;
            for (std::size_t k = first, tried = 0; k < rb.size() && tried < kTries && predicted + rb[k].first < 0; ++k) {
              if (taken[k]) continue;
              ++tried;
              const std::uint32_t j = rb[k].second;
              if (di + move_delta(j, b, a) < 0) {
                move(j, b, a);
                taken[k] = 1;
                done = true;
                break;
              }
            }
            if (done) {
              moved = true;
            } else {
              move(i, b, a);
            }
          }
          if (!moved) continue;
          swapped = true;
          members[a].clear();
          members[b].clear();
          for (std::uint32_t i = begin; i < end; ++i) {
            if (worker_of[i] == a || worker_of[i] == b) members[worker_of[i]].push_back(i);
          }
        }
      }
    }
    if (!swapped) break;
  }
}

void Scheduler::allocate_brute(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of) {
  // Every assignment of the W samples to the W workers; the one moving fewest rows in
  // this iteration wins (first in lexicographic order on ties), as Herald's Appendix C.
  const std::uint32_t W = config_.workers;
  std::vector<std::uint32_t> perm(W), best;
  std::iota(perm.begin(), perm.end(), 0u);
  std::uint64_t best_cost = ~std::uint64_t{0};
  std::vector<StepPlan> plans;
  do {
    Scheduler trial(*this);
    std::uint64_t cost = trial.schedule_with(batch, perm, plans).traffic.transmissions();
    if (cost < best_cost) {
      best_cost = cost;
      best = perm;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  worker_of = best;
}

void Scheduler::profile(const GlobalBatch& batch, double scoring_ms) {
  for (Key k : batch.keys) {
    if (access_[k] != UINT32_MAX) ++access_[k];
  }
  if (!scored_tables_.empty()) {
    double per_table = scoring_ms / static_cast<double>(scored_tables_.size());
    table_cost_ms_ = table_cost_ms_ == 0 ? per_table : 0.9 * table_cost_ms_ + 0.1 * per_table;
  }
  if ((iteration_ + 1) % kDoiInterval != 0) return;
  // DoI per table over a deterministic sample of cached rows: the share accessed fewer
  // times than the samples one worker has trained so far.
  const double per_worker = static_cast<double>(iteration_ + 1) * config_.batch_per_worker;
  std::vector<std::uint64_t> cached(tables_, 0), rare(tables_, 0);
  data::SplitMix64 rng(mix64(config_.seed ^ (iteration_ + 0xd01)));
  for (const auto& l : lru_) {
    if (l->size() == 0) continue;
    for (std::uint32_t i = 0; i < kDoiSamplesPerWorker; ++i) {
      std::uint32_t s = static_cast<std::uint32_t>(rng.below(l->capacity()));
      if (!l->occupied(s)) continue;
      Key k = l->key_at(s);
      auto t = static_cast<std::uint32_t>(std::upper_bound(config_.table_offsets.begin(), config_.table_offsets.end(), k) -
                                          config_.table_offsets.begin() - 1);
      ++cached[t];
      rare[t] += access_[k] < per_worker;
    }
  }
  for (std::uint32_t t = 0; t < tables_; ++t) doi_[t] = cached[t] ? static_cast<double>(rare[t]) / static_cast<double>(cached[t]) : 0.0;
  std::uint32_t k = tables_;
  if (table_cost_ms_ > 0) {
    k = static_cast<std::uint32_t>(std::clamp(std::floor(config_.budget_ms / table_cost_ms_), 1.0, static_cast<double>(tables_)));
  }
  std::vector<std::uint32_t> order(tables_);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return doi_[a] > doi_[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  scored_tables_ = order;
}

void Scheduler::check_groups(std::uint32_t w, const std::vector<std::uint32_t>& kw) const {
  // Each LRU of a worker holds its micro-batch's rows of that group's tables.
  const Scratch& s = *scratch_;
  const WorkerCache& lru = *lru_[w];
  std::vector<std::uint32_t> need(lru.groups(), 0);
  for (std::uint32_t d : kw) {
    if (!s.uncached_d[d]) ++need[lru.group(s.keys[d])];
  }
  for (std::uint32_t g = 0; g < need.size(); ++g) {
    if (need[g] > lru.group_capacity(g)) {
      throw ConfigError(std::string(g == 0 ? "the cache's pool" : "cache share " + std::to_string(g)) + " (" +
                        std::to_string(lru.group_capacity(g)) + " rows) cannot hold the " + std::to_string(need[g]) +
                        " distinct rows of its tables in worker " + std::to_string(w) + "'s micro-batch (iteration " +
                        std::to_string(iteration_) + "); give it more rows");
    }
  }
}

IterationStats Scheduler::apply(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of, std::vector<StepPlan>& plans) {
  IterationStats st;
  Scratch& s = *scratch_;
  const std::uint32_t W = config_.workers, n = batch.samples, T = batch.tables, B = config_.batch_per_worker;
  const Policy& policy = config_.policy;
  const bool on_demand = policy.sync() == Sync::kOnDemand;
  const bool bounded_staleness = policy.sync() == Sync::kBoundedStaleness;
  const bool replicate_hot = config_.replicates();
  if (n != W * B) {
    throw ConfigError("global batch of " + std::to_string(n) + " samples; expected workers x batch-per-worker = " + std::to_string(W * B));
  }
  // The window's next uses move past this batch: a row of it is next needed later.
  if (window_) window_->pop(batch);
  const bool by_next_use = config_.eviction != Eviction::kLru;
  plans.resize(W);
  for (std::uint32_t w = 0; w < W; ++w) {
    plans[w].clear();
    plans[w].iteration = iteration_;
    plans[w].worker = w;
  }
  for (std::uint32_t i = 0; i < n; ++i) plans[worker_of[i]].samples.push_back(i);
  for (std::uint32_t w = 0; w < W; ++w) {
    if (plans[w].samples.size() != B) throw Error("allocation is not balanced");
  }
  // Who trains each distinct row: U(k).
  const std::uint32_t D = static_cast<std::uint32_t>(s.keys.size());
  s.umask.assign(D, 0);
  s.hot_keys.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint64_t wb = bit(worker_of[i]);
    const std::uint32_t* d = &s.dpos[static_cast<std::size_t>(i) * T];
    for (std::uint32_t t = 0; t < T; ++t) s.umask[d[t]] |= wb;
  }
  if (replicate_hot) {
    for (std::uint32_t d = 0; d < D; ++d) {
      if (s.hot_d[d]) s.hot_keys.push_back(d);
    }
  }
  // Each worker's distinct rows in micro-batch order.
  s.kw.resize(W);
  s.stamp.assign(D, 0);
  for (std::uint32_t w = 0; w < W; ++w) {
    auto& kw = s.kw[w];
    kw.clear();
    std::size_t staged = 0;
    for (std::uint32_t i : plans[w].samples) {
      for (std::uint32_t t = 0; t < T; ++t) {
        std::uint32_t d = s.dpos[static_cast<std::size_t>(i) * T + t];
        if (s.stamp[d] == w + 1 || (replicate_hot && s.hot_d[d])) continue;
        s.stamp[d] = w + 1;
        kw.push_back(d);
        staged += s.uncached_d[d];
      }
    }
    if (lru_[w]->groups() > 1) check_groups(w, kw);
    if (kw.size() - staged > lru_[w]->capacity()) {
      throw ConfigError("the cache of " + std::to_string(lru_[w]->capacity()) + " rows cannot hold the " +
                        std::to_string(kw.size() - staged) + " distinct rows of worker " + std::to_string(w) +
                        "'s micro-batch (iteration " + std::to_string(iteration_) + "); raise --cache-ratio or lower --batch-per-worker");
    }
  }
  s.per_worker.assign(W, TrafficCounts{});
  s.dslot.assign(static_cast<std::size_t>(D) * W, kNoSlot);

  // 1. Sync on demand: partial holders of a needed row push their gradients (the PS
  //    aggregates and applies once); a dirty owner pushes its value if another needs it.
  if (on_demand) {
    // Two-stage prefetch: the partial mask 16 rows ahead, the holders' index entries 8
    // ahead; these rows miss the cache otherwise.
    constexpr std::uint32_t kFar = 16, kNear = 8;
    for (std::uint32_t d = 0; d < D; ++d) {
      if (d + kFar < D && s.partial_d[d + kFar]) loc_.prefetch_partial(s.keys[d + kFar]);
      if (d + kNear < D) {
        const Key kn = s.keys[d + kNear];
        if (s.partial_d[d + kNear]) for_each_bit(loc_.partial(kn), [&](std::uint32_t w) { lru_[w]->prefetch(kn); });
        // An owner that may have to push its value to another trainer.
        const std::uint8_t on = s.owner_d[d + kNear];
        if (on != cache::LocationMap::kNoOwner && (s.umask[d + kNear] & ~bit(on)) != 0) lru_[on]->prefetch(kn);
      }
      const Key k = s.keys[d];
      const std::uint64_t U = s.umask[d];
      if (s.partial_d[d]) {
        // A flushed aggregate is at the PS already: the copies just leave.
        const bool flushed = loc_.flushed(k);
        std::uint64_t P = loc_.partial(k);
        for_each_bit(P, [&](std::uint32_t w) {
          std::uint32_t slot = lru_[w]->erase(k);
          if (flushed) return;
          plans[w].push_grads.push_back({k, slot});
          ++s.per_worker[w].push_grad;
        });
        loc_.set_partial(k, 0);
        if (config_.prefetch && !flushed) note_pushed(k);
      }
      std::uint8_t o = s.owner_d[d];
      if (o != cache::LocationMap::kNoOwner && (U & ~bit(o)) != 0 && loc_.dirty(k)) {
        if (!loc_.flushed(k)) {
          plans[o].push_values.push_back({k, lru_[o]->find(k)});
          ++s.per_worker[o].push_value;
          if (config_.prefetch) note_pushed(k);
        }
        loc_.set_clean(k);
      }
    }
  }

  // 2. Pulls, worker by worker (independent: in parallel when threads > 1). Hits are
  //    refreshed first, then missing rows pulled, in order of first appearance, so a row
  //    needed now is never evicted for another.
  const std::uint32_t S = policy.staleness();
  const bool prefetch = config_.prefetch && planned_;
  auto pull_worker = [&](std::uint32_t w) {
    WorkerCache& lru = *lru_[w];
    StepPlan& plan = plans[w];
    TrafficCounts& c = s.per_worker[w];
    const auto& kw = s.kw[w];
    plan.rows.resize(kw.size());
    std::uint32_t next_staging = config_.cache_rows;  // uncached rows' slots, past the cache's
    // Index entries 16 rows ahead; for hits, their list nodes 8 ahead (found early and
    // kept in plan.rows until used).
    constexpr std::size_t kFar = 16, kNear = 8;
    const std::size_t nk = kw.size();
    for (std::size_t j = 0; j < std::min(nk, kNear); ++j) {
      if (!bounded_staleness && s.owner_d[kw[j]] == w) plan.rows[j].slot = lru.find(s.keys[kw[j]]);
    }
    for (std::size_t j = 0; j < nk; ++j) {
      if (j + kFar < nk) lru.prefetch(s.keys[kw[j + kFar]]);
      if (!bounded_staleness && j + kNear < nk && s.owner_d[kw[j + kNear]] == w) {
        std::uint32_t early = lru.find(s.keys[kw[j + kNear]]);
        plan.rows[j + kNear].slot = early;
        lru.prefetch_slot(early);
      }
      const std::uint32_t d = kw[j];
      const Key k = s.keys[d];
      std::uint32_t slot = kNoSlot;
      if (s.uncached_d[d]) {
        // Never cached: no hit, and the LRU never sees it.
      } else if (bounded_staleness) {
        std::uint32_t cs = lru.find(k);
        if (cs != kNoSlot && ps_version_[k] - copy_version_[w][cs] <= S) slot = cs;
      } else if (s.owner_d[d] == w) {
        // Latest at w before the iteration, and w needs it now: still there.
        slot = plan.rows[j].slot;
      }
      plan.rows[j] = {k, slot, static_cast<std::uint32_t>(std::popcount(s.umask[d])), s.uncached_d[d] != 0};
      if (slot != kNoSlot) {
        // By next use, this iteration's rows are held (never evicted) until all are in.
        if (by_next_use) {
          lru.hold(slot);
        } else {
          lru.touch(slot);
        }
        ++c.hits;
      }
    }
    for (std::size_t j = 0; j < kw.size(); ++j) {
      RowRef& row = plan.rows[j];
      if (row.slot != kNoSlot) continue;
      const Key k = row.key;
      PullEntry pull{k, kNoSlot, 0, EvictKind::kNone};
      std::uint32_t stale = bounded_staleness ? lru.find(k) : kNoSlot;
      if (row.uncached) {
        pull.slot = next_staging++;
      } else if (stale != kNoSlot) {
        // A copy too many versions behind is refreshed in place.
        lru.touch(stale);
        pull.slot = stale;
      } else {
        if (lru.full(k)) {
          Key e;
          lru.evict(k, e);
          pull.evicted = e;
          if (bounded_staleness) {
            pull.kind = EvictKind::kClean;  // gradients were pushed when computed
            loc_.remove_holder(e, w);
          } else if (loc_.owner(e) == w) {
            pull.kind = loc_.dirty(e) && !loc_.flushed(e) ? EvictKind::kDirty : EvictKind::kClean;
            loc_.clear_owner(e);
          } else if (loc_.partial(e) & bit(w)) {
            pull.kind = loc_.flushed(e) ? EvictKind::kClean : EvictKind::kPartial;  // flushed: the PS has it
            loc_.clear_partial_bit(e, w);
          } else {
            throw Error("scheduler invariant broken: worker " + std::to_string(w) + " caches row " + std::to_string(e) +
                        " as neither latest nor partial");
          }
          if (pull.kind == EvictKind::kDirty || pull.kind == EvictKind::kPartial) ++c.push_evict;
          c.evict_partial += pull.kind == EvictKind::kPartial;
        }
        pull.slot = by_next_use ? lru.insert_held(k) : lru.insert(k);
      }
      if (bounded_staleness) {
        copy_version_[w][pull.slot] = ps_version_[k];
        loc_.add_holder(k, w);
      }
      row.slot = pull.slot;
      // An uncached row's gradient always goes to the PS, which applies the optimizer.
      pull.with_state = bounded_staleness || (!row.shared() && !row.uncached);
      pull.prefetch = prefetch && !was_pushed(k);
      plan.pulls.push_back(pull);
      ++c.pulls;
      c.prefetched += pull.prefetch;
      c.pull_state += pull.with_state;
      c.cold_pulls += s.cold_d[kw[j]];
    }
    if (by_next_use) {
      // Released in the order plain LRU touches them (hits, then pulls): into the LRU
      // order if no batch of the window needs them, else kept by their next use. The
      // pulls are the rows without a hit, in the same order.
      std::size_t next_pull = 0;
      for (const RowRef& row : plan.rows) {
        if (next_pull < plan.pulls.size() && plan.pulls[next_pull].key == row.key) {
          ++next_pull;
        } else {
          lru.release(row.slot, window_->next_use(row.key));
        }
      }
      for (const PullEntry& p : plan.pulls) {
        if (p.slot < config_.cache_rows) lru.release(p.slot, window_->next_use(p.key));  // staged rows are not the LRU's
      }
    }
    for (std::size_t j = 0; j < kw.size(); ++j) s.dslot[static_cast<std::size_t>(kw[j]) * W + w] = plan.rows[j].slot;
  };
  if (config_.threads > 1 && W > 1) {
    tbb::parallel_for(0u, W, pull_worker);
  } else {
    for (std::uint32_t w = 0; w < W; ++w) pull_worker(w);
  }
  if (config_.prefetch) {
    // From here on, what changes the PS's rows before the next iteration's pulls: this
    // iteration's evictions (below), its end pushes (step 3), a flush, the next sync.
    for (Key k : pushed_keys_) pushed_[k >> 3] = 0;
    pushed_keys_.clear();
    for (const StepPlan& plan : plans) {
      for (const PullEntry& p : plan.pulls) {
        if (p.kind == EvictKind::kDirty || p.kind == EvictKind::kPartial) note_pushed(p.evicted);
      }
    }
  }

  // 3. Train: a sole trainer ends with the latest (dirty) copy; several trainers each
  //    keep a partial gradient; a latest copy elsewhere is now stale and dropped.
  //    Full-set policies then push every trained row's gradient at once.
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + 8 < D) {
      const std::uint64_t Un = s.umask[d + 8];
      if (on_demand && std::popcount(Un) > 1) loc_.prefetch_partial(s.keys[d + 8]);
      // The holder of a copy the next rows' trainers make stale: its index entry.
      const std::uint8_t on = s.owner_d[d + 8];
      if (on != cache::LocationMap::kNoOwner && (Un & bit(on)) == 0) lru_[on]->prefetch(s.keys[d + 8]);
    }
    const Key k = s.keys[d];
    const std::uint64_t U = s.umask[d];
    if (replicate_hot && s.hot_d[d]) {
      if (!replica_trained_[k]) replica_trained_keys_.push_back(k);
      replica_trained_[k] = 1;
      continue;
    }
    auto slot_of = [&](std::uint32_t w) { return s.dslot[static_cast<std::size_t>(d) * W + w]; };
    if (s.uncached_d[d]) {
      // Every trainer pushes its gradient (the PS applies the sum) and drops the copy.
      for_each_bit(U, [&](std::uint32_t w) {
        plans[w].end_pushes.push_back({k, slot_of(w)});
        plans[w].drops.push_back({k, slot_of(w)});
        ++s.per_worker[w].push_grad;
      });
      if (config_.prefetch) note_pushed(k);
      continue;
    }
    const std::uint32_t w0 = static_cast<std::uint32_t>(std::countr_zero(U));
    const bool sole = std::popcount(U) == 1;
    if (bounded_staleness) {
      ++ps_version_[k];
      for_each_bit(U, [&](std::uint32_t w) {
        plans[w].end_pushes.push_back({k, slot_of(w)});
        ++s.per_worker[w].push_grad;
      });
      // The sole trainer applied its own update: its copy is as new as the PS's.
      if (sole) copy_version_[w0][slot_of(w0)] = ps_version_[k];
      std::uint64_t holders = loc_.holders(k);
      for_each_bit(holders, [&](std::uint32_t h) {
        std::uint32_t slot = lru_[h]->find(k);
        if (ps_version_[k] - copy_version_[h][slot] > S) {
          lru_[h]->erase(k);
          plans[h].drops.push_back({k, slot});
          holders &= ~bit(h);
        }
      });
      loc_.set_holders(k, holders);
      continue;
    }
    // The holder before the iteration, if it did not train the row, now has a stale
    // copy (unless it evicted it meanwhile: erase then finds nothing).
    std::uint8_t o = s.owner_d[d];
    if (o != cache::LocationMap::kNoOwner && (U & bit(o)) == 0) {
      std::uint32_t slot = lru_[o]->erase(k);
      if (slot != kNoSlot) plans[o].drops.push_back({k, slot});
    }
    if (on_demand) {
      if (sole) {
        loc_.set_owner(k, w0, true);
      } else {
        loc_.clear_owner(k);
        loc_.set_partial(k, U);
      }
    } else {
      for_each_bit(U, [&](std::uint32_t w) {
        plans[w].end_pushes.push_back({k, slot_of(w)});
        ++s.per_worker[w].push_grad;
      });
      if (config_.prefetch) note_pushed(k);
      if (sole) {
        loc_.set_owner(k, w0, false);
      } else {
        loc_.clear_owner(k);
        for_each_bit(U, [&](std::uint32_t w) {
          lru_[w]->erase(k);
          plans[w].drops.push_back({k, slot_of(w)});
        });
      }
    }
  }
  for (std::uint32_t d = 0; d < D; ++d) seen_[s.keys[d] >> 3] |= static_cast<std::uint8_t>(1u << (s.keys[d] & 7));
  for (const auto& c : s.per_worker) st.traffic += c;
  // Every worker all-reduces the batch's replicated rows.
  for (std::uint32_t w = 0; w < W; ++w) {
    plans[w].replicated.resize(s.hot_keys.size());
    for (std::size_t j = 0; j < s.hot_keys.size(); ++j) plans[w].replicated[j] = s.keys[s.hot_keys[j]];
  }
  st.traffic.hot_sync = static_cast<std::uint64_t>(W) * s.hot_keys.size();
  ++iteration_;
  planned_ = true;
  return st;
}

TrafficCounts Scheduler::flush(std::vector<StepPlan>& plans) {
  const std::uint32_t W = config_.workers;
  plans.resize(W);
  TrafficCounts c;
  for (std::uint32_t w = 0; w < W; ++w) {
    StepPlan& plan = plans[w];
    plan.clear();
    plan.iteration = iteration_;
    plan.worker = w;
    WorkerCache& lru = *lru_[w];
    for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
      if (!lru.occupied(slot)) continue;
      const Key k = lru.key_at(slot);
      if (loc_.flushed(k)) continue;
      if (loc_.owner(k) == w) {
        if (loc_.dirty(k)) {
          plan.push_values.push_back({k, slot});
          ++c.push_value;
        }
      } else if (loc_.partial(k) & bit(w)) {
        plan.push_grads.push_back({k, slot});
        ++c.push_grad;
      }
    }
    if (config_.prefetch) {
      for (const KeySlot& v : plan.push_values) note_pushed(v.key);
      for (const KeySlot& g : plan.push_grads) note_pushed(g.key);
    }
  }
  // Marked once every worker has listed its part (a row's partials are on several).
  for (const StepPlan& plan : plans) {
    for (const KeySlot& v : plan.push_values) loc_.set_flushed(v.key, true);
    for (const KeySlot& g : plan.push_grads) loc_.set_flushed(g.key, true);
  }
  // Worker 0 writes the replicated rows trained since the last flush back to the PS (the
  // replicas agree). Nobody pulls them before the next flush, so prefetch is unaffected.
  if (!replica_trained_keys_.empty()) {
    plans[0].replica_flush = replica_trained_keys_;
    c.hot_flush = replica_trained_keys_.size();
    for (Key k : replica_trained_keys_) replica_trained_[k] = 0;
    replica_trained_keys_.clear();
  }
  return c;
}

std::vector<KeySlot> Scheduler::latest_rows(WorkerId w) const {
  std::vector<KeySlot> rows;
  const WorkerCache& lru = *lru_[w];
  for (std::uint32_t slot = 0; slot < lru.capacity(); ++slot) {
    if (lru.occupied(slot) && loc_.owner(lru.key_at(slot)) == w) rows.push_back({lru.key_at(slot), slot});
  }
  return rows;
}

}  // namespace ember::scheduler
