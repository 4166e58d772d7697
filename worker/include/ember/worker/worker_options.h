// ember-worker's options, declared once (common/option_registry.h): the scheduler's
// (scheduler/scheduler_cli.h), the job connection's, which ember-ps takes too
// (transport/job_connection_options.h), and the worker's own, each with its flag, field,
// default, help, whether the workers of a job must agree on it (the join check,
// worker/src/job/job_options.h) and whether the launchers pass it as a job setting
// (ember-worker --options-json, which scripts/ember_job.py reads). Adding an option is
// one declaration in worker_options.cc plus its use.
#pragma once

#include <string>
#include <vector>

#include "ember/common/option_registry.h"
#include "ember/worker/train_config.h"

namespace ember::worker {

// Every option of a training worker, in the order the join check names them.
const std::vector<OptionDecl<TrainConfig>>& worker_options();

// Registers them all on `app`, bound to `c` (its values the defaults).
void add_worker_options(CLI::App& app, TrainConfig& c);

// The declarations as JSON, one object per option: flag, kind (flag, integer, number,
// text), default (as `c` has it), help, agreed, setting.
std::string worker_options_json(const TrainConfig& c);

}  // namespace ember::worker
