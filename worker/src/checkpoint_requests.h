// Checkpoints and stops asked for while the job runs. The PS shards name them in their
// commit acknowledgements: a checkpoint asked for on command (SIGUSR1 to a shard) at an
// iteration far enough ahead for the loaders to flush before it, and a stop at such a
// checkpoint (SIGTERM to a shard). A worker asked to stop (TrainConfig::stop, its own
// SIGTERM) flags its commits kCommitStop until a shard names the stop.
#pragma once

#include <atomic>
#include <cstdint>

#include "ember/worker/trainer.h"
#include "loader.h"
#include "ps_exchange.h"

namespace ember::worker {

class CheckpointRequests {
 public:
  CheckpointRequests(StopRequest* stop, std::uint32_t rank) : stop_(stop), rank_(rank) {}

  // The flags of the next commit: kCommitCheckpoint with `checkpoint` (this worker
  // flushed for a checkpoint of that iteration), kCommitStop while a stop is asked of
  // this worker and no shard has named it. Throws Error when none did for too long.
  std::uint32_t commit_flags(bool checkpoint);
  // What a commit's acknowledgements named.
  void heard(const CommitNews& news);

  // For the loader.
  const AskedCheckpoints& asked() const { return asked_; }
  const std::atomic<std::uint64_t>& stop_at() const { return stop_at_; }

 private:
  StopRequest* stop_;
  std::uint32_t rank_;
  AskedCheckpoints asked_;
  std::atomic<std::uint64_t> stop_at_{0};  // the job stops after stop_at - 1 (0: not asked)
  std::uint64_t stop_commits_ = 0;         // commits flagged kCommitStop
};

}  // namespace ember::worker
