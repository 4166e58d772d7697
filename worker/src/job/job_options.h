// The options every worker of a job must be started with alike (docs/training.md "Workers
// agree on their options"): worker 0 publishes its values on the control plane's board
// right after the job forms, every other worker compares its own with them, and one that
// differs refuses at once, naming the options by their flags and both values, instead of
// training apart or failing later with a riddle (a barrier's generations, a gradient
// aggregation not yet applied).
//
// Which options must agree is declared with each option (worker_options.cc, and the
// scheduler's in scheduler_cli.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/worker/train_config.h"

namespace ember::worker {

// The control-plane key worker 0 publishes its option values under.
inline constexpr const char* kWorkerOptionsKey = "worker_options";

// (flag, value) in the registry's order, e.g. {"--dense-lr", "0.01"}.
using OptionValues = std::vector<std::pair<std::string, std::string>>;

// A dataset's identity as the workers compare it: its training rows, dense features,
// tables' rows and the training shards' checksums (not its path).
std::string dataset_identity(const data::Manifest& m);

// The values of every option that must agree, of `c` on a dataset of identity `dataset`
// (dataset_identity). Reads the --placement file (its contents' hash; IoError when it
// cannot be read).
OptionValues agreed_options(const TrainConfig& c, const std::string& dataset);

// JSON (an array of [flag, value]) and back; ProtocolError for text that is not such JSON.
std::string options_to_json(const OptionValues& values);
OptionValues options_from_json(const std::string& text);

// The options on which `mine` differs from the job's, as one message
// ("--dense-lr 0.1, the job has 0.01; --seed 2, the job has 1"), in the table's order;
// empty when they agree. A flag only one side has (workers of different builds) differs.
std::string compare_options(const OptionValues& mine, const OptionValues& job);

}  // namespace ember::worker
