// Scheduler: Herald-style embedding scheduling, run identically in every worker process
// (same config, same batches -> byte-identical plans) and in the simulator.
//
// For each global batch it (1) allocates samples to workers (random, or LAIA: favour the
// worker holding the most of a sample's rows as latest, micro-batches of equal size),
// (2) plans synchronization (full-set, or on demand: Algorithm 2, only rows another
// worker needs), (3) advances its model of every worker's LRU cache exactly as the
// workers will, and (4) returns one StepPlan per worker plus the traffic it implies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/cache/location_map.h"
#include "ember/cache/lru_index.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/policy.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/step_plan.h"
#include "ember/scheduler/worker_cache.h"

namespace ember::scheduler {

class Window;

struct IterationStats {
  TrafficCounts traffic;
  double sched_ms = 0;            // allocation + plan + cache-state update
  double scoring_ms = 0;          // LAIA scoring alone
  std::uint32_t laia_tables = 0;  // tables scored (adaptive LAIA's k)
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);
  ~Scheduler();
  Scheduler(const Scheduler&);
  Scheduler& operator=(const Scheduler&) = delete;

  // Lookahead (config.lookahead > 0): every batch is shown here before it is scheduled,
  // once and in order, and each schedule() call finds the `lookahead` batches after its
  // own shown (fewer only where the job ends). Throws Error when more are shown.
  void look_ahead(const GlobalBatch& batch);
  // Batches shown and not yet scheduled (the one scheduled next included).
  std::size_t window_size() const;
  // The iteration of the next batch to show (with no lookahead: the next scheduled).
  std::uint64_t shown_until() const;
  // Before scheduling iteration t of a job of `end` iterations: shows the batches the
  // window lacks, up to t + lookahead (not past `end`), each filled by next(batch).
  template <typename Next>
  void look_ahead_through(std::uint64_t t, std::uint64_t end, Next&& next) {
    for (std::uint64_t until = std::min<std::uint64_t>(end, t + config_.lookahead + 1); config_.lookahead > 0 && shown_until() < until;) {
      next(lookahead_batch_);
      look_ahead(lookahead_batch_);
    }
  }

  // Schedules the next global batch: fills plans[w] for every worker and returns the
  // iteration's traffic. Throws ConfigError when a micro-batch's distinct rows exceed
  // the cache; with lookahead, Error when `batch` is not the first batch shown.
  IterationStats schedule(const GlobalBatch& batch, std::vector<StepPlan>& plans);

  // Same, with a given allocation (worker of each sample): brute force and tests.
  IterationStats schedule_with(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of, std::vector<StepPlan>& plans);

  // Brings the PS up to date without a batch (before evaluation, a checkpoint, or the
  // end of training): every dirty row is pushed as a value and every partial gradient is
  // pushed. The copies and their states stay as they are, marked flushed
  // (LocationMap::flushed): later pushes of them are skipped, so a flush changes no
  // allocation, eviction or hit, only which pushes happen when. Fills push_values /
  // push_grads of each worker's plan (other lists empty), in slot order, and worker 0's
  // replica_flush; returns the traffic (push_grad, push_value, hot_flush).
  // Not for bounded-staleness sync (het): its copies carry no un-pushed updates.
  TrafficCounts flush(std::vector<StepPlan>& plans);

  // The rows worker w holds as latest (clean or dirty, flushed or not), by slot: what a
  // resumed worker pulls from the PS, after a flush, to hold what the scheduler models.
  std::vector<KeySlot> latest_rows(WorkerId w) const;

  const SchedulerConfig& config() const { return config_; }
  std::uint64_t iteration() const { return iteration_; }
  const WorkerCache& cache_of(WorkerId w) const { return *lru_[w]; }
  const cache::LocationMap& locations() const { return loc_; }
  // The DoI of each table as last profiled (adaptive LAIA), and the tables scored.
  const std::vector<double>& table_doi() const { return doi_; }
  const std::vector<std::uint32_t>& scored_tables() const { return scored_tables_; }
  // Bytes of scheduler state (caches' indexes, location map, profiler).
  std::size_t memory_bytes() const;

 private:
  struct Scratch;
  // Distinct rows of the batch, where each sample's rows are, and each row's latest
  // holder before the iteration (one location read per distinct row).
  void index_batch(const GlobalBatch& batch);
  IterationStats apply(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of, std::vector<StepPlan>& plans);
  void allocate(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st);
  void allocate_laia(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st);
  // Swaps samples between workers (within a partition) while a swap lowers the rows the
  // batch moves (config.refine_allocation).
  void refine_allocation(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of);
  void allocate_random(std::uint32_t n, std::vector<std::uint32_t>& worker_of);
  void allocate_brute(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of);
  void profile(const GlobalBatch& batch, double scoring_ms);
  // ConfigError when a cache group of worker w cannot hold its rows of the micro-batch
  // (kw: the worker's distinct rows).
  void check_groups(std::uint32_t w, const std::vector<std::uint32_t>& kw) const;

  SchedulerConfig config_;
  std::uint32_t tables_ = 0;
  std::uint64_t iteration_ = 0;
  std::vector<std::uint8_t> group_of_key_;  // cache shares: each key's group in WorkerCache
  std::vector<std::unique_ptr<WorkerCache>> lru_;
  cache::LocationMap loc_;
  // Bounded-staleness sync (het): the PS's version of each row, and each cached copy's
  // version (per slot).
  std::vector<std::uint32_t> ps_version_;
  std::vector<std::vector<std::uint32_t>> copy_version_;
  // Adaptive LAIA profiler: accesses per key, per-table DoI, tables to score.
  std::vector<std::uint32_t> access_;
  std::vector<std::uint8_t> seen_;  // bit per key: used by an earlier iteration
  std::vector<double> doi_;
  std::vector<std::uint32_t> scored_tables_;
  double table_cost_ms_ = 0;  // EMA of scoring time per table per batch
  // Prefetch: bit per key, set for the rows pushed to the PS since the last iteration's
  // pulls (its evictions and end pushes, a flush's pushes, the next sync pushes); those
  // keys listed, to clear the bits.
  void note_pushed(Key k) {
    std::uint8_t& b = pushed_[k >> 3];
    const auto m = static_cast<std::uint8_t>(1u << (k & 7));
    if ((b & m) == 0) pushed_keys_.push_back(k);
    b |= m;
  }
  bool was_pushed(Key k) const { return (pushed_[k >> 3] >> (k & 7) & 1) != 0; }
  std::vector<std::uint8_t> pushed_;
  std::vector<Key> pushed_keys_;
  // Replicated rows trained since the last flush (byte per key), and their keys.
  std::vector<std::uint8_t> replica_trained_;
  std::vector<Key> replica_trained_keys_;
  bool planned_ = false;            // an iteration was planned before (the first has nothing to prefetch)
  std::unique_ptr<Window> window_;  // lookahead only
  GlobalBatch lookahead_batch_;     // look_ahead_through's, reused
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace ember::scheduler
