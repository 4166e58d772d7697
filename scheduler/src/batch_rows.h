// The rows of one global batch as the phases of an iteration see them: each distinct row
// once (d), where each sample's rows are, each row's state before the iteration, who
// trains it, each worker's distinct rows and the slots they take. Working memory of the
// Scheduler, reused from batch to batch.
#pragma once

#include <cstdint>
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
  U64Map<std::uint32_t> index;             // key -> d (distinct rows of the batch)
  std::vector<Key> keys;                   // d -> key
  std::vector<std::uint32_t> dpos;         // (sample, table) -> d
  std::vector<std::uint8_t> owner_d;       // d -> latest holder before the iteration
  std::vector<std::uint8_t> partial_d;     // d -> had partial holders before the iteration
  std::vector<std::uint8_t> replicated_d;  // d -> replicated row
  std::vector<std::uint8_t> cold_d;        // d -> no earlier iteration used the row
  std::vector<std::uint8_t> uncached_d;    // d -> of an uncached table (staged, not cached)
  // Filled by index_trainers, once the allocation is known.
  std::vector<std::uint64_t> umask;            // d -> workers training it (U(k))
  std::vector<std::uint32_t> replicated_rows;  // distinct replicated rows of the batch (d)
  std::vector<std::uint32_t> stamp;            // d -> last worker + 1 that listed it
  std::vector<std::vector<std::uint32_t>> kw;  // worker -> its distinct d, first-appearance order
  // Filled by the pull phase.
  std::vector<std::uint32_t> dslot;  // d * W + w -> slot of the row in w's cache
  // Filled by the sync phase under peer sync (else empty): d -> the worker handing the
  // row to the trainers on its host, or kNoOwner.
  std::vector<std::uint8_t> peer_d;
  std::vector<TrafficCounts> per_worker;  // the phases' counts, per worker

  std::uint32_t size() const { return static_cast<std::uint32_t>(keys.size()); }
};

// Distinct rows of the batch, where each sample's rows are, and each row's latest holder
// before the iteration (one location read per distinct row); cold: not in `seen`.
// ConfigError for a batch of another number of tables or a key outside the tables.
void index_batch(const SchedulerConfig& c, std::uint32_t tables, const GlobalBatch& batch, const cache::LocationMap& loc,
                 const KeyBits& seen, BatchRows& rows);

// With the allocation made (plans[w].samples): who trains each row, the batch's
// replicated rows, each worker's distinct rows in micro-batch order; clears the slots and
// counts. ConfigError when a worker's cache (or a cache group) cannot hold its rows.
void index_trainers(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch,
                    const std::vector<std::uint32_t>& worker_of, const std::vector<StepPlan>& plans, const std::vector<WorkerCache>& lru,
                    BatchRows& rows);

}  // namespace ember::scheduler
