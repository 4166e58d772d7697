// The rows of one global batch as the phases of an iteration see them: each distinct row
// once (d), where each sample's rows are, each row's state before the iteration, who
// trains it, each worker's distinct rows and the slots they take. Working memory of the
// Scheduler, reused from batch to batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "ember/cache/location_map.h"
#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/step_plan.h"
#include "ember/scheduler/worker_cache.h"
#include "row_marks.h"

namespace ember::scheduler {

struct BatchRows {
  // Filled by index_batch.
  U64Map<std::uint32_t> index;      // key -> d (distinct rows of the batch)
  std::vector<Key> keys;            // d -> key
  std::vector<std::uint32_t> dpos;  // key position in the batch -> d
  std::uint32_t tables = 0;
  // Multi-hot batches: sample i's distinct rows are srows [sstart[i], sstart[i + 1]) (an
  // id repeated in a sample's bags is one row). Empty when one-hot: a sample's T keys are
  // distinct rows already (each table has its own key range).
  std::vector<std::uint32_t> sstart, srows;
  std::vector<std::uint16_t> owner_d;      // d -> latest holder before the iteration
  std::vector<std::uint8_t> partial_d;     // d -> had partial holders before the iteration
  std::vector<std::uint8_t> replicated_d;  // d -> replicated row
  std::vector<std::uint8_t> cold_d;        // d -> no earlier iteration used the row
  std::vector<std::uint8_t> uncached_d;    // d -> of an uncached table (staged, not cached)
  // Filled by index_trainers, once the allocation is known. Who trains each row (U(k))
  // as lists, not masks, so that no worker count caps them: the entries of row d are
  // [tstart[d], tstart[d + 1]), its trainers in increasing order (replicated rows have
  // none: they are all-reduced).
  std::vector<std::uint32_t> tstart;
  std::vector<std::uint16_t> tw;                 // entry -> trainer
  std::vector<std::uint32_t> tslot;              // entry -> the row's slot in the trainer's cache (pull phase)
  std::vector<std::uint32_t> replicated_rows;    // distinct replicated rows of the batch (d)
  std::vector<std::uint32_t> stamp;              // d -> last worker + 1 that listed it; then the next free entry
  std::vector<std::vector<std::uint32_t>> kw;    // worker -> its distinct d, first-appearance order
  std::vector<std::vector<std::uint32_t>> kpos;  // worker -> the entry of each of its rows (as kw)
  // Filled by the sync phase under peer sync (else empty): d -> the worker handing the
  // row to the trainers on its host, or kNoOwner.
  std::vector<std::uint16_t> peer_d;
  std::vector<std::vector<RowEviction>> evicted;  // worker -> its evictions (pull phase, modelled workers)
  std::vector<std::uint16_t> kept;                // train_staged's working memory: the trainers that cached a row
  // On-demand sync's cache updates, collected row by row and done worker by worker
  // (sync_on_demand.cc): per worker, in row order, the copies the sync phase drops (and
  // whether each pushes its gradient), the dirty rows whose values it pushes, and the
  // stale copies training drops. With `defer_cache`, sync_rows, push_value and
  // drop_stale_latest list them here instead of updating the caches.
  struct CacheWork {
    std::vector<Key> erase;
    std::vector<std::uint8_t> pushes;
    std::vector<Key> values;
    std::vector<Key> stale;
  };
  std::vector<CacheWork> work;
  bool defer_cache = false;
  std::vector<TrafficCounts> per_worker;  // the phases' counts, per worker
  std::vector<std::uint32_t> row_of_d;    // index_ids' working memory: d -> the plan's row

  std::uint32_t size() const { return static_cast<std::uint32_t>(keys.size()); }
  // Sample i's distinct rows (d), in first-appearance order.
  std::span<const std::uint32_t> sample_rows(std::uint32_t i) const {
    if (sstart.empty()) return {dpos.data() + static_cast<std::size_t>(i) * tables, tables};
    return {srows.data() + sstart[i], sstart[i + 1] - sstart[i]};
  }
  // Row d's trainers, in increasing order.
  std::span<const std::uint16_t> trainers(std::uint32_t d) const { return {tw.data() + tstart[d], tw.data() + tstart[d + 1]}; }
  std::uint32_t count(std::uint32_t d) const { return tstart[d + 1] - tstart[d]; }
  // Its first trainer (count(d) > 0).
  std::uint32_t first(std::uint32_t d) const { return tw[tstart[d]]; }
  // Whether w trains row d.
  bool trains(std::uint32_t d, std::uint32_t w) const {
    if (count(d) == 1) return tw[tstart[d]] == w;
    const auto t = trainers(d);
    return std::binary_search(t.begin(), t.end(), static_cast<std::uint16_t>(w));
  }
  // Whether anyone but w trains row d.
  bool others(std::uint32_t d, std::uint32_t w) const { return count(d) > (trains(d, w) ? 1u : 0u); }
  // The pull phase's end for worker w: the slot of each of its rows (`row_slots`, in
  // kw[w]'s order) recorded among the rows' trainers.
  template <typename Rows>
  void set_slots(std::uint32_t w, const Rows& row_slots) {
    for (std::size_t j = 0; j < kw[w].size(); ++j) tslot[kpos[w][j]] = row_slots[j].slot;
  }
  // f(w, slot) for each trainer of row d, in increasing order.
  template <typename F>
  void for_each_trainer(std::uint32_t d, F&& f) const {
    for (std::uint32_t e = tstart[d]; e < tstart[d + 1]; ++e) f(static_cast<std::uint32_t>(tw[e]), tslot[e]);
  }
};

// Distinct rows of the batch, where each sample's rows are, and each row's latest holder
// before the iteration (one location read per distinct row); cold: not in `seen`.
// ConfigError for a batch of another number of tables or a key outside the tables.
void index_batch(const SchedulerConfig& c, std::uint32_t tables, const GlobalBatch& batch, const cache::LocationMap& loc,
                 const KeyBits& seen, BatchRows& rows);

// With the allocation made (plans[w].samples): who trains each row, the batch's
// replicated rows, each worker's distinct rows in micro-batch order; clears the slots and
// counts. ConfigError when a worker's cache (or a cache group) cannot hold its rows
// (`shape`: a worker's cache; every worker's is alike).
void index_trainers(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const std::vector<StepPlan>& plans,
                    const WorkerCache& shape, BatchRows& rows);

// Worker w's StepPlan::id_rows, once its plan's rows are final: each id of its samples
// as its row in plan.rows (kw[w]'s order) or in plan.replicated (replicated_rows').
void index_ids(const GlobalBatch& batch, std::uint32_t w, BatchRows& rows, StepPlan& plan);

}  // namespace ember::scheduler
