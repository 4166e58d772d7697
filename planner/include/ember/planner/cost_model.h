// The planner's cost model (issue 29, first slice): per table, the rows one iteration
// moves between the workers and the PS, predicted analytically from a dataset's per-row
// frequencies and the topology. Only `vanilla` so far (docs/planner.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/scheduler/step_plan.h"

namespace ember::planner {

// One table's access counts: counts[row] samples of the split access `row`.
struct TableFrequencies {
  std::string name;
  std::uint64_t rows = 0;             // vocabulary (embedding rows)
  std::vector<std::uint32_t> counts;  // per row, as `ember-data stats` counts them
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
  double hits = 0;                 // rows found latest in the cache
  double bytes = 0;                // payload bytes of pulls and pushes (scheduler::wire_bytes)
};

struct CostEstimate {
  std::string policy;
  std::vector<TableCost> tables;
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

}  // namespace ember::planner
