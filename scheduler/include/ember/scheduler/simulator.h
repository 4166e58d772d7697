// The cache simulator behind `ember-sim`: replays a dataset's global batches through
// the Scheduler (the same code the workers run) and counts every row that would cross
// the network.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/scheduler/host_parts.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_config.h"

namespace ember::scheduler {

struct SimOptions {
  // The job replayed: its policy is the one simulated; simulate() sets its iterations
  // (the batches fae profiles) to warmup + iterations.
  SchedulerOptions scheduler;
  std::uint64_t iterations = 100;  // counted
  std::uint64_t warmup = 10;       // first iterations not counted
  // The job's flushes (scheduler.eval_every and ember-ps --checkpoint-every): the rows
  // it holds are pushed after these iterations and at the end, as a job does.
  std::uint64_t checkpoint_every = 0;
  bool digest = false;  // hash every plan of every worker (determinism checks)
  // scheduler.scheduler_per_host: one scheduler per host (HostSchedulers; needs host_of),
  // each modelling its own host's caches, as a job's processes do: the same plans;
  // scheduler_bytes and the times are one host's (the largest, the slowest).
  std::function<void(const std::string& policy, std::uint64_t done, std::uint64_t total)> on_progress;
  // The PS shards, for per-shard counts: `shard_of` maps a key to its shard in
  // 0 .. shards - 1 (as the PS places it: ps::owner_shard); none when shards is 0.
  std::uint32_t shards = 0;
  std::function<std::uint32_t(Key key)> shard_of;
  // Dynamic tables: the slots of each shard, as a job's shards have them (ember-ps
  // --slots-per-shard; the cache rows of a --cache-ratio follow them); 0: as
  // make_key_directory sizes them.
  std::uint64_t slots_per_shard = 0;
  // Per-link counts (docs/cluster.md#traffic-per-link): `link_of(worker, key)` is 0 when
  // the PS traffic of `worker` for `key` stays within its host, 1 when it crosses hosts;
  // none without it.
  std::function<std::size_t(WorkerId worker, Key key)> link_of;
  // With link_of: `host_of(worker)` numbers the workers' hosts, for the per-link counts
  // of per-host aggregation (SimResult::per_link_aggregated); none without it.
  std::function<std::uint32_t(WorkerId worker)> host_of;
  // A disk tier under each shard (ember-ps --store-dir --ram-budget-mb; needs shards):
  // its budget, and the bytes of a row with its optimizer state. SimResult::per_shard_tier.
  std::uint64_t tier_budget_bytes = 0;
  std::uint64_t tier_row_bytes = 0;  // RowFormat::stored_bytes()
};

// A shard's disk tier over the counted iterations (SimOptions::tier_budget_bytes): rows
// its requests used, rows read from disk, and those a request waited for.
struct TierReads {
  std::uint64_t rows_touched = 0, reads = 0, critical_reads = 0;
};
// The same per iteration (means over `iterations`); tier_report.h prints them.
struct TierRates {
  double rows_touched = 0, reads = 0, critical_reads = 0;
};
TierRates per_iteration(const TierReads& t, std::uint64_t iterations);

struct SimResult {
  std::string policy;
  TrafficCounts traffic;         // summed over the counted iterations
  std::uint64_t iterations = 0;  // counted
  std::uint32_t cache_rows = 0;
  double sched_ms_mean = 0, sched_ms_median = 0;
  double laia_tables_mean = 0;
  double scoring_ms_mean = 0;
  std::size_t scheduler_bytes = 0;
  std::uint64_t cached_rows = 0;             // rows held in all caches at the end
  std::uint64_t plan_digest = 0;             // with SimOptions::digest
  std::vector<TrafficCounts> per_iteration;  // counted iterations only
  // The same counts per table (the table of each row's key), summed over the counted
  // iterations; they add up to `traffic` kind by kind, except cold_pulls (not split:
  // zero here).
  std::vector<TrafficCounts> per_table;
  // The same per PS shard (the shard of each row's key, SimOptions::shard_of): the rows
  // and bytes each shard serves; empty without SimOptions::shards.
  std::vector<TrafficCounts> per_shard;
  // The same per link class (SimOptions::link_of): [0] within a host, [1] across hosts;
  // empty without SimOptions::link_of.
  std::vector<TrafficCounts> per_link;
  // The same with per-host aggregation (ember-worker --host-aggregation, whose counts
  // these are link by link): a row pulled across hosts by several workers
  // of one host crosses once (the other copies are handed over within the host), and
  // gradients of one row pushed across hosts by several workers of one host are summed
  // there and cross once (the others are sums within the host). Values cross as they
  // do. Empty without SimOptions::host_of.
  std::vector<TrafficCounts> per_link_aggregated;
  // Per shard, with a disk tier (SimOptions::tier_budget_bytes): without hints (an LRU over
  // pages) and with the workers' hints (--lookahead iterations ahead; none without
  // lookahead). The rows a request touches: pulled, pushed (gradients, values, evictions,
  // flushes); those a hint names: every row of the batch. Empty without a tier.
  std::vector<TierReads> per_shard_tier, per_shard_tier_hinted;
  // Dynamic tables (a dataset of hashed ids): the rows the KeyDirectory made, kept out,
  // expired and capped per PS shard (SimOptions::shards; one without), over every
  // iteration, warm-up included, and the directory's bytes. Empty for fixed tables.
  std::vector<DirectoryCounts> per_shard_rows;
  std::size_t directory_bytes = 0;
  std::uint64_t dynamic_slots = 0;  // the key space of the slots

