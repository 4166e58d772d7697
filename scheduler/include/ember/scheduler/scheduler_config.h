// The scheduler's configuration, and the one place it is built from what the user
// chooses: every process of a job (and ember-sim, and the benchmarks) calls
// make_scheduler_config, so they all schedule alike.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ember/common/types.h"
#include "ember/data/dataset.h"
#include "ember/scheduler/plan_file.h"
#include "ember/scheduler/policy.h"

namespace ember::scheduler {

// Which cached row leaves a full cache (docs/scheduler.md "Lookahead").
enum class Eviction : std::uint8_t {
  kLru,        // the least recently used
  kLookahead,  // the LRU row no batch of the window needs; else the one needed last
  kBelady,     // the same over the whole run (ember-sim only: the bound)
};

// "lru", "lookahead", "belady"; ConfigError otherwise.
Eviction parse_eviction(const std::string& text);

// Whether a row pulled into a full cache takes a slot (--cache-admission).
enum class Admission : std::uint8_t {
  kNone,     // every pulled row enters the cache (the contract's step 2)
  kTinyLfu,  // only a row seen in more recent global batches than the row it would evict
};
Admission parse_admission(const std::string& text);
const char* admission_name(Admission a);
const char* eviction_name(Eviction e);

// The settings that pass from what the user chooses to the Scheduler as they are: both
// SchedulerOptions and SchedulerConfig extend this, and make_scheduler_config copies it
// whole, so that such an option is one field here plus its flag (scheduler_cli.cc). A
// setting the configuration takes transformed (a ratio into rows, text into an enum)
// stays in each struct, with its conversion in make_scheduler_config.
struct SchedulerCommon {
  std::uint32_t workers = 8;
  std::uint32_t batch_per_worker = 128;
  std::uint64_t seed = 1;  // the scheduler's random draws; the batch order when shuffled
  int threads = 1;         // TBB threads for scoring and cache updates
  // Adaptive LAIA (Herald 4.3): > 0 scores only the k highest-DoI tables that fit this
  // scoring-time budget per batch; 0 scores every table (static LAIA).
  double budget_ms = 0;
  // Herald's partitioned allocation: split the batch into P parts allocated in parallel,
  // each giving every worker batch_per_worker / P samples. 1 = sequential Algorithm 1.
  std::uint32_t partitions = 1;
  // LAIA's allocation refined by swaps of samples between workers, each lowering the
  // rows the batch moves (docs/scheduler.md "Refined allocation"). LAIA policies only.
  bool refine_allocation = false;
  // Two-level LAIA: samples to hosts first, then to the workers of each host
  // (allocation.h, allocate_laia_by_host; SchedulerConfig::host_of). The hosts come from
  // the job (ember-worker: the host map at the join; ember-sim: --hosts).
  bool host_allocation = false;
  // Peer sync within a host (on-demand sync; needs SchedulerConfig::host_of): a row
  // latest on a worker goes to the other trainers of its host from there, not through
  // the PS, and a row trained within one host only is applied there (docs/design.md "The
  // host hierarchy").
  bool peer_sync = false;
  // Mark the pulls whose PS copy is final before the previous iteration computes
  // (PullEntry::prefetch). Needs no window: the loader plans t+1 while t trains.
  bool prefetch = false;
};

// What the Scheduler runs with.
struct SchedulerConfig : SchedulerCommon {
  std::uint32_t cache_rows = 0;              // LRU capacity per worker, in rows
  std::vector<std::uint64_t> table_offsets;  // global key = offset[t] + row; size T
  std::uint64_t num_keys = 0;                // total rows of all tables
  // Per table: the most ids one sample's bag holds (multi-hot datasets); empty: one each.
  // Sizes what a micro-batch can stage of an uncached table.
  std::vector<std::uint32_t> bag_bound;
  Policy policy;
  // Each worker's host, numbered from 0 (host_allocation, peer_sync, model_host).
  std::vector<std::uint32_t> host_of;
  // The host whose workers this scheduler models (their caches, plans and traffic), or
  // -1: every worker. Every row's state is kept either way; the other hosts' evictions
  // come from them (Scheduler::evictions, apply_evictions; docs/scheduler.md "State per
  // process"). Needs host_of.
  int model_host = -1;
  // A scheduler of every worker lists its evictions too (Scheduler::evictions;
  // benchmarks replay them to one host's scheduler).
  bool list_evictions = false;
  // The worker whose plans carry id_rows (StepPlan): a worker's own rank; -1: none (the
  // simulator and the benchmarks need no per-id output).
  int id_rows_for = -1;
  // The rows an evaluation reads (the validation samples', any order): an evaluation's
  // flush (Scheduler::flush) pushes only these. Empty: no evaluation before the end.
  std::vector<Key> evaluated_rows;
  // Dynamic tables: the rows an evaluation reads are known only at its time (its ids'
  // slots then), so its flush is a whole one.
  bool evaluation_flushes_all = false;
  // An evaluation's flush hands a dirty owner's evaluated rows to worker 0 rather than
  // pushing them (Scheduler::flush). Worker 0 learns which from every worker's plan, so
  // not with a scheduler per host (model_host); make_scheduler_config sets it otherwise.
  bool hand_evaluated_rows = false;
  // Whether each key is replicated on every worker (fae's hot rows, a placement's
  // replicated tables); size num_keys, or empty: none. Required by fae.
  std::vector<std::uint8_t> replicated;
  // A placement's treatment per table (empty: every table cached), and whether each key
  // is of an uncached table (size num_keys, or empty: none).
  std::vector<Treatment> treatments;
  std::vector<std::uint8_t> uncached;
  // A placement's cache shares per table (rows of an LRU of its own; 0: the pool the
  // other cached tables share); empty: one LRU (WorkerCache).
  std::vector<std::uint32_t> cache_shares;
  // The first iteration scheduled (a job resumed from a checkpoint starts later; sample
  // draws and plans are numbered from it).
  std::uint64_t first_iteration = 0;
  // Batches the scheduler sees beyond the one it schedules (Scheduler::look_ahead);
  // 0 = none. Belady: the batches left in the run.
  std::uint32_t lookahead = 0;
  Eviction eviction = Eviction::kLru;
  // A pull into a full cache: the row takes the victim's slot only if admitted
  // (admission.h); a row not admitted is staged for the iteration, as an uncached
  // table's row is (pulled, its gradient pushed at the end, dropped).
  Admission admission = Admission::kNone;

