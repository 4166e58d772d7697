// Sync modes: the three phases of an iteration (docs/design.md "Row states and
// transmission accounting": 1 sync, 2 pull, 3 train), written once per mode of
// synchronization, each mode in a file of its own:
//
//   sync_full_set.cc    every trained row's gradient pushed at the end of its iteration
//   sync_on_demand.cc   only what another worker needs (Herald's Algorithm 2)
//   sync_peer.cc        on demand, rows handed within a host (--peer-sync, Appendix B)
//   sync_bounded.cc     HET's bounded staleness: a copy serves while at most S versions behind
//
// A mode is a copyable value (its own state inside) with
//
//   void sync(Iteration&)                   step 1, the pushes before the pulls
//   void pull(Iteration&, std::uint32_t w)  step 2 for worker w (workers run in parallel)
//   void train(Iteration&)                  step 3, the rows' states after training
//   std::size_t memory_bytes() const        its state's bytes
//
// The Scheduler runs the phases in that order (Scheduler::plan_iteration) on the mode its
// policy names (Policy::sync, make_sync_mode). A new mode is a class here, its file, and
// an entry of SyncModes and make_sync_mode.
#pragma once

#include <concepts>
#include <cstdint>
#include <variant>
#include <vector>

#include "admission.h"
#include "batch_rows.h"
#include "ember/cache/location_map.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/step_plan.h"
#include "ember/scheduler/worker_cache.h"
#include "row_marks.h"
#include "window.h"

namespace ember::scheduler {

// What the phases of one iteration read and change, each part by name.
struct Iteration {
  const SchedulerConfig& config;
  BatchRows& rows;                             // the batch: its distinct rows, trainers, slots; counts per worker
  WorkerCaches& lru;                           // the modelled workers' caches, as the scheduler models them
  const std::vector<std::uint32_t>& modelled;  // those workers, in increasing order
  cache::LocationMap& loc;                     // every row's state (latest holder, partial holders)
  PushMarks& pushed;                           // prefetch: rows pushed since the last pulls (config.prefetch)
  std::vector<StepPlan>& plans;                // one per worker, filled by the phases (the modelled workers')
  const Window* window;                        // lookahead: each row's next use (null without)
  bool mark_prefetch;                          // mark the pulls one iteration early (an iteration was planned before)
  const FrequencySketch* admission = nullptr;  // --cache-admission: whether a missed row takes a full cache's slot (null: always)

  bool models(std::uint32_t w) const { return config.models(w); }
  // Worker w's cache (a modelled worker's).
  WorkerCache& cache(std::uint32_t w) const { return *lru[w]; }
};

template <typename M>
concept SyncMode = std::copyable<M> && requires(M m, const M cm, Iteration& it, std::uint32_t w) {
  m.sync(it);
  m.pull(it, w);
  m.train(it);
  { cm.memory_bytes() } -> std::convertible_to<std::size_t>;
};

// Full-set sync (vanilla, laia, fae): no sync phase; at the end of the iteration every
// trainer pushes every row it trained; a sole trainer keeps a latest-clean copy.
class FullSetSync {
 public:
  void sync(Iteration&) {}
  void pull(Iteration& it, std::uint32_t w);
  void train(Iteration& it);
  std::size_t memory_bytes() const { return 0; }
};

// On-demand sync (plan, herald, brute): partial gradients and dirty values are pushed
// only when another worker needs the row; a sole trainer keeps a latest-dirty copy,
// several trainers partial gradients.
class OnDemandSync {
 public:
  void sync(Iteration& it);
  void pull(Iteration& it, std::uint32_t w);
  void train(Iteration& it);
  std::size_t memory_bytes() const { return 0; }

 protected:
  // Step 1 over the batch's rows (sync_on_demand.h): the partial holders of every row
  // push; then owner_step(d, o) for each row d whose latest holder o is not its only
  // trainer.
  template <typename OwnerStep>
  void sync_rows(Iteration& it, OwnerStep&& owner_step);
  // Step 1 of row d, latest at o (dirty) and trained by another: o pushes its value
  // (unless flushed) and holds it clean.
  void push_value(Iteration& it, std::uint32_t d, std::uint32_t o);
  // Step 3 of row d trained by several workers: each keeps a partial gradient.
  void keep_partials(Iteration& it, std::uint32_t d);

 private:
  std::vector<std::uint16_t> listed_;  // keep_partials' working memory: a row's modelled trainers
};

// Peer sync (--peer-sync, on-demand sync within a host: Herald's Appendix B,
// docs/design.md): on-demand sync, except that a row's latest holder hands it to its
// trainers on its host instead of their pulling it, and a row trained only on one host
// is applied there by its first trainer (sync_peer.cc).
class PeerSync : public OnDemandSync {
 public:
  void sync(Iteration& it);
  void train(Iteration& it);

 private:
  // Step 1 of row d, latest at o and trained by others.
  void hand_over(Iteration& it, std::uint32_t d, std::uint32_t o);
};

// Bounded staleness (het:S): every gradient pushed at the end of its iteration; a cached
// copy serves while at most S versions behind the PS's row. No lookahead, prefetch or
// placement applies (check_lookahead and the Scheduler refuse them).
class BoundedSync {
 public:
  BoundedSync(const SchedulerConfig& c, std::uint32_t capacity);
  void sync(Iteration&) {}
  void pull(Iteration& it, std::uint32_t w);
  void train(Iteration& it);
  std::size_t memory_bytes() const;

