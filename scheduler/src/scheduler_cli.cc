#include "ember/scheduler/scheduler_cli.h"

#include <fmt/format.h>

#include <iterator>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"

namespace ember::scheduler {

namespace {

using Decl = OptionDecl<SchedulerOptions>;
constexpr unsigned kAll = kWorkerProgram | kSimProgram | kShapeProgram;
constexpr unsigned kJob = kWorkerProgram | kSimProgram;  // a training job, and its replay

// `member` of SchedulerOptions or of its base SchedulerCommon (the settings that pass to
// the Scheduler as they are).
template <class Base, class T>
Decl option(const char* flag, T Base::*member, const char* help, unsigned programs) {
  return field_option<SchedulerOptions>(flag, member, help, programs);
}

// The job's shape: its size, batches, data order and the scheduler's own knobs.
std::vector<Decl> shape_options() {
  return {
      option("--workers", &SchedulerOptions::workers, "workers in the job", kAll),
      option("--batch-per-worker", &SchedulerOptions::batch_per_worker, "samples per worker per iteration", kAll).must_agree(),
      option("--cache-ratio", &SchedulerOptions::cache_ratio, "embedding cache rows per worker, as a fraction of all rows", kAll)
          .must_agree(),
      option("--policy", &SchedulerOptions::policy,
             "vanilla, laia, plan, herald, het:S, fae:F (hottest fraction F replicated on every worker); ember-sim: several, "
             "comma-separated, and brute (the bound on tiny jobs)",
             kJob)
          .must_agree()
          .job_setting(),
      option("--seed", &SchedulerOptions::seed, "data order, allocation ties, dense initialization (ember-sim: also synthetic data)", kJob)
          .must_agree(),
      option("--shuffle", &SchedulerOptions::shuffle, "global batches from a seeded permutation of the training split", kJob).must_agree(),
      option("--iterations", &SchedulerOptions::iterations,
             "global batches the job trains (ember-sim: schedules, the first --warmup of them not counted)", kJob)
          .must_agree(),
      option("--stream", &SchedulerOptions::stream,
             "train on raw lines from the files of this directory, read in name order as they come in, or from a Kafka topic, "
             "kafka://HOST:PORT[,HOST:PORT...]/TOPIC (hashed ids, docs/online.md), not on the dataset's training split",
             kJob)
          .must_agree(),
      option("--stream-format", &SchedulerOptions::stream_format, "--stream: criteo (TSV), criteo-csv or avazu", kJob).must_agree(),
      option("--stream-multi-hot-sep", &SchedulerOptions::stream_multi_hot_sep,
             "--stream: every categorical field is a bag of values split by this character (as prep --multi-hot-sep)", kJob)
          .must_agree(),
      option("--stream-max-bag", &SchedulerOptions::stream_max_bag,
             "--stream with bags: the most values a bag holds (a line with a longer one is passed over and logged)", kJob)
          .must_agree(),
      option("--sched-threads", &SchedulerOptions::threads, "scheduler threads (the plans do not depend on them)", kJob),
      option("--budget-ms", &SchedulerOptions::budget_ms, "adaptive LAIA: scoring budget per batch (0 = score every table)", kSimProgram),
      option("--partitions", &SchedulerOptions::partitions, "partitioned LAIA allocation (Herald's parallel variant)", kSimProgram),
  };
}

// The mechanisms a policy runs with (allocation, hosts, lookahead, eviction, admission,
// prefetch, placement) and the flushes of evaluations.
std::vector<Decl> mechanism_options() {
  return {
      option("--refine-allocation", &SchedulerOptions::refine_allocation,
             "laia, herald: refine LAIA's allocation by swaps that move fewer rows in the batch", kJob)
          .must_agree()
          .job_setting(),
      option("--host-allocation", &SchedulerOptions::host_allocation,
             "laia, herald: allocate samples to hosts first, then to the workers of each host (two-level LAIA; ember-sim: "
             "with --hosts or --host-map)",
             kJob)
          .must_agree(),
      option("--peer-sync", &SchedulerOptions::peer_sync,
             "plan, herald: a row latest on a worker goes to the other trainers of its host from there, not through the PS; "
             "a row trained within one host only is applied there",
             kJob)
          .must_agree(),
      option("--scheduler-per-host", &SchedulerOptions::scheduler_per_host,
             "each process models only its host's caches (not every worker's), the hosts' evictions exchanged after each "
             "iteration: the same plans, with state and time per process that do not grow with the job (ember-sim: with "
             "--hosts or --host-map; scheduler bytes and ms are one host's)",
             kJob)
          .must_agree(),
      option("--lookahead", &SchedulerOptions::lookahead, "batches the scheduler sees beyond the one it plans (0 = none)", kJob)
          .must_agree()
          .job_setting(),
      option("--eviction", &SchedulerOptions::eviction,
             "auto, lru or lookahead (auto: lookahead when --lookahead > 0); ember-sim also belady", kJob)
          .must_agree()
          .job_setting()
          .compared_as([](const SchedulerOptions& o) {
            return o.eviction == "auto" ? std::string(o.lookahead > 0 ? "lookahead" : "lru") : o.eviction;
          }),
      option("--cache-admission", &SchedulerOptions::cache_admission,
             "none or tinylfu: a row pulled into a full cache takes a slot only if seen in more recent global batches "
             "than the row it would evict (a frequency sketch); else it is trained for that iteration only, as an "
             "uncached row",
             kAll)
          .must_agree()
          .job_setting(),
      option("--prefetch", &SchedulerOptions::prefetch,
             "pull the next iteration's rows whose PS copy is final while this one computes (ember-sim: counts them as "
             "prefetched)",
             kJob)
          .must_agree()
          .job_setting(),
      option("--placement", &SchedulerOptions::placement,
             "plan file (ember-plan --plan-out): per table cache, replicated or uncached, and the cache rows (replace "
             "--cache-ratio)",
             kJob)
          .must_agree()
          .job_setting()
          .compared_as([](const SchedulerOptions& o) { return placement_identity(o.placement); }),
      option("--eval-every", &SchedulerOptions::eval_every,
             "evaluate every N iterations (0: only at the end), after a flush of the rows the evaluation reads (held ones are handed to "
             "worker 0)",
             kJob)
          .must_agree(),
      option("--eval-samples", &SchedulerOptions::eval_samples,
             "validation samples per evaluation (0: all); an evaluation's flush pushes only their rows", kJob)
          .must_agree(),
  };
}

// Dynamic tables (a dataset of hashed ids, KeyDirectory): when rows are made and dropped.
std::vector<Decl> dynamic_options() {
  return {
      option("--create-after", &SchedulerOptions::create_after,
             "dynamic tables: an id gets a row once it has appeared in N global batches (until then: a zero vector, no gradient)", kJob)
          .must_agree()
          .job_setting(),
      option("--create-filter-mb", &SchedulerOptions::create_filter_mb, "dynamic tables: memory of --create-after's counting filter", kJob)
          .must_agree()
          .job_setting(),
      option("--expire-after", &SchedulerOptions::expire_after,
             "dynamic tables: drop a row that has not appeared in a global batch for K iterations (0: never)", kJob)
          .must_agree()
          .job_setting(),
      option("--shard-max-rows", &SchedulerOptions::shard_max_rows,
             "dynamic tables: at a commit, cap each PS shard's rows, dropping the least recently appeared (0: no cap)", kJob)
          .must_agree()
          .job_setting(),
  };
}

std::vector<Decl> declare() {
  // The workers agree on everything that shapes the plans: every worker runs the whole
  // scheduler and follows the plans of all of them; on the global batches and their
  // order; and on the flushes (barriers and commits of every worker). The thread count
  // may differ (the plans do not depend on it: scheduler_test's
  // SameInputsGiveIdenticalPlansWithAnyThreadCount).
  std::vector<Decl> d = shape_options();
  std::vector<Decl> more = mechanism_options();
  d.insert(d.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  std::vector<Decl> dynamic = dynamic_options();
  d.insert(d.end(), std::make_move_iterator(dynamic.begin()), std::make_move_iterator(dynamic.end()));
  return d;
}

}  // namespace

const std::vector<OptionDecl<SchedulerOptions>>& scheduler_options() {
  static const std::vector<Decl> decls = declare();  // immutable after its first use
  return decls;
}

void add_scheduler_options(CLI::App& app, SchedulerOptions& o, Program program) { add_options(app, scheduler_options(), o, program); }

std::uint64_t counted_iterations(std::uint64_t iterations, std::uint64_t warmup, const char* counted) {
  if (warmup >= iterations) {
    throw ConfigError("--warmup " + std::to_string(warmup) + " leaves none of the --iterations " + std::to_string(iterations) + " " +
                      counted);
  }
  return iterations - warmup;
}

std::string placement_identity(const std::string& path) {
  if (path.empty()) return "none";
  const std::string text = read_file(path);
  return fmt::format("a plan of {} bytes, contents {:016x}", text.size(), fnv1a64(text));
}

}  // namespace ember::scheduler
