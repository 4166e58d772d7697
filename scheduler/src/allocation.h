// Allocation: which worker trains each sample of a global batch (docs/scheduler.md step
// 1): random and balanced, LAIA (Herald's Algorithm 1, partitioned or not), LAIA refined
// by swaps, and brute force. worker_of[i] is sample i's worker; every worker gets
// batch_per_worker samples. The same input gives the same allocation in every process
// and with any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "batch_rows.h"
#include "ember/cache/location_map.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/scheduler_config.h"

namespace ember::scheduler {

// LAIA's working memory: each sample's candidates, the workers (or hosts) holding any of
// its scored rows as latest, with how many of them, in increasing order. A sample is
// scored against these alone, not against every worker.
struct Candidate {
  std::uint16_t id;    // worker or host
  std::uint16_t rows;  // the sample's rows it holds as latest
};
struct LaiaScratch {
  std::vector<Candidate> candidates;  // from each sample's first key position
  std::vector<std::uint16_t> count;   // sample -> its candidates
};

struct LaiaStats {
  double scoring_ms = 0;          // scoring alone
  std::uint32_t laia_tables = 0;  // tables scored
};

// A balanced random partition from (seed, iteration).
void allocate_random(const SchedulerConfig& c, std::uint64_t iteration, std::uint32_t n, std::vector<std::uint32_t>& worker_of);

// LAIA: each sample, in batch order, to the worker holding the most of its rows (of
// `tables`) as latest (rows.owner_d), among those with room; seeded random ties.
// c.partitions slices of the batch are allocated independently (in parallel with
// c.threads > 1). Work per sample: its rows' owners, not the W workers.
LaiaStats allocate_laia(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                        const std::vector<std::uint32_t>& tables, LaiaScratch& scratch, std::vector<std::uint32_t>& worker_of);

// Two-level LAIA (c.host_allocation, per-host aggregation's allocation): each sample, in
// batch order, to the host whose workers hold the most of its rows as latest, among
// hosts with room (their workers' micro-batches); then, within each host, to the worker
// holding the most of them, among its workers with room. Seeded random ties; per
// partition, sequentially.
LaiaStats allocate_laia_by_host(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                                const std::vector<std::uint32_t>& tables, LaiaScratch& scratch, std::vector<std::uint32_t>& worker_of);

// Swaps samples between workers (within a partition; by host: within a host) while a
// swap lowers the rows the batch moves (c.refine_allocation; docs/scheduler.md "Refined allocation").
void refine_allocation(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows, const cache::LocationMap& loc,
                       std::vector<std::uint32_t>& worker_of);

// Brute force (one sample per worker): every assignment of the W samples to the W
// workers; the cheapest by `cost` wins, the first in lexicographic order on ties
// (Herald's Appendix C).
void allocate_brute(std::uint32_t workers, const std::function<std::uint64_t(const std::vector<std::uint32_t>&)>& cost,
                    std::vector<std::uint32_t>& worker_of);

}  // namespace ember::scheduler
