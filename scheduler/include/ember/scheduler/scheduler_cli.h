// The scheduler's flags, declared once for every program that takes them (ember-worker,
// ember-sim, ember-bench sched): the same names, bound to the SchedulerOptions
// make_scheduler_config reads.
#pragma once

#include "ember/scheduler/scheduler_config.h"

namespace CLI {
class App;
}

namespace ember::scheduler {

// Who takes the flags: a training job (ember-worker), the simulator (ember-sim), or a
// program that takes the job's shape alone (ember-bench sched). The help texts say what
// each does there; the simulator also takes the bound (belady), the adaptive and
// partitioned LAIA flags (--budget-ms, --partitions), and calls the thread count
// --threads (the worker: --sched-threads). The policy (ember-sim: --policies) and the
// iterations (ember-sim: counted after a warm-up) stay with each program.
enum class FlagsFor { kTraining, kSimulation, kShape };

// Adds --workers, --batch-per-worker, --cache-ratio (kShape: only these), --seed,
// --shuffle, the thread count, --lookahead, --eviction, --prefetch, --refine-allocation
// and --placement (and for the simulator --budget-ms, --partitions), with o's values as
// defaults.
void add_scheduler_options(CLI::App& app, SchedulerOptions& o, FlagsFor who);

}  // namespace ember::scheduler
