// The flags ember-ps shares with ember-worker besides the job connection
// (transport/job_connection_options.h), declared once (common/option_registry.h): the
// rows' settings, which a shard serves and ember-worker --reference trains with (a job's
// workers take the shards'), and how many checkpoints each keeps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/common/option_registry.h"

namespace ember::ps {

struct RowSettings {
  std::uint32_t dim = 16;         // StoreConfig::dim
  std::string optimizer = "sgd";  // parse_optimizer's names
  float lr = 0.01f;               // OptimizerConfig::lr
};

// --dim, --optimizer, --lr.
const std::vector<OptionDecl<RowSettings>>& row_options();

// --keep-checkpoints, bound to each daemon's own field: a shard prunes its checkpoint
// files by it (CheckpointDir), a worker its dense states (both count the checkpoints
// whole for the job).
template <class Cfg, class Base, class T>
OptionDecl<Cfg> keep_checkpoints_option(T Base::*member) {
  return field_option<Cfg>(
      "--keep-checkpoints", member,
      "keep this process's files of the newest N checkpoints whole for the job, and of newer ones (a shard: its rows, and "
      "the older ones an incremental checkpoint kept adds to; a worker: its dense state); remove the rest (0: keep all)",
      kWorkerProgram | kPsProgram);
}

}  // namespace ember::ps
