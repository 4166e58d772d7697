// What the sync modes share: the mode of a policy, and the pull phase of the modes that
// keep a latest copy (full-set and on demand).
#include "sync_mode.h"

#include <algorithm>
#include <bit>
#include <string>

#include "ember/common/error.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kNoSlot = cache::LruIndex::kNone;

// Makes room for k in worker w's cache: the evicted row leaves as the contract says (a
// dirty row as a value, a partial one as a gradient, unless flushed; a clean one
// silently), recorded in `pull`, in the worker's evictions, and counted in c. A partial
// copy leaves the location map after the pull phase (Scheduler: run_phases), so that
// the workers' pulls change no row they share.
inline void evict_for(Iteration& it, WorkerCache& lru, std::uint32_t w, Key k, PullEntry& pull, TrafficCounts& c) {
  cache::LocationMap& loc = it.loc;
  Key e;
  lru.evict(k, e);
  pull.evicted = e;
  bool partial = false;
  if (loc.owner(e) == w) {
    pull.kind = loc.dirty(e) && !loc.flushed(e) ? EvictKind::kDirty : EvictKind::kClean;
    loc.clear_owner(e);
  } else if (loc.is_partial(e, w)) {
    pull.kind = loc.flushed(e) ? EvictKind::kClean : EvictKind::kPartial;  // flushed: the PS has it
    partial = true;
  } else {
    throw Error("scheduler invariant broken: worker " + std::to_string(w) + " caches row " + std::to_string(e) +
                " as neither latest nor partial");
  }
  const bool pushes = pull.kind == EvictKind::kDirty || pull.kind == EvictKind::kPartial;
  it.rows.evicted[w].push_back({e, w, partial, pushes});
  if (pushes) ++c.push_evict;
  c.evict_partial += pull.kind == EvictKind::kPartial;
}

// Eviction by next use: this iteration's rows, held while they came in, are released in
// the order plain LRU touches them (hits, then pulls): into the LRU order if no batch of
// the window needs them, else kept by their next use. The pulls are the rows without a
// hit, in the same order.
void release_held(const Iteration& it, WorkerCache& lru, const StepPlan& plan) {
  std::size_t next_pull = 0;
  for (const RowRef& row : plan.rows) {
    if (next_pull < plan.pulls.size() && plan.pulls[next_pull].key == row.key) {
      ++next_pull;
    } else {
      lru.release(row.slot, it.window->next_use(row.key));
    }
  }
  for (const PullEntry& p : plan.pulls) {
    if (p.slot < it.config.cache_rows) lru.release(p.slot, it.window->next_use(p.key));  // staged rows are not the LRU's
  }
}

// The hits of worker w: the rows it held as latest before the iteration, refreshed (or
// held, by next use) in order of first appearance; plan.rows gets every row, a miss
// with no slot.
void refresh_hits(Iteration& it, std::uint32_t w, bool by_next_use) {
  WorkerCache& lru = it.cache(w);
  StepPlan& plan = it.plans[w];
  const BatchRows& s = it.rows;
  TrafficCounts& c = it.rows.per_worker[w];
  const auto& kw = s.kw[w];
  plan.rows.resize(kw.size());
  // Index entries 16 rows ahead; for hits, their list nodes 8 ahead (found early and
  // kept in plan.rows until used).
  constexpr std::size_t kFar = 16, kNear = 8;
  const std::size_t nk = kw.size();
  for (std::size_t j = 0; j < std::min(nk, kNear); ++j) {
    if (s.owner_d[kw[j]] == w) plan.rows[j].slot = lru.find(s.keys[kw[j]]);
  }
  for (std::size_t j = 0; j < nk; ++j) {
    if (j + kFar < nk) lru.prefetch(s.keys[kw[j + kFar]]);
    if (j + kNear < nk && s.owner_d[kw[j + kNear]] == w) {
      std::uint32_t early = lru.find(s.keys[kw[j + kNear]]);
      plan.rows[j + kNear].slot = early;
      lru.prefetch_slot(early);
    }
    const std::uint32_t d = kw[j];
    const Key k = s.keys[d];
    std::uint32_t slot = kNoSlot;
    if (s.uncached_d[d]) {
      // Never cached: no hit, and the LRU never sees it.
    } else if (s.owner_d[d] == w) {
      // Latest at w before the iteration, and w needs it now: still there.
      slot = plan.rows[j].slot;
    }
    plan.rows[j] = {k, slot, s.count(d), s.uncached_d[d] != 0, host_apply_of(it, d, w)};
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
}

}  // namespace

