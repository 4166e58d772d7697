#include "checkpoint_requests.h"

#include <spdlog/spdlog.h>

#include "ember/common/error.h"
#include "ember/ps/job_config.h"
#include "ember/ps/protocol.h"

namespace ember::worker {

std::uint32_t CheckpointRequests::commit_flags(bool checkpoint) {
  std::uint32_t flags = checkpoint ? ps::kCommitCheckpoint : 0;
  // Every commit says so until a shard names the stop (one flushing for a checkpoint
  // asked for earlier names it once that is written).
  if (stop_ != nullptr && stop_->signal.load() != 0 && stop_at_.load() == 0) {
    if (stop_commits_++ == 0) spdlog::info("worker {}: asking the PS shards to stop the job at a checkpoint", rank_);
    if (stop_commits_ > 2 * ps::kCheckpointLead) {
      throw Error("signal " + std::to_string(stop_->signal.load()) +
                  " asked this worker to stop the job at a checkpoint, but no PS shard named one in " + std::to_string(stop_commits_ - 1) +
                  " commits");
    }
    flags |= ps::kCommitStop;
  }
  return flags;
}

void CheckpointRequests::heard(const CommitNews& news) {
  for (const std::uint64_t at : news.checkpoints_at) {
    if (asked_.add(at) && rank_ == 0) {
      spdlog::info("a PS shard asked for a checkpoint at iteration {}: the workers flush after iteration {}", at, at - 1);
    }
  }
  if (const std::uint64_t at = news.stop_at; at > 0 && (stop_at_.load() == 0 || at < stop_at_.load())) {
    stop_at_ = at;
    if (rank_ == 0) spdlog::info("the job was asked to stop: the workers stop after iteration {}, once it is checkpointed", at - 1);
  }
}

}  // namespace ember::worker
