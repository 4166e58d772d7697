#include "ember/ps/checkpoint_coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "ember/common/process.h"

namespace ember::ps {

void CheckpointCoordinator::checkpoint_every(std::uint64_t every, CheckpointDir dir, std::uint32_t full_every) {
  schedule_ = CheckpointSchedule(every);
  dir_.emplace(std::move(dir));
  full_every_ = std::max<std::uint32_t>(full_every, 1);
}

void CheckpointCoordinator::set_peers(std::optional<CheckpointPeers> peers) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (dir_) dir_->set_peers(std::move(peers));
}

bool CheckpointCoordinator::due_at_commit(std::uint64_t iteration, std::uint32_t flags) const {
  const auto it = static_cast<std::int64_t>(iteration);
  return dir_.has_value() && it > checkpointed_.load() && it != restored_.load() &&
         (schedule_.checkpoints_at_commit(iteration) || (flags & kCommitCheckpoint) != 0 || it == requested_.load());
}

void CheckpointCoordinator::committed(std::uint64_t iteration, std::uint32_t flags, bool due, CommitAck& ack) {
  const auto it = static_cast<std::int64_t>(iteration);
  std::lock_guard<std::mutex> lock(mutex_);
  // Published after the rows left the push path: a pull of this iteration sees them.
  committed_ = std::max(committed_.load(), it);
  store_.end_lending(iteration);  // rows prefetched for it may be updated again
  if (due && it > checkpointed_.load()) {
    checkpointed_ = it;  // this iteration's, written or not: once
    write_at_commit(iteration);
  }
  // A worker asked to stop: after this commit, so the stop is a lead past it.
  if ((flags & kCommitStop) != 0 && dir_ && stop_at_.load() < 0) {
    if (const std::int64_t at = request_stop_locked(); at >= 0) {
      spdlog::info("a worker was asked to stop (a signal): the job stops at iteration {}, whose checkpoint holds the model", at);
    }
  }
  // A checkpoint asked for on command and still ahead: the workers learn when, and
  // whether the job stops there.
  if (const std::int64_t asked = requested_.load(); asked > it && asked > checkpointed_.load()) {
    ack.checkpoint_at = static_cast<std::uint64_t>(asked);
    ack.stop = stop_at_.load() == asked;
  }
}

std::int64_t CheckpointCoordinator::request_checkpoint() {
  if (!dir_) return -1;
  std::lock_guard<std::mutex> lock(mutex_);
  return request_checkpoint_locked();
}

std::int64_t CheckpointCoordinator::asked_ahead() const {
  const std::int64_t asked = requested_.load();
  return asked > committed_.load() && asked > checkpointed_.load() ? asked : -1;
}

std::int64_t CheckpointCoordinator::request_checkpoint_locked() {
  if (const std::int64_t asked = asked_ahead(); asked >= 0) return asked;
  const std::int64_t at = std::max<std::int64_t>(committed_.load(), 0) + kCheckpointLead;
  requested_ = at;
  return at;
}

std::int64_t CheckpointCoordinator::request_stop() {
  if (!dir_) return -1;
  // Under the lock that commit acks are written under: an ack that names the iteration
  // also says the job stops there.
  std::lock_guard<std::mutex> lock(mutex_);
  return request_stop_locked();
}

std::int64_t CheckpointCoordinator::request_stop_locked() {
  if (const std::int64_t asked = asked_ahead(); asked >= 0 && stop_at_.load() != asked) return -2;
  const std::int64_t at = request_checkpoint_locked();
  stop_at_ = at;
  return at;
}