 private:
  std::uint32_t staleness_;
  std::vector<std::uint32_t> ps_version_;                 // key -> the PS's version of the row
  std::vector<std::uint64_t> holders_;                    // key -> the modelled workers caching it (bit w; W <= 64)
  std::vector<std::vector<std::uint32_t>> copy_version_;  // worker, slot -> the cached copy's version
};

using SyncModes = std::variant<FullSetSync, OnDemandSync, PeerSync, BoundedSync>;

// The mode of c.policy.sync(); capacity: the rows of a worker's cache.
SyncModes make_sync_mode(const SchedulerConfig& c, std::uint32_t capacity);

// Peer sync (sync_peer.cc): whether row d's trainers (two or more) are all on one host,
// which then applies it (the first trainer, with the sum of their gradients); false
// without --peer-sync.
bool host_applied(const Iteration& it, std::uint32_t d);

// Worker w's part in row d (host_applied's: the first trainer applies, the others hand).
inline HostApply host_apply_of(const Iteration& it, std::uint32_t d, std::uint32_t w) {
  if (!host_applied(it, d)) return HostApply::kNone;
  return it.rows.first(d) == w ? HostApply::kApplies : HostApply::kHands;
}

// Shared by the modes that keep a latest copy (full-set, on demand).

// Step 2 for worker w: hits refreshed first, then misses pulled in order of first
// appearance, each evicting (dirty rows leave as values, partial ones as gradients).
void pull_latest(Iteration& it, std::uint32_t w);

// Step 3 of row d of an uncached table: every trainer pushes its gradient and drops the
// staged copy.
inline void train_uncached(Iteration& it, std::uint32_t d) {
  BatchRows& s = it.rows;
  const Key k = s.keys[d];
  s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
    if (!it.models(w)) return;
    it.plans[w].end_pushes.push_back({k, slot});
    it.plans[w].drops.push_back({k, slot});
    ++s.per_worker[w].push_grad;
  });
  if (it.config.prefetch) it.pushed.note(k);
}

// Step 3: the holder of row d's latest copy before the iteration, if it did not train the
// row, now has a stale copy and drops it (unless it evicted it meanwhile: erase then
// finds nothing).
inline void drop_stale_latest(Iteration& it, std::uint32_t d) {
  const std::uint16_t o = it.rows.owner_d[d];
  if (o != cache::LocationMap::kNoOwner && it.models(o) && !it.rows.trains(d, o)) {
    const Key k = it.rows.keys[d];
    if (it.rows.defer_cache) {
      it.rows.work[o].stale.push_back(k);
      return;
    }
    const std::uint32_t slot = it.cache(o).erase(k);
    if (slot != cache::LruIndex::kNone) it.plans[o].drops.push_back({k, slot});
  }
}

// Step 3 of row d when some trainer staged it, not admitted to its cache (admission;
// the staged entries' slots are past the cache's): a staged copy's gradient is pushed at
// the end of the iteration and the copy dropped. With `on_demand`, the trainers that
// cached it keep partial gradients (of all count(d) trainers: the PS completes the row
// when theirs come); else they push too and drop theirs. Nobody holds it latest after.
// False (nothing done) when no trainer staged it.
inline bool train_staged(Iteration& it, std::uint32_t d, bool on_demand) {
  BatchRows& s = it.rows;
  const std::uint32_t cache_rows = it.config.cache_rows;
  bool staged = false;
  s.for_each_trainer(d, [&](std::uint32_t, std::uint32_t slot) { staged |= slot >= cache_rows; });
  if (!staged) return false;
  const Key k = s.keys[d];
  std::vector<std::uint16_t>& kept = s.kept;
  kept.clear();
  s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
    const bool in_cache = slot < cache_rows;
    if (in_cache && on_demand) {
      kept.push_back(static_cast<std::uint16_t>(w));
      return;
    }
    it.plans[w].end_pushes.push_back({k, slot});
    ++s.per_worker[w].push_grad;
    if (in_cache) it.cache(w).erase(k);
    it.plans[w].drops.push_back({k, slot});
  });
  if (it.config.prefetch) it.pushed.note(k);
  it.loc.clear_owner(k);
  if (!kept.empty()) it.loc.set_partials(k, kept, s.count(d));
  return true;
}

// Step 3's walk over the batch's rows for the latest-copy modes: index entries 8 rows
// ahead (and, with `partials`, the partial masks of rows several workers train),
// replicated rows skipped, uncached ones trained (train_uncached), a stale latest copy
// dropped; then f(d) for every cached row d.
template <typename F>
void train_cached_rows(Iteration& it, bool partials, F&& f) {
  const BatchRows& s = it.rows;
  const std::uint32_t D = s.size();
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + 8 < D) {
      if (partials && s.count(d + 8) > 1) it.loc.prefetch_partial(s.keys[d + 8]);
      // The holder of a copy the next rows' trainers make stale: its index entry.
      const std::uint16_t on = s.owner_d[d + 8];
      if (on != cache::LocationMap::kNoOwner && it.models(on) && !s.defer_cache && !s.trains(d + 8, on))
        it.cache(on).prefetch(s.keys[d + 8]);
    }
    if (s.replicated_d[d]) continue;  // replicated: all-reduced among the workers
    if (s.uncached_d[d]) {
      train_uncached(it, d);
      continue;
    }
    drop_stale_latest(it, d);
    if (it.admission != nullptr && train_staged(it, d, partials)) continue;
    f(d);
  }
}

}  // namespace ember::scheduler