SyncModes make_sync_mode(const SchedulerConfig& c, std::uint32_t capacity) {
  switch (c.policy.sync()) {
    case Sync::kFullSet:
      return FullSetSync{};
    case Sync::kOnDemand:
      if (c.peer_sync) return PeerSync{};
      return OnDemandSync{};
    case Sync::kBoundedStaleness:
      return BoundedSync(c, capacity);
  }
  throw Error("unknown sync mode");
}

void pull_latest(Iteration& it, std::uint32_t w) {
  const bool by_next_use = it.config.eviction != Eviction::kLru;
  refresh_hits(it, w, by_next_use);
  WorkerCache& lru = it.cache(w);
  StepPlan& plan = it.plans[w];
  const BatchRows& s = it.rows;
  TrafficCounts& c = it.rows.per_worker[w];
  const auto& kw = s.kw[w];
  std::uint32_t next_staging = it.config.cache_rows;  // uncached rows' slots, past the cache's
  const std::uint32_t staging_end = it.config.cache_rows + it.config.staging_rows();
  // The misses' own index entries 16 rows ahead, and the rows they will evict: their
  // keys 16 evictions ahead, their index and location entries 8 ahead (one group: with
  // cache shares the victims come from several LRUs).
  constexpr std::size_t kFar = 16, kNear = 8;
  const bool victims = lru.groups() == 1;
  for (std::size_t j = 0; j < kw.size(); ++j) {
    if (j + kFar < kw.size() && plan.rows[j + kFar].slot == kNoSlot) lru.prefetch(plan.rows[j + kFar].key);
    RowRef& row = plan.rows[j];
    if (row.slot != kNoSlot) continue;
    const Key k = row.key;
    if (victims && lru.full(k)) {
      lru.prefetch_victim_slot(kFar);
      const Key v = lru.prefetch_victim(kNear);
      if (v != cache::LruIndex::kNoKey) it.loc.prefetch(v);
    }
    PullEntry pull{k, kNoSlot, 0, EvictKind::kNone};
    // Admission: a row that would evict a more frequent one is staged instead, trained
    // for this iteration only (its trainers' other copies are train_staged's).
    if (!row.uncached && it.admission != nullptr && lru.full(k) && !it.admission->admits(k, lru.victim(k))) {
      row.uncached = true;
      ++c.not_admitted;
    }
    if (row.uncached) {
      // Every slot past the staging's would write outside each worker's cache.
      if (next_staging >= staging_end) {
        throw Error("worker " + std::to_string(w) + " stages more rows than its " + std::to_string(it.config.staging_rows()) +
                    " staging slots");
      }
      pull.slot = next_staging++;
    } else {
      if (lru.full(k)) evict_for(it, lru, w, k, pull, c);
      pull.slot = by_next_use ? lru.insert_held(k) : lru.insert(k);
    }
    row.slot = pull.slot;
    // An uncached row's gradient always goes to the PS, which applies the optimizer.
    // (A host-applied row's applier applies it: with its state.)
    pull.with_state = (!row.shared() || row.host == HostApply::kApplies) && !row.uncached;
    // Peer sync: from the holder of its latest copy, when that is on this worker's host.
    pull.peer =
        !s.peer_d.empty() && s.peer_d[kw[j]] != cache::LocationMap::kNoOwner && it.config.host_of[s.peer_d[kw[j]]] == it.config.host_of[w];
    plan.pulls.push_back(pull);
    if (pull.peer) {  // handed by a worker of this host, value and state
      ++c.peer_value;
      continue;
    }
    plan.pulls.back().prefetch = it.mark_prefetch && !it.pushed.pushed(k);
    ++c.pulls;
    c.prefetched += plan.pulls.back().prefetch;
    c.pull_state += pull.with_state;
    c.cold_pulls += s.cold_d[kw[j]];
  }
  if (by_next_use) release_held(it, lru, plan);
  it.rows.set_slots(w, plan.rows);
}

}  // namespace ember::scheduler