void CheckpointCoordinator::write_at_commit(std::uint64_t iteration) {
  if (const std::size_t waiting = store_.pending(); waiting > 0) {
    spdlog::warn("iteration {}: checkpoint skipped, {} rows await gradients from other workers", iteration, waiting);
    return;
  }
  const auto it = static_cast<std::int64_t>(iteration);
  std::filesystem::path file;
  // Incremental on the last one written, while the chain is shorter than full_every and
  // that file is still there.
  std::optional<std::int64_t> base;
  if (full_every_ > 1 && saved_ != kNone && since_whole_ + 1 < full_every_) {
    std::error_code ec;
    if (std::filesystem::exists(checkpoint_dir(dir_->root(), saved_) / dir_->file_name(), ec)) base = saved_;
  }
  const Stopwatch took;
  try {
    file = dir_->file_for(it);
    store_.save(file, it, ShardStore::Unapplied::kRefuse, base);
  } catch (const std::exception& e) {
    // The commit stands and the earlier checkpoints are intact (files are written whole):
    // training goes on, and the next checkpoint iteration tries again.
    ++checkpoint_failures_;
    spdlog::error("iteration {}: checkpoint into {} failed: {}", iteration, dir_->root().string(), e.what());
    std::error_code ec;
    if (!file.empty()) std::filesystem::remove(file.parent_path(), ec);  // its directory, if nothing is in it
    return;
  }
  ++checkpoints_written_;
  written_ = it;
  saved_ = it;
  since_whole_ = base ? since_whole_ + 1 : 0;
  if (base) ++incremental_written_;
  {
    std::error_code ec;
    const std::uint64_t bytes = std::filesystem::file_size(file, ec);
    std::lock_guard<std::mutex> lock(cost_mutex_);
    Cost& c = base ? incremental_cost_ : whole_cost_;
    ++c.count;
    c.bytes += ec ? 0 : bytes;
    c.seconds += took.seconds();
  }
  bool whole = false;
  try {
    whole = dir_->finish(it);
  } catch (const std::exception& e) {  // the file is written; the manifest or pruning is not
    spdlog::warn("iteration {}: checkpoint written to {}, but: {}", iteration, file.string(), e.what());
    return;
  }
  if (!whole && dir_->has_peers()) unsettled_ = it;  // the last shard's word may come later
  prune_pending_ = dir_->pruning_pending();
  spdlog::info("iteration {}: checkpoint written to {}{}{}", iteration, file.string(),
               base ? " (incremental, on iteration " + std::to_string(*base) + "'s)" : "",
               whole ? " (every shard's file is in: manifest written)" : "");
}

void CheckpointCoordinator::settle() {
  if (unsettled_.load() == kNone && !prune_pending_.load()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::int64_t it = unsettled_.load();
  if (!dir_) return;
  try {
    if (it == kNone) {
      dir_->settle_pruning();
    } else if (dir_->settle(it)) {
      unsettled_ = kNone;
      spdlog::info("iteration {}: every shard's checkpoint file is written: manifest written", it);
    }
  } catch (const std::exception& e) {
    unsettled_ = kNone;  // said once; the next checkpoint tries again
    spdlog::warn("iteration {}: checkpoint manifest or pruning failed: {}", it, e.what());
  }
  prune_pending_ = dir_->pruning_pending();  // whether the next call must look again
}

void CheckpointCoordinator::write_exit_checkpoint(CheckpointDir dir, const ExitWait& wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::int64_t iteration = committed_.load();
  // Written at that commit (periodic, SIGUSR1, or the workers' last, after their final
  // flush): rows written back since belong to an unfinished iteration, and must not
  // replace it.
  const bool kept = iteration >= 0 && iteration == written_.load();
  bool whole = false;
  std::filesystem::path file;
  if (kept) {
    whole = dir.settle(iteration);
  } else {
    // Stopped mid-iteration, gradients pushed since the last commit are not in the rows
    // yet: the checkpoint holds the rows as of that commit, and says which it is.
    bool failed = false;
    try {
      file = dir.file_for(iteration);
      if (const std::size_t left_out = store_.save(file, iteration, ShardStore::Unapplied::kLeaveOut); left_out > 0) {
        spdlog::warn("final checkpoint: {} rows' gradients pushed after iteration {}'s commit are left out", left_out, iteration);
      }
    } catch (const std::exception& e) {
      // The job's work is done and the earlier checkpoints are whole (files are written
      // whole, then renamed): a warning, counted in the summary, not a failed job.
      ++exit_failures_;
      failed = true;
      spdlog::error("final checkpoint of iteration {} not written: {}; the newest whole checkpoint before it stays", iteration, e.what());
    }
    if (wait.in_job) {
      spdlog::warn(
          "final checkpoint of iteration {}: written while the workers may still hold rows they own (herald-style "
          "policies flush them for periodic and SIGUSR1 checkpoints, for a stop by a single SIGTERM with --checkpoint-on-exit, "
          "and at the end): restore one of those to resume with the BSP model",
          iteration);
    }
    if (!failed) whole = dir.finish(iteration);
  }
  // The other shards write theirs now too: wait a little for their word.
  for (Stopwatch waited; wait.job_alive && !whole && !wait.job_failed(); std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
    whole = dir.settle(iteration);
    if (waited.seconds() >= wait.limit_s()) break;
  }
  spdlog::info("{} ({} rows, iteration {}){}",
               kept ? "final checkpoint: iteration " + std::to_string(iteration) + "'s was written at its commit, kept as it is"
                    : "checkpoint written: " + file.string(),
               store_.initialized_rows(), iteration,
               whole ? "; every shard's file is in: manifest written"
                     : (wait.job_alive ? "; not every shard said it wrote this iteration's: no manifest" : ""));
}

}  // namespace ember::ps