  double hit_rate() const {
    // Misses: pulls, and rows peer sync handed over.
    double total = static_cast<double>(traffic.hits + traffic.pulls + traffic.peer_value);
    return total > 0 ? static_cast<double>(traffic.hits) / total : 0.0;
  }
};

// Dynamic tables: the directory a job of `iterations` batches of `o`'s shape on `ds` (a
// dataset of hashed ids) keeps over `shards` PS shards (0: one), by o's options. Its
// slots per shard: with --shard-max-rows, the cap and one batch's ids; without, a bound
// of the distinct ids the batches can hold on one shard (their ids over the shards, with
// room for an uneven hash).
KeyDirectory make_key_directory(const data::Dataset& ds, const SchedulerOptions& o, std::uint32_t shards, std::uint64_t iterations);
// o's dynamic-table options over `shards` PS shards (0: one).
DynamicTableOptions dynamic_table_options(const SchedulerOptions& o, std::uint32_t shards);
// The most ids one global batch of o's shape on `ds` holds (a shard's slots beyond its
// cap: KeyDirectory::slots_needed).
std::uint64_t batch_ids_bound(const data::Dataset& ds, const SchedulerOptions& o);

// A stable hash of a worker's plan (every list, in order).
std::uint64_t plan_hash(const StepPlan& plan, std::uint64_t seed);

// Adds one iteration's plans (after Scheduler::schedule, or after Scheduler::flush when
// `flush`) to per-table counts, the table of a key found in `offsets` (the scheduler's
// table_offsets). `per_table` has one entry per table.
void count_per_table(const std::vector<StepPlan>& plans, const std::vector<std::uint64_t>& offsets, bool flush,
                     std::vector<TrafficCounts>& per_table);

// The same per group: `group_of(worker, key)` indexes `per_group` (a table, a PS shard,
// a link class) for a row of `worker`'s plan. `peer_within` (link classes): rows handed
// by peer sync go to group 0, within the host, whatever the key.
void count_per_group(const std::vector<StepPlan>& plans, bool flush, const std::function<std::size_t(WorkerId, Key)>& group_of,
                     std::vector<TrafficCounts>& per_group, bool peer_within = false);

// Per-link counts with per-host aggregation (SimResult::per_link_aggregated), an
// iteration at a time: `link_of` and `host_of` as in SimOptions. It follows each host's
// gradient parts still to push (HostParts) from iteration to iteration, so every
// iteration and flush goes through count(), the uncounted ones (warmup) with `per_link`
// null.
class AggregatedLinks {
 public:
  AggregatedLinks(std::function<std::size_t(WorkerId, Key)> link_of, std::function<std::uint32_t(WorkerId)> host_of)
      : link_of_(std::move(link_of)), host_of_(std::move(host_of)) {}
  void count(const std::vector<StepPlan>& plans, bool flush, std::vector<TrafficCounts>* per_link);

 private:
  // The gradient rows of one phase (`list` of each plan) that cross summed into others:
  // a host's parts of a row become one where HostParts allows it.
  template <typename List>
  std::uint64_t summed(const std::vector<StepPlan>& plans, List&& list);

  std::function<std::size_t(WorkerId, Key)> link_of_;
  std::function<std::uint32_t(WorkerId)> host_of_;
  std::map<std::uint32_t, HostParts> parts_;  // by host
};

// Runs the policy of options.scheduler. Throws ConfigError for impossible configurations.
SimResult simulate(const data::Dataset& ds, const SimOptions& options);

// The busiest of `groups` (per-shard counts, per-shard costs) over their mean by `value`,
// a member pointer or a function of one group: 1 is balanced, 0 when nothing moves.
template <class T, class F>
double max_over_mean(const std::vector<T>& groups, F value) {
  double max = 0, sum = 0;
  for (const T& g : groups) {
    const auto v = static_cast<double>(std::invoke(value, g));
    max = std::max(max, v);
    sum += v;
  }
  return sum > 0 ? max * static_cast<double>(groups.size()) / sum : 0.0;
}

}  // namespace ember::scheduler
