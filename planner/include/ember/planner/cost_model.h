// The planner's cost model: per table, the rows one iteration moves between the workers
// and the PS, predicted analytically from a dataset's per-row frequencies and the
// topology, split over the PS shards that serve them. `vanilla` is analytic; other
// policies come from a short simulator sample (docs/planner.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/scheduler/plan_file.h"
#include "ember/scheduler/simulator.h"
#include "ember/scheduler/step_plan.h"

namespace ember::planner {

// One table's access counts: counts[row] samples of the split access `row`.
struct TableFrequencies {
  std::string name;
  std::uint64_t rows = 0;             // vocabulary (embedding rows)
  std::vector<std::uint32_t> counts;  // per row, as `ember-data stats` counts them
  std::uint32_t max_bag = 1;          // most ids of one sample (multi-hot datasets)
};

struct Frequencies {
  std::uint64_t samples = 0;  // of the split counted
  std::vector<TableFrequencies> tables;
};

// Counts every table of `split` (data::row_counts).
Frequencies load_frequencies(const data::Dataset& ds, data::Split split = data::Split::kTrain);

// The job modelled, as ember-sim and ember-worker take it.
struct Topology {
  std::uint32_t workers = 8;
  std::uint32_t batch_per_worker = 128;
  double cache_ratio = 0.1;  // LRU rows per worker, share of all tables' rows
  // The run averaged over: iterations warmup .. warmup + iterations - 1 of a job that
  // starts with empty caches (ember-sim's --warmup and --iterations).
  std::uint64_t warmup = 10;
  std::uint64_t iterations = 100;
  std::uint32_t shards = 1;  // PS shards; a key's shard is ps::owner_shard's
  // A disk tier under each shard with this RAM budget (ember-ps --ram-budget-mb); 0: none.
  // Modelled by the simulator's sample only (sampled_cost).
  std::uint64_t tier_budget_bytes = 0;
  // Batches the scheduler sees beyond the one it plans (ember-sim's --lookahead): the
  // sample's plans, and how far ahead the tier's hints come. Sampled policies only.
  std::uint32_t lookahead = 0;
  // Cache admission (ember-sim's --cache-admission): modelled by the simulator's sample
  // only, so with it vanilla is sampled too.
  std::string cache_admission = "none";
};

// Predicted traffic of one table, per iteration (means over the run), in rows.
struct TableCost {
  std::string name;
  std::uint64_t rows = 0;          // vocabulary
  std::uint64_t accessed = 0;      // rows with a non-zero frequency
  double distinct_per_worker = 0;  // E(b): distinct rows of one worker's micro-batch
  double pulls = 0;                // rows pulled by all workers
  double pull_state = 0;           // ... of them with the optimizer state (sole trainer)
  double push_grad = 0;            // gradients pushed (vanilla: every trained row)
  double push_value = 0;           // values pushed (sampled policies; vanilla pushes none)
  double push_evict = 0;           // dirty rows pushed on eviction (sampled policies)
  double hits = 0;                 // rows found latest in the cache
  double bytes = 0;                // payload bytes of pulls and pushes (scheduler::wire_bytes)

  double pushes() const { return push_grad + push_value + push_evict; }
};

// Predicted load of one PS shard, per iteration (means over the run), in rows: what it
// serves to and receives from all workers.
struct ShardCost {
  double pulls = 0;       // rows it serves
  double pull_state = 0;  // ... of them with the optimizer state
  double pushes = 0;      // rows pushed to it (gradients, values, evictions)
  double bytes = 0;       // payload bytes of those pulls and pushes
  // With a disk tier (Topology::tier_budget_bytes), rows per iteration: used by its
  // requests, read from disk, and read while a request waited; without hints (an LRU
  // alone) and with the workers' lookahead hints.
  scheduler::TierRates tier, tier_hinted;
};

struct CostEstimate {
  std::string policy;
  std::vector<TableCost> tables;
  std::vector<ShardCost> shards;  // Topology::shards entries; they add up to the tables
  // Taken from a simulator sample (sampled_cost), not from the analytic model: the
  // iterations counted and the seconds the sample took.
  bool sampled = false;
  std::uint64_t sample_iterations = 0;
  double sample_seconds = 0;
  std::uint32_t cache_rows = 0;  // per worker
  // Rows a worker holds as latest at the last modelled iteration without evictions, over
  // cache_rows: above 1 the LRU evicts, and the model limits a copy's life accordingly.
  double cache_demand = 0;
  double lifetime = 0;  // iterations an unused copy survives in the LRU (inf: no eviction)
};

// `vanilla` (docs/design.md, policies): a random balanced split, every trained row's
// gradient pushed, a sole trainer keeping a latest-clean copy. Throws ConfigError for
// impossible settings (no workers, an empty batch, a cache ratio outside (0, 1]).
CostEstimate vanilla_cost(const Frequencies& f, const Topology& topo, scheduler::RowFormat row);

// `vanilla` for a job that reads the training split in file order (ember-sim and
// ember-worker without --shuffle): SCARS's E(b) per global batch, from each batch's own
// frequencies (the split into micro-batches drawn without replacement: hypergeometric),
// so bursts and time-ordered features (Avazu's hour) count as they come. Reads the
// batches of iterations 0 .. warmup + iterations - 1 once. The LRU's copy lifetime is
// the frequency model's (`vanilla_cost`).
CostEstimate vanilla_cost_in_order(const data::Dataset& ds, const Topology& topo, scheduler::RowFormat row);

// Any policy ember-sim runs (herald, laia, ...): its per-table and per-shard rows per
// iteration counted by the simulator itself (scheduler::simulate, in this process) over
// iterations topo.warmup .. topo.warmup + sample_iterations - 1; topo.iterations is not
// used. `shuffle` and `seed` as ember-sim's. Throws ConfigError for an unknown policy or
// a split too short for the sample.
// With `plan` (treatments, cache rows, shares): the sample executes it (its cache rows
// replace topo.cache_ratio's), as a job with --placement would.
CostEstimate sampled_cost(const data::Dataset& ds, const Topology& topo, scheduler::RowFormat row, const std::string& policy,
                          std::uint64_t sample_iterations, bool shuffle = false, std::uint64_t seed = 1,
                          const scheduler::PlanFile* plan = nullptr);

}  // namespace ember::planner
