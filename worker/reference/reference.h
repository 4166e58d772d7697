// The oracle: the single-process reference every job of the tests is compared with, and
// the e2e benchmark's baseline (ember-worker --reference). A library of its own
// (ember_reference), apart from the daemon's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/ps/sparse_optimizer.h"
#include "ember/worker/train_config.h"

namespace ember::worker {

// The single-process reference: the whole global batch in one process, the full
// embedding table in memory, the same initialization, data order, loss scaling and
// optimizers. The jobs of the tests are compared with it.
struct ReferenceResult {
  std::vector<float> dense;    // parameters, flattened in named_parameters order
  std::vector<float> rows;     // num_keys x dim
  std::vector<double> losses;  // per iteration
  double seconds = 0;          // training loop, wall
};
// A dataset of hashed ids (dynamic tables) is trained on the slots of `shards` PS shards
// of `slots_per_shard` each, as a job's KeyDirectory assigns them (ember-ps
// --slots-per-shard); `rows` then holds every slot's.
struct ReferenceSlots {
  std::uint32_t shards = 0;
  std::uint64_t slots_per_shard = 0;
};
ReferenceResult train_reference(const TrainConfig& config, const ps::OptimizerConfig& sparse, std::uint32_t dim, ReferenceSlots slots = {});

// Reads a dump written by worker 0 (--dump-dir): dense parameters and rows.
struct ModelDump {
  std::vector<float> dense;
  std::vector<float> rows;
  std::uint32_t dim = 0;
  std::vector<std::uint64_t> slot_ids;  // dynamic tables: each row's id (kNoId: a free slot)
};
ModelDump read_dump(const std::string& dir);

}  // namespace ember::worker
