// The planner's placement: per table a treatment (PS + cache, replicated, PS without
// cache), its predicted bytes per iteration on each link and its memory per worker, the
// greedy baselines of NeuroShard/AutoShard and a search that minimizes the busiest
// link's bytes under a memory budget, and the plan file (docs/planner.md). The worker
// and ember-sim execute a plan (--placement plan.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/planner/cost_model.h"
#include "ember/scheduler/plan_file.h"
#include "ember/scheduler/step_plan.h"

namespace ember::planner {

// The treatments and the plan file are the scheduler's (it executes them).
using scheduler::kPlanFormat;
using scheduler::parse_treatment;
using scheduler::PlanFile;
using scheduler::read_plan;
using scheduler::Treatment;
using scheduler::treatment_name;
using scheduler::write_plan;

// What the placement needs of one table, independent of the cache: its vocabulary and
// SCARS's E(b) for one worker's micro-batch and E(n) for the global batch (n = W b), from
// the split's frequencies (batches independent).
struct TableShape {
  std::string name;
  std::uint64_t rows = 0;
  double distinct_per_worker = 0;  // E(b)
  double distinct_global = 0;      // E(n)
  std::uint32_t max_bag = 1;       // most ids of one sample: a micro-batch stages up to b x this
};
std::vector<TableShape> table_shapes(const Frequencies& f, const Topology& topo);

struct PlacementInput {
  std::vector<TableShape> tables;
  std::uint32_t workers = 8, batch_per_worker = 128, shards = 1;
  scheduler::RowFormat row;
  std::uint64_t memory = 0;  // bytes per worker
  // Link rates, Mbit/s: each worker's (its PS traffic and the all-reduce) and each PS
  // shard's. The busiest link is the one whose bytes take longest.
  double worker_mbit = 1000, ps_mbit = 1000;
  // The PS + cache model (vanilla analytic, or a simulator sample) of every table with a
  // cache of `cache_ratio` of all rows per worker; called for a few sizes only (memoized).
  std::function<CostEstimate(double cache_ratio)> cache_model;
};

// A plan's predicted cost per iteration.
struct TableOutcome {
  Treatment treatment = Treatment::kCache;
  double rows = 0;         // rows moved per iteration (pulls + pushes, or all-reduced rows x W)
  double bytes = 0;        // bytes per iteration over all links (both directions)
  double worker_link = 0;  // bytes on each worker's link
  double ps_link = 0;      // bytes on each PS shard's link (the table spread over the shards)
  double memory = 0;       // bytes per worker (replicated: the table and its state)
};
struct PlanCost {
  bool feasible = false;
  std::vector<TableOutcome> tables;
  std::uint64_t memory = 0;          // replicated tables + cache, per worker
  std::uint32_t cache_rows = 0;      // the shared LRU: the budget left over a slot's bytes
  std::uint32_t modelled_cache = 0;  // the cache size the PS + cache model was taken at (<= cache_rows)
  double worker_link = 0, ps_link = 0;
  double worker_s = 0, ps_s = 0;  // those bytes over the links' rates
  bool worker_busiest() const { return worker_s >= ps_s; }
  double busiest_s() const { return worker_busiest() ? worker_s : ps_s; }
  double busiest() const { return worker_busiest() ? worker_link : ps_link; }  // its bytes
  double total = 0;                                                            // all links' bytes (ties)
  double allreduce_rows = 0;  // replicated rows' gradients each worker all-reduces, in bytes (no ring factor)
};

class Placement {
 public:
  explicit Placement(PlacementInput in);
  // Bytes of one cache slot (a row's value and optimizer state), of a replicated table,
  // and the smallest memory any plan fits in (a worker holds at least its micro-batch's
  // b rows of every table not replicated).
  double slot_bytes() const;
  double replicated_bytes(std::size_t table) const;
  // The most rows of a table one micro-batch holds: min(rows, batch x largest bag).
  double micro_batch_rows(const TableShape& table) const;
  std::uint64_t min_memory() const;
  PlanCost evaluate(const std::vector<Treatment>& plan);
  // `c` (evaluate's) with its cached tables' bytes taken from `est` instead.
  PlanCost with_cache_cost(PlanCost c, const CostEstimate& est) const;
  // NeuroShard/AutoShard greedy: tables in `order`, each given the treatment that lowers
  // the busiest link (then the total) while the budget allows, starting from all cached.
  std::vector<Treatment> greedy(const std::vector<std::size_t>& order);
  // Orders: by rows, by rows touched per iteration (W E(b)), by their product; descending.
  std::vector<std::size_t> order_by(const std::string& key) const;
  // Beam search over the tables (by size x lookups) then single and pair moves, started
  // from the beam's best and from `seed` (the best greedy): never worse than `seed`.
  std::vector<Treatment> search(const std::vector<Treatment>& seed, std::size_t beam = 16);
  const PlacementInput& input() const { return in_; }
  std::size_t model_runs() const { return cache_.size(); }

