// Scheduler: Herald-style embedding scheduling, run identically in every worker process
// (same config, same batches -> byte-identical plans) and in the simulator.
//
// For each global batch it (1) allocates samples to workers (random, or LAIA: favour the
// worker holding the most of a sample's rows as latest, micro-batches of equal size),
// (2) plans synchronization (full-set, on demand: Algorithm 2, only rows another worker
// needs, or bounded staleness), (3) advances its model of every worker's LRU cache
// exactly as the workers will, and (4) returns one StepPlan per worker plus the traffic
// it implies. The parts live in scheduler/src/ (docs/scheduler.md "Code").
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
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

struct IterationStats {
  TrafficCounts traffic;
  double sched_ms = 0;            // allocation + plan + cache-state update
  double scoring_ms = 0;          // LAIA scoring alone
  std::uint32_t laia_tables = 0;  // tables scored (adaptive LAIA's k)
};

class Scheduler {
 public:
  // The most workers a job may have.
  static constexpr std::uint32_t kMaxWorkers = 4096;

  explicit Scheduler(SchedulerConfig config);
  ~Scheduler();
  // A complete, independent copy (brute force tries allocations on copies).
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

  // A scheduler of one host (config.model_host): the evictions its workers made in the
  // iteration just scheduled, in worker order (every worker's with config.list_evictions). Every other host's scheduler must get
  // them (apply_evictions) before it looks ahead or schedules the next batch.
  const std::vector<RowEviction>& evictions() const;
  // The other hosts' evictions of the iteration just scheduled (their evictions(), in
  // any order; this host's own are skipped): the rows' states move on as theirs did.
  // Error when none is awaited.
  void apply_evictions(const std::vector<RowEviction>& evictions);

  // Brings the PS up to date without a batch (before evaluation, a checkpoint, or the
  // end of training): every dirty row is pushed as a value and every partial gradient is
  // pushed. The copies and their states stay as they are, marked flushed
  // (LocationMap::flushed): later pushes of them are skipped, so a flush changes no
  // allocation, eviction or hit, only which pushes happen when. Fills push_values /
  // push_grads of each worker's plan (other lists empty), in slot order, and worker 0's
  // replicated_flush; returns the traffic (push_grad, push_value, hot_flush).
  // Not for bounded-staleness sync (het): its copies carry no un-pushed updates.
  // `evaluation`: only SchedulerConfig::evaluated_rows (an evaluation reads no other;
  // the rest stay as they are until a later flush or push), so that an evaluation costs
  // herald what it costs vanilla. With SchedulerConfig::hand_evaluated_rows, a dirty
  // owner's evaluated row is not pushed either: it goes to worker 0 (eval_hands, counted
  // as eval_handed), which reads the others from the PS, and stays dirty and unflushed;
  // only partial gradients reach the PS (worker 0 could not sum them as the PS does).
  // Worker 0 holds the handed rows at once, so only while they are at most twice a
  // cache's rows (cache_rows); more are pushed as without the setting.
  TrafficCounts flush(std::vector<StepPlan>& plans, bool evaluation = false);

  // Dynamic tables (KeyDirectory::end_iteration): rows dropped at the end of the
  // iteration just scheduled (or flushed) leave every modelled cache and their states are
  // reset, as if never used: their keys are free for new rows. Copies are discarded, not
  // pushed (the row is gone). Not with a lookahead window: Error.
  void drop_rows(std::span<const Key> keys);
  // The rows worker w holds as latest (clean or dirty, flushed or not), by slot: what a
  // resumed worker pulls from the PS, after a flush, to hold what the scheduler models.
  std::vector<KeySlot> latest_rows(WorkerId w) const;

  const SchedulerConfig& config() const { return config_; }
  std::uint64_t iteration() const;
  const WorkerCache& cache_of(WorkerId w) const;
  const cache::LocationMap& locations() const;
  // The DoI of each table as last profiled (adaptive LAIA), and the tables scored.
  const std::vector<double>& table_doi() const;
  const std::vector<std::uint32_t>& scored_tables() const;
  // Bytes of scheduler state (caches' indexes, location map, profiler).
  std::size_t memory_bytes() const;

 private:
  // State and Scratch are defined in scheduler/src/scheduler_state.h. State is a value
  // type copied by its default copy; it is held by pointer to keep this header small, so
  // the copy constructor copies it by hand (and gives the copy working memory of its own).
  struct State;
  struct Scratch;
  void allocate(const GlobalBatch& batch, std::vector<std::uint32_t>& worker_of, IterationStats& st);
  // Builds the iteration's plans for an allocation: the three phases of the policy's
  // sync mode (sync, pull, train), every cache and row state moved on.
  IterationStats plan_iteration(const GlobalBatch& batch, const std::vector<std::uint32_t>& worker_of, std::vector<StepPlan>& plans);
  // The end of an iteration: the batch's rows seen, the traffic summed, every worker's
  // replicated rows listed.
  IterationStats finish_iteration(std::vector<StepPlan>& plans);
  // Evaluated rows a worker holds newer than the PS and no flush has pushed.
  std::uint64_t held_evaluated_rows() const;
  // Error while the other hosts' evictions of the last iteration are awaited.
  void check_evictions_applied(const char* what) const;

  SchedulerConfig config_;
  std::unique_ptr<State> state_;
  std::unique_ptr<Scratch> scratch_;
  GlobalBatch lookahead_batch_;  // look_ahead_through's, reused
};

}  // namespace ember::scheduler