  bool replicates() const { return !replicated.empty(); }
  // Whether this scheduler models worker w's cache and plan.
  bool models(std::uint32_t w) const { return model_host < 0 || host_of[w] == static_cast<std::uint32_t>(model_host); }
  // Table t's entries of a per-key vector (replicated, uncached, a group per key).
  std::span<std::uint8_t> in_table(std::vector<std::uint8_t>& per_key, std::size_t t) const {
    const Key end = t + 1 < table_offsets.size() ? table_offsets[t + 1] : num_keys;
    return std::span<std::uint8_t>(per_key).subspan(table_offsets[t], end - table_offsets[t]);
  }
  std::span<const std::uint8_t> in_table(const std::vector<std::uint8_t>& per_key, std::size_t t) const {
    const Key end = t + 1 < table_offsets.size() ? table_offsets[t + 1] : num_keys;
    return std::span<const std::uint8_t>(per_key).subspan(table_offsets[t], end - table_offsets[t]);
  }
  // Staging slots per worker for uncached rows (at most one per sample and uncached
  // table) and, with admission, rows not admitted (at most the cache's rows: a
  // micro-batch's rows fit in it), numbered from cache_rows: the worker's row store
  // holds cache_rows + these.
  std::uint32_t staging_rows() const;
};

// What the user chooses (ember-sim's and ember-worker's flags): SchedulerCommon's
// settings, and those make_scheduler_config resolves.
struct SchedulerOptions : SchedulerCommon {
  double cache_ratio = 0.1;        // cache rows per worker = ceil(ratio x rows of the key space)
  std::string policy = "vanilla";  // parse_policy's syntax
  bool shuffle = false;            // global batches from a seeded permutation
  // Global batches the job schedules, from the start of the training split: fae
  // profiles its replicated rows over them.
  std::uint64_t iterations = 0;
  // ember-worker: each process schedules with a scheduler of its own host
  // (SchedulerConfig::model_host), the hosts' evictions exchanged after each iteration.
  bool scheduler_per_host = false;
  // Rows per table of the key space (and so of the cache ratio), when the dataset saw
  // only part of each table (a short synthetic file); empty = the manifest's rows.
  std::vector<std::uint64_t> table_rows;
  // Refuse simulator-only policies (brute) with the message a training job gives.
  bool for_training = false;
  // Lookahead: batches seen beyond the one scheduled (less than `iterations`), and the
  // eviction they drive ("auto": lookahead when lookahead > 0, else lru).
  std::uint32_t lookahead = 0;
  std::string eviction = "auto";
  std::string cache_admission = "none";  // SchedulerConfig::admission: none or tinylfu
  // The job's evaluations: every worker flushes the rows it holds after every
  // `eval_every` iterations (0: after the last only); ember-sim replays them.
  std::uint64_t eval_every = 0;
  // Validation samples an evaluation reads (0: the whole split). An evaluation's flush
  // pushes only their rows (SchedulerConfig::evaluated_rows).
  std::uint64_t eval_samples = 0;
  // A plan file (ember-plan --plan-out): per table a treatment and the cache rows per
  // worker, which replace cache_ratio's. Empty: every table cached.
  std::string placement;
  // The same, in memory (the planner's samples): used when it has treatments and
  // `placement` is empty.
  PlanFile placement_plan;
  // Dynamic tables (a dataset of hashed ids): the key space is the KeyDirectory's slots
  // (KeyDirectory::slot_count); 0 for tables of fixed size. The directory's decisions
  // (key_directory.h): creation after N batches (its filter's MB), expiry, the cap.
  std::uint64_t dynamic_slots = 0;
  std::uint32_t create_after = 1;
  double create_filter_mb = 8;
  std::uint64_t expire_after = 0;
  std::uint64_t shard_max_rows = 0;
  // A stream of raw lines (data/stream.h) instead of the dataset's training split: its
  // directory and its text format; bags: their separator (one character) and bound.
  std::string stream;
  std::string stream_format = "criteo";
  std::string stream_multi_hot_sep;
  std::uint32_t stream_max_bag = 64;
};

// The configuration for a job on `ds` with options `o`, replicated rows included (profiled
// over the job's batches when the policy replicates them). Throws ConfigError for an
// unknown policy, a cache ratio outside (0, 1], table_rows of the wrong size, a global
// batch larger than the training split (when profiling), or a simulator-only policy
// with for_training, a placement that does not fit the dataset or applies to a
// policy of bounded staleness (het), and lookahead settings that cannot apply (a window reaching past
// o.iterations, belady in training, check_lookahead's). Belady's window is the whole
// run (o.iterations). The Scheduler's constructor checks the rest.
SchedulerConfig make_scheduler_config(const data::Dataset& ds, const SchedulerOptions& o);

// The job's hosts, known once the workers joined (ember-worker; ember-sim's come from
// --hosts): `host_of` (each worker's host, from 0) where two-level allocation, peer sync or
// a scheduler per host needs it, and with o.scheduler_per_host the host this process
// models (`my_host`). The one place o's host switches reach the configuration.
void set_hosts(SchedulerConfig& c, const SchedulerOptions& o, const std::vector<std::uint32_t>& host_of, std::uint32_t my_host);

// Configures `c` for `plan` (read_plan's): treatments, replicated and uncached keys, the
// cache rows. ConfigError, naming `what`, for het:S or a plan of another number of tables.
void configure_placement(const PlanFile& plan, const std::string& what, SchedulerConfig& c);

// ConfigError for an eviction by next use without a window, or any lookahead (window,
// eviction by next use, prefetch) with bounded-staleness sync (het:S). make_scheduler_config and the Scheduler call it.
void check_lookahead(const SchedulerConfig& c);

// Global key offsets per table: from `table_rows` when given (each at least the
// manifest's rows), else from the manifest. The last element is the key space size.
std::vector<std::uint64_t> key_space(const data::Dataset& ds, const std::vector<std::uint64_t>& table_rows);

// Cache rows per worker for a ratio of the key space.
std::uint32_t cache_rows_for(double ratio, std::uint64_t total_rows);

// The global batches a job with options `o` schedules, in order. Throws ConfigError when
// one global batch (workers x batch-per-worker) exceeds the training split.
data::BatchReader global_batch_reader(const data::Dataset& ds, const SchedulerOptions& o);

}  // namespace ember::scheduler
