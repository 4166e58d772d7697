// CheckpointCoordinator: a shard's checkpoint state in one place. It knows the committed
// iteration, when a checkpoint is due (ember-ps --checkpoint-every, a commit flagged
// kCommitCheckpoint, one asked for on command), writes it at that commit, learns from the
// other shards when one is whole and prunes (CheckpointDir, CheckpointPeers), plans a stop
// at a checkpoint, writes the exit checkpoint, and counts what it wrote and what failed.
//
// The commit path (PsService) asks due_at_commit() before taking the commit's rows (a
// checkpoint's go to the applier, which save() waits for), then committed() under the
// commit lock: the iteration is published, the checkpoint written when due, and the ack
// names a checkpoint still ahead and whether the job stops there.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>

#include "ember/common/checkpoint_schedule.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/job_config.h"
#include "ember/ps/protocol.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {

class CheckpointCoordinator {
 public:
  explicit CheckpointCoordinator(ShardStore& store) : store_(store) {}

  // Checkpoint into `dir` at every commit the schedule names (none with every = 0), and
  // at those asked for by a commit's flag or request_checkpoint. With full_every > 1 (the
  // store tracks changes), one checkpoint in full_every is whole and those between are
  // incremental: the rows changed since the one before, on it (the first after a start
  // or a failure is whole).
  void checkpoint_every(std::uint64_t every, CheckpointDir dir, std::uint32_t full_every = 1);
  bool enabled() const { return dir_.has_value(); }

  // See PsService::request_checkpoint, request_stop, stop_at, restored_from.
  std::int64_t request_checkpoint();
  std::int64_t request_stop();
  std::int64_t stop_at() const { return stop_at_.load(); }
  void restored_from(std::int64_t iteration) {
    restored_ = iteration;
    written_ = iteration;
  }
  // The other shards' word on whole checkpoints (checkpoints.h); none: files alone.
  void set_peers(std::optional<CheckpointPeers> peers);
  // Manifests of checkpoints completed elsewhere since this shard wrote its file, and
  // pruning; cheap when none waits.
  void settle();

  // Whether the commit of `iteration` with these request flags writes a checkpoint.
  bool due_at_commit(std::uint64_t iteration, std::uint32_t flags) const;
  // The commit of `iteration` took its rows (`due`: what due_at_commit said): publishes
  // the iteration, ends the lending of rows prefetched for it, writes the checkpoint when
  // due, takes a worker's stop (kCommitStop), and names in `ack` a checkpoint still ahead.
  void committed(std::uint64_t iteration, std::uint32_t flags, bool due, CommitAck& ack);

  // The exit checkpoint (ember-ps --checkpoint-on-exit), under the commit lock: kept if
  // the last commit's was written, else the rows as of that commit; then `dir`'s
  // manifest, waiting up to wait.limit_s() for the other shards' word (with a job alive,
  // until it fails). Logs what it did; a failed write is counted, not thrown.
  struct ExitWait {
    bool job_alive = false;  // peers to hear from (then `dir` has them)
    bool in_job = false;     // workers may still hold rows they own
    std::function<bool()> job_failed;
    std::function<double()> limit_s;  // asked again at each look
  };
  void write_exit_checkpoint(CheckpointDir dir, const ExitWait& wait);

  // Held while checkpointing and while a commit is published; the exit checkpoint too.
  std::mutex& mutex() { return mutex_; }
  std::int64_t committed_iteration() const { return committed_.load(); }
  std::uint64_t written() const { return checkpoints_written_.load(); }
  // Checkpoints at commits that failed (the exit checkpoint's apart: exit_failures()).
  std::uint64_t failures() const { return checkpoint_failures_.load(); }
  std::uint64_t exit_failures() const { return exit_failures_.load(); }
  std::uint64_t incremental_written() const { return incremental_written_.load(); }
  // What the checkpoints written at commits cost, whole ones and incremental ones apart.
  struct Cost {
    std::uint64_t count = 0, bytes = 0;
    double seconds = 0;
  };
  Cost whole_cost() const {
    std::lock_guard<std::mutex> lock(cost_mutex_);
    return whole_cost_;
  }
  Cost incremental_cost() const {
    std::lock_guard<std::mutex> lock(cost_mutex_);
    return incremental_cost_;
  }
  std::int64_t last_due() const { return checkpointed_.load(); }
  std::int64_t restored_iteration() const { return restored_.load(); }
  std::int64_t last_written() const { return written_.load(); }

 private:
  // The checkpoint due after committing `iteration` (mutex_ held).
  void write_at_commit(std::uint64_t iteration);
  // The checkpoint asked for on command, while it is still ahead of every commit and
  // checkpoint (-1: none); mutex_ held.
  std::int64_t asked_ahead() const;
  std::int64_t request_checkpoint_locked();
  std::int64_t request_stop_locked();

  ShardStore& store_;
  std::mutex mutex_;
  std::atomic<std::int64_t> committed_{-1};     // highest iteration committed
  std::atomic<std::int64_t> checkpointed_{-1};  // highest iteration whose checkpoint was due
  std::atomic<std::int64_t> requested_{-1};     // iteration of a checkpoint asked for (-1: none)
  std::atomic<std::int64_t> written_{-1};       // iteration of the last checkpoint written (or restored)
  std::atomic<std::int64_t> stop_at_{-1};       // the requested checkpoint is the job's last (-1: none)
  std::atomic<std::int64_t> restored_{-2};      // iteration restored from (-2: none)
  std::atomic<std::uint64_t> checkpoints_written_{0}, checkpoint_failures_{0}, exit_failures_{0}, incremental_written_{0};
  // The checkpoint directory waits for the workers' word to prune (settle).
  std::atomic<bool> prune_pending_{false};
  static constexpr std::int64_t kNone = -2;     // (-1 is iter-initial)
  std::atomic<std::int64_t> unsettled_{kNone};  // the newest checkpoint written, not yet whole
  CheckpointSchedule schedule_;
  std::optional<CheckpointDir> dir_;
  // Incremental checkpoints (checkpoint_every's full_every): the last checkpoint this
  // process wrote at a commit (kNone: none yet, so the next is whole) and how many
  // incremental ones since the last whole one. mutex_ held.
  std::uint32_t full_every_ = 1;
  mutable std::mutex cost_mutex_;  // guards the costs (read by the stats while a checkpoint is written)
  Cost whole_cost_, incremental_cost_;
  std::int64_t saved_ = kNone;
  std::uint32_t since_whole_ = 0;
};

}  // namespace ember::ps
