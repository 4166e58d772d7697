// A worker's whole part in the job's checkpoints and stops, in one place: a resumed
// job's start (the PS's restored iteration, the dense state from checkpoint_dir), the
// commits' flags and what their acknowledgements name (checkpoints asked for on
// command, SIGUSR1 to a shard; a stop at such a checkpoint, SIGTERM to a shard or to this
// worker), the dense state written and published after each checkpoint's flush, and
// the window in which a signal to this worker stops the job at a checkpoint rather than
// ending the process. The training loop calls it at each commit and at each flush.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>

#include "checkpoint/dense_checkpoint.h"
#include "ember/worker/model.h"
#include "ember/worker/train_config.h"
#include "job/job.h"
#include "stages/loader.h"
#include "stages/ps_exchange.h"

namespace ember::worker {

class CheckpointLife {
 public:
  // Before joining: ConfigError for options that cannot go together (--resume without
  // --checkpoint-dir).
  static void check(const TrainConfig& c);
  // After joining `job`: a resumed job's first iteration (ConfigError when the PS
  // restored none, or one at or past the end), a warning when the dense state has no
  // place on the PS's checkpoints. Keeps references to both.
  CheckpointLife(const TrainConfig& c, Job& job);
  CheckpointLife(const CheckpointLife&) = delete;
  CheckpointLife& operator=(const CheckpointLife&) = delete;

  // The first iteration this worker trains (a resumed job's restored one; else 0).
  std::uint64_t first() const { return first_; }
  // A resumed job's dense model and optimizer, from checkpoint_dir (DenseCheckpoints::load).
  void restore(CtrModel& model, torch::optim::Optimizer& optimizer, torch::Device device);
  // What that checkpoint holds of dynamic tables' KeyDirectory (empty: nothing).
  const std::string& restored_directory() const { return restored_.directory; }
  // A job on a stream: where the checkpoint's stream was (empty: not saved).
  const std::string& restored_stream_position() const { return restored_.stream_position; }

  // What the loader plans by: checkpoints asked for, and the iteration the job stops at.
  const AskedCheckpoints& asked() const { return asked_; }
  const std::atomic<std::uint64_t>& stop_at() const { return stop_at_; }

  // While one lives (the training loop), a signal to this worker stops the job at a
  // checkpoint if the PS shards checkpoint and the dense state has a place here;
  // otherwise (or once ended) a signal ends the process.
  class StopWindow {
   public:
    StopWindow(StopRequest* r, bool can) : stop_(can ? r : nullptr) {
      if (stop_ != nullptr) stop_->possible = true;
    }
    ~StopWindow() { end(); }
    StopWindow(const StopWindow&) = delete;
    StopWindow& operator=(const StopWindow&) = delete;
    void end() {
      if (stop_ != nullptr) stop_->possible = false;
      stop_ = nullptr;
    }

   private:
    StopRequest* stop_;
  };
  StopWindow stop_window() const;

  // Iteration t's commit (after the workers' barrier), flagged for the checkpoint the
  // flush before it prepared and for a stop asked of this worker.
  void commit(PsExchange& exchange, std::uint64_t t);
  // The commit that follows step s's flush. The last one commits the iteration after,
  // flagged: shards with a checkpoint directory write the finished model, from which a
  // longer run can resume.
  void commit_flush(PsExchange& exchange, const Step& s);
  // After step s's flush (and worker 0's evaluation): at a checkpoint or the end, this
  // worker's dense state written and its fate published, so that shards and workers
  // prune by checkpoints whole for the job; the next commit is flagged.
  void flushed(const Step& s, CtrModel& model, torch::optim::Optimizer& optimizer);
  // After step s trained: Error when the job was asked to stop at an iteration this
  // worker learned of after planning past it (cannot happen within kCheckpointLead).
  void check_stop(const Step& s) const;

 private:
  // The flags of a commit: kCommitCheckpoint with `checkpoint`, kCommitStop while a stop
  // is asked of this worker and no shard has named it. Throws Error when none did for
  // too long.
  std::uint32_t commit_flags(bool checkpoint);
  // What a commit's acknowledgements named.
  void heard(const CommitNews& news);

  const TrainConfig& c_;
  Job& job_;
  std::uint32_t rank_;
  std::uint64_t first_ = 0;
  DenseCheckpoints dense_;
  AskedCheckpoints asked_;
  std::atomic<std::uint64_t> stop_at_{0};  // the job stops after stop_at - 1 (0: not asked)
  std::uint64_t stop_commits_ = 0;         // commits flagged kCommitStop
  bool checkpoint_commit_ = false;         // the next commit's: flushed for a checkpoint
  DenseRestore restored_;
};

}  // namespace ember::worker
