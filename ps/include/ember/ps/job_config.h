// What the PS shards and the workers of one job must agree on, and both read from here:
// the job configuration shard 0 publishes on the control plane, and the rule of when the
// PS checkpoints (the shards write the checkpoints; the workers flush the rows they own
// before each, so that it holds the model BSP training has at that point).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ember/common/checkpoint_schedule.h"
#include "ember/ps/sparse_optimizer.h"

namespace ember::ps {

// Iterations between a checkpoint asked for on command and the commit that writes it:
// every worker hears of it by its next commit, when its loader, which schedules up to
// 3 iterations ahead, has not yet planned the iteration it must flush after.
inline constexpr std::int64_t kCheckpointLead = 6;

// The periodic checkpoints' rule (common/checkpoint_schedule.h), shared with ember-sim.
using ::ember::CheckpointSchedule;

// The control-plane key shard 0 publishes the JobConfig under.
inline constexpr const char* kJobConfigKey = "ps_config";

// A job's checkpoints on the control plane's board. A checkpoint is whole for the job
// when the shards' part is (every shard's file written: its manifest) and every worker
// wrote its dense state of that iteration (or keeps none); shards and workers prune by
// that, so that neither deletes the files of the last checkpoint the job can resume.
//   checkpoint/IT/SHARD  a shard's record of its file (CheckpointPeers)
//   whole/IT             the shards' part is whole (published by a shard that saw it)
//   dense/IT/WORKER      "written", "failed", or "none" (no --checkpoint-dir)
std::string checkpoint_record_key(std::int64_t iteration, std::uint32_t shard);
std::string shards_whole_key(std::int64_t iteration);
std::string dense_state_key(std::int64_t iteration, std::uint32_t worker);
// Each shard's restored iteration (-1: none), posted at join: shards restored from
// different checkpoints (each choosing from its own directory, one host's file corrupt)
// would serve rows of different iterations, so shard 0 compares them.
std::string restored_key(std::uint32_t shard);
// Why shards 0 .. shards - 1 cannot serve one job, by their posted iterations (`lookup`
// waits for each), or nothing when they restored the same one.
std::optional<std::string> restored_disagree(const std::function<std::string(const std::string&)>& lookup, std::uint32_t shards);
// Whether every one of `workers` reported a dense state of `iteration` that a resume
// can use ("written" or "none"), by `lookup` (which must not wait: unknown is false).
bool dense_states_ok(const std::function<std::optional<std::string>(const std::string&)>& lookup, std::int64_t iteration,
                     std::uint32_t workers);

// What the PS shards serve, published by shard 0 for the workers to check against their
// data and to follow. JSON whose keys do not change, so that workers and shards of
// different builds read each other's (keys that are absent take the defaults below).
struct JobConfig {
  std::uint64_t num_keys = 0;  // rows of all tables
  std::uint32_t dim = 0;
  OptimizerConfig optimizer;  // the sparse optimizer's kind, lr and weight_decay (the rest: defaults)
  std::uint64_t seed = 0;     // initial rows from (seed, key)
  std::uint32_t shards = 1;
  std::string transport = "tcp";         // the data plane's name (transport.h)
  std::uint64_t checkpoint_every = 0;    // CheckpointSchedule; absent: 0
  bool checkpoints = false;              // the PS has a checkpoint directory (also: on command); absent: checkpoint_every > 0
  std::int64_t restored_iteration = -1;  // the checkpoint the PS restored (-1: none, or one of no iteration); absent: -1
  bool disk_tier = false;                // the shards keep rows on disk: workers send hints (protocol.h kHint); absent: false

  CheckpointSchedule schedule() const { return CheckpointSchedule(checkpoint_every); }

  std::string to_json() const;
  // ProtocolError "the PS published a malformed configuration: ..." for text that is not
  // such JSON (a required key absent, a value of the wrong type, an unknown optimizer).
  static JobConfig from_json(const std::string& text);
};

}  // namespace ember::ps