 private:
  // A cached table's outcome from the PS + cache model's cost of it.
  void cached_outcome(TableOutcome& o, const TableCost& tc) const;
  // The plan's link and total bytes from its tables', and the links' times.
  void add_up(PlanCost& c) const;
  // nullptr where the model refuses the size (a sample's cache below a micro-batch's rows).
  const CostEstimate* model_at(std::uint32_t cache_rows);
  std::uint64_t total_rows_ = 0;
  PlacementInput in_;
  std::vector<std::pair<std::uint64_t, std::optional<CostEstimate>>> cache_;
};

// Cache shares for the cached tables of `plan` (costed `c`, one LRU): the candidates are
// one LRU and a few splits of the cache (every cached table a share by its rows, by its
// rows touched per iteration, by their geometric mean; the two largest cached tables
// capped at 10%, 20% or 30% of the cache each, the rest sharing the pool), each share at
// least a micro-batch's rows of its table. `model(shares)` gives the cached tables' cost
// with those shares (empty: one LRU), all on the same footing (a simulator sample of the
// plan); a split must take at least 1% off one LRU's busiest link to be chosen (less is
// the sample's noise), then the cheapest wins.
struct ShareChoice {
  std::vector<std::uint32_t> shares;  // per table; empty: one LRU
  std::string label = "one LRU";
  PlanCost cost;
  std::vector<std::pair<std::string, PlanCost>> tried;  // every candidate, one LRU first
};
ShareChoice choose_shares(const Placement& pl, const std::vector<Treatment>& plan, const PlanCost& c,
                          const std::function<CostEstimate(const std::vector<std::uint32_t>& shares)>& model);

bool better(const PlanCost& a, const PlanCost& b);  // feasible, busiest link sooner done, fewer bytes in all

// "64M", "512K", "2G" (binary: K = 1024), or plain bytes. Throws ConfigError.
std::uint64_t parse_bytes(const std::string& s);

// The iteration's time on one machine, calibrated from two short runs over loopback
// (scripts/bench_placement.py --calibrate writes the file): the CPU's part, fixed plus per
// byte the busiest PS link carries (rows framed, sent, applied), and the all-reduce's,
// fixed plus per byte each worker puts in (the dense gradients' bytes included).
struct Calibration {
  double cpu_s = 0, cpu_s_per_ps_byte = 0;
  double allreduce_s = 0, allreduce_s_per_byte = 0;
  double dense_allreduce_bytes = 0;  // the dense gradients and the loss, per worker
};
// Throws ConfigError naming the file and the first missing or bad field.
Calibration read_calibration(const std::filesystem::path& path);
// Predicted seconds per iteration of plan `c`: the CPU's and the all-reduce's parts plus
// the busiest link's bytes over its rate.
double iteration_seconds(const PlanCost& c, const Calibration& cal);

}  // namespace ember::planner
