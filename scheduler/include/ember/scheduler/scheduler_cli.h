// The scheduler's options, declared once (common/option_registry.h) for every program
// that takes them: ember-worker, ember-sim, and (the job's shape alone) ember-plan and
// ember-bench sched. ember-worker's registry (worker/src/job/job_options.h) extends this
// one with the worker's own options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/common/option_registry.h"
#include "ember/scheduler/scheduler_config.h"

namespace ember::scheduler {

// --workers, --batch-per-worker, --cache-ratio (every program); --policy, --seed,
// --shuffle, --iterations, --sched-threads, --lookahead, --eviction, --prefetch,
// --refine-allocation, --host-allocation, --peer-sync, --scheduler-per-host,
// --placement, --eval-every (ember-worker and ember-sim); --budget-ms, --partitions
// (ember-sim). Which the workers of a job must agree on, and which the launchers pass.
const std::vector<OptionDecl<SchedulerOptions>>& scheduler_options();

// Registers the options `program` takes on `app`, bound to `o` (its values the defaults).
void add_scheduler_options(CLI::App& app, SchedulerOptions& o, Program program);

// ember-sim's and ember-plan's --iterations are the job's batches, the first --warmup of
// them not `counted` (the word their outputs use): the rest, or ConfigError when none is.
std::uint64_t counted_iterations(std::uint64_t iterations, std::uint64_t warmup, const char* counted);

// A plan file as the workers compare it: its size and contents, not its path ("none").
std::string placement_identity(const std::string& path);

}  // namespace ember::scheduler
