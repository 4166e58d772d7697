#include "ember/scheduler/scheduler_cli.h"

#include <CLI/CLI.hpp>

namespace ember::scheduler {

void add_scheduler_options(CLI::App& app, SchedulerOptions& o, FlagsFor who) {
  const bool sim = who != FlagsFor::kTraining;
  app.add_option("--workers", o.workers, sim ? "workers" : "workers in the job")->capture_default_str();
  app.add_option("--batch-per-worker", o.batch_per_worker, "samples per worker per iteration")->capture_default_str();
  app.add_option("--cache-ratio", o.cache_ratio,
                 sim ? "cache rows per worker as a share of all rows" : "embedding cache rows per worker, as a fraction of all rows")
      ->capture_default_str();
  if (who == FlagsFor::kShape) return;
  app.add_option("--seed", o.seed, sim ? "scheduler (and synthetic data) seed" : "data order, allocation ties, dense initialization")
      ->capture_default_str();
  app.add_flag("--shuffle", o.shuffle,
               sim ? "global batches from a seeded permutation instead of dataset order"
                   : "global batches from a seeded permutation of the training split");
  app.add_option(sim ? "--threads" : "--sched-threads", o.threads, "scheduler threads")->capture_default_str();
  if (sim) {
    app.add_option("--budget-ms", o.budget_ms, "adaptive LAIA: scoring budget per batch (0 = score every table)")->capture_default_str();
    app.add_option("--partitions", o.partitions, "partitioned LAIA allocation (Herald's parallel variant)")->capture_default_str();
  }
  app.add_flag("--refine-allocation", o.refine_allocation,
               "laia, herald: refine LAIA's allocation by swaps that move fewer rows in the batch");
  app.add_flag("--host-allocation", o.host_allocation,
               sim ? "laia, herald: allocate samples to hosts first (--hosts), then to the workers of each host"
                   : "laia, herald: allocate samples to hosts first, then to the workers of each host (two-level LAIA)");
  app.add_flag("--peer-sync", o.peer_sync,
               "plan, herald: a row latest on a worker goes to the other trainers of its host from there, not through the PS; "
               "a row trained within one host only is applied there");
  if (!sim) {
    app.add_flag("--scheduler-per-host", o.scheduler_per_host,
                 "each process models only its host's caches (not every worker's), the hosts' evictions exchanged after "
                 "each iteration: the same plans, with state and time per process that do not grow with the job");
  }
  app.add_option("--lookahead", o.lookahead,
                 sim ? "batches the scheduler sees beyond the one it schedules (0 = none)"
                     : "batches the scheduler sees beyond the one it plans (0 = none)")
      ->capture_default_str();
  app.add_option("--eviction", o.eviction,
                 sim ? "auto, lru, lookahead or belady (auto: lookahead when --lookahead > 0)"
                     : "auto, lru or lookahead (auto: lookahead when --lookahead > 0)")
      ->capture_default_str();
  app.add_flag("--prefetch", o.prefetch,
               sim ? "mark the pulls a worker may make during the previous iteration (counted as prefetched)"
                   : "pull the next iteration's rows whose PS copy is final while this one computes");
  app.add_option("--placement", o.placement,
                 "plan file (ember-plan --plan-out): per table cache, replicated or uncached, and the cache rows (replace --cache-ratio)");
}

}  // namespace ember::scheduler
