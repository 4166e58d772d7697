// On-demand sync (plan, herald, brute; Herald's Algorithm 2): before the pulls, the
// partial holders of a row someone trains push their gradients and a dirty owner pushes
// its value if another worker trains the row; the pull of the latest-copy modes; after
// training, a sole trainer holds the latest (dirty) copy and several trainers a partial
// gradient each, pushed only when the row is next needed (or evicted, or flushed).
#include "sync_on_demand.h"

#include <tbb/parallel_for.h>

namespace ember::scheduler {
namespace {

// The cache updates listed in rows.work, worker by worker (in parallel with threads > 1:
// each worker's cache is its own): each cache sees the same operations in the same
// order whatever the thread count, so the plans are the same.
void run_cache_work(Iteration& it) {
  auto one = [&](std::uint32_t w) {
    BatchRows::CacheWork& work = it.rows.work[w];
    WorkerCache& lru = it.cache(w);
    StepPlan& plan = it.plans[w];
    // Index entries 16 ahead: these rows miss the cache otherwise.
    constexpr std::size_t kAhead = 16;
    for (std::size_t j = 0; j < work.erase.size(); ++j) {
      if (j + kAhead < work.erase.size()) lru.prefetch(work.erase[j + kAhead]);
      const std::uint32_t slot = lru.erase(work.erase[j]);
      if (work.pushes[j]) plan.push_grads.push_back({work.erase[j], slot});
    }
    for (std::size_t j = 0; j < work.values.size(); ++j) {
      if (j + kAhead < work.values.size()) lru.prefetch(work.values[j + kAhead]);
      plan.push_values.push_back({work.values[j], lru.find(work.values[j])});
    }
    for (std::size_t j = 0; j < work.stale.size(); ++j) {
      if (j + kAhead < work.stale.size()) lru.prefetch(work.stale[j + kAhead]);
      const std::uint32_t slot = lru.erase(work.stale[j]);
      if (slot != cache::LruIndex::kNone) plan.drops.push_back({work.stale[j], slot});
    }
    work.erase.clear();
    work.pushes.clear();
    work.values.clear();
    work.stale.clear();
  };
  const std::vector<std::uint32_t>& workers = it.modelled;
  const auto n = static_cast<std::uint32_t>(workers.size());
  if (it.config.threads > 1 && n > 1) {
    tbb::parallel_for(0u, n, [&](std::uint32_t j) { one(workers[j]); });
  } else {
    for (std::uint32_t w : workers) one(w);
  }
}

}  // namespace

void OnDemandSync::sync(Iteration& it) {
  // One pass over the batch's rows decides (reading and updating the location map only);
  // the caches' updates follow worker by worker.
  it.rows.defer_cache = true;
  sync_rows(it, [&](std::uint32_t d, std::uint32_t o) {
    if (it.loc.dirty(it.rows.keys[d])) push_value(it, d, o);
  });
  it.rows.defer_cache = false;
  run_cache_work(it);
}

void OnDemandSync::push_value(Iteration& it, std::uint32_t d, std::uint32_t o) {
  const Key k = it.rows.keys[d];
  if (!it.loc.flushed(k)) {
    if (it.models(o)) {
      if (it.rows.defer_cache) {
        it.rows.work[o].values.push_back(k);
      } else {
        it.plans[o].push_values.push_back({k, it.cache(o).find(k)});
      }
      ++it.rows.per_worker[o].push_value;
    }
    if (it.config.prefetch) it.pushed.note(k);
  }
  it.loc.set_clean(k);
}

void OnDemandSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void OnDemandSync::keep_partials(Iteration& it, std::uint32_t d) {
  const BatchRows& s = it.rows;
  const Key k = s.keys[d];
  it.loc.clear_owner(k);
  if (it.config.model_host < 0) {
    it.loc.set_partials(k, s.trainers(d), s.count(d));
    return;
  }
  listed_.clear();
  for (std::uint16_t w : s.trainers(d)) {
    if (it.models(w)) listed_.push_back(w);
  }
  it.loc.set_partials(k, listed_, s.count(d));
}

void OnDemandSync::train(Iteration& it) {
  BatchRows& s = it.rows;
  // The stale copies training drops are dropped worker by worker after the walk.
  s.defer_cache = true;
  train_cached_rows(it, true, [&](std::uint32_t d) {
    if (s.count(d) == 1) {
      it.loc.set_owner(s.keys[d], s.first(d), true);
    } else {
      keep_partials(it, d);
    }
  });
  s.defer_cache = false;
  run_cache_work(it);
}

}  // namespace ember::scheduler
