// PsService: a shard's request handling over the wire format: pull (values, or values
// and optimizer state), push-grad, push-value, commit. Bad requests (unknown keys, wrong
// sizes) get an error reply, never a crash.
//
// Payloads:
//   kPull       keys[n]                          -> kPullReply values[n * dim]
//               (flags & kWithState: values[n * (dim + state)])
//   kPushGrad   keys[n] then trainer counts[n] (2n keys), values[n * dim] gradients of
//               the header's iteration -> kAck
//   kPushValue  keys[n], values[n * (dim + state)] -> kAck
//   kCommit     (empty) -> kAck, flags = rows updated (acknowledged before they are
//               applied; each handler thread then applies the rows it received once its
//               next ack is sent, through Scratch::after_reply, or the store's applier
//               does (CommitApply); requests that read them apply or wait for them);
//               every `checkpoint_every` iterations the first commit's rows go to the
//               applier and the shard checkpoints once (at the iteration boundary, once
//               they are applied, before that commit is acknowledged); so does a commit
//               with flags & kCommitCheckpoint (workers that flushed the rows they own
//               for it), and the first commit of an iteration asked for on command
//               (request_checkpoint). While such a checkpoint is ahead, the ack's
//               iteration is its iteration (else the commit's own), so the workers learn
//               it in time to flush for it, and the ack's flags carry kAckStop when the
//               job is to stop after it (request_stop, or a commit flagged kCommitStop).
// A pull for iteration t > 0 is refused unless commit(t) came first: under BSP the rows
// of t must include every update of t - 1 (workers commit after the sync barrier).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ember/ps/checkpoints.h"
#include "ember/ps/shard_store.h"
#include "ember/transport/channel.h"

namespace ember::ps {

// A commit's flag: the workers flushed the rows they own (and their partial gradients)
// for this iteration's commit; write a checkpoint of it.
inline constexpr std::uint32_t kCommitCheckpoint = 1;
// A commit's flag: the worker sending it was asked to stop (SIGTERM/SIGINT): stop the job
// at a checkpoint, as request_stop() does. Ignored without a checkpoint directory, and
// while a checkpoint asked for without stopping is still ahead (the worker flags its
// commits until an ack names the stop).
inline constexpr std::uint32_t kCommitStop = 2;
// Iterations between a checkpoint asked for on command and the commit that writes it:
// every worker hears of it by its next commit, when its loader, which schedules up to
// 3 iterations ahead, has not yet planned the iteration it must flush after.
inline constexpr std::int64_t kCheckpointLead = 6;
// A commit ack's flag, beside the rows updated (which never reach it): the checkpoint the
// ack names is the job's last; the workers stop after committing it.
inline constexpr std::uint32_t kAckStop = 1u << 31;

inline constexpr std::uint32_t kWithState = 1;

// Where a commit's optimizer pass runs. kHandler: each row on the handler thread that
// received its gradients, right after that thread's next ack (no hand-off, nothing
// crosses cores; best where cores are few and busy). kApplier: on the
// store's applier threads (StoreConfig::apply_threads; the handler goes straight back to
// its connections and receives the next push while the last one's rows are applied:
// pays where spare cores can take the apply off the request path).
enum class CommitApply { kHandler, kApplier };

// Applier threads for an `asked` count: 0 means as many as the shard's I/O threads.
inline std::uint32_t applier_threads(std::uint32_t asked, std::uint32_t io_threads) { return asked > 0 ? asked : io_threads; }

struct CommitApplyChoice {
  CommitApply where;
  std::string why;  // for the log: "asked", or what auto saw
};
// Where commits go for `asked`: "handler", "applier", or "auto": the applier where rows
// (value and optimizer state) are 1 KB or more and the I/O and applier threads take at
// most half the cores, the handler otherwise. Measured with ember-bench ps: on a 16-core
// host, pushes of 1 KB rows reached 0.68-0.82 of raw on 4 appliers against 0.62-0.68 on
// the handler, and 256 B rows 0.55-0.66 against 0.69-0.71; on a 2-core host the handler
// did better throughout. `cores`: those the shard may run on (usable_cpus(): a shard under
// taskset or a cpuset has fewer than the host). ConfigError for another name.
CommitApplyChoice choose_commit_apply(const std::string& asked, std::uint32_t row_bytes, std::uint32_t io_threads,
                                      std::uint32_t apply_threads, unsigned cores);

class PsService {
 public:
  explicit PsService(StoreConfig config) : store_(std::move(config)) {}

  void apply_commits_on(CommitApply where) { commit_apply_ = where; }

  // Checkpoint into `dir` (a directory per checkpoint, a manifest once whole, older ones
  // pruned: checkpoints.h) after committing every iteration i with (i + 1) % every == 0
  // (0: only those asked for by a commit's flag or request_checkpoint).
  void checkpoint_every(std::uint64_t every, CheckpointDir dir) {
    checkpoint_every_ = every;
    checkpoints_.emplace(std::move(dir));
  }

  // Asks for a checkpoint at the first commit of the iteration kCheckpointLead after the
  // last committed one (or the one already asked for and still ahead: the workers may
  // be flushing for it); returns that iteration, or -1 without a checkpoint directory.
  std::int64_t request_checkpoint();
  // The same, and the job stops there: the workers flush, commit that iteration (which
  // every shard checkpoints), save their dense state and finish, as at the end of their
  // --iterations. Returns -1 without a checkpoint directory, and -2 while a checkpoint
  // asked for without stopping is still ahead (the workers may have planned past the
  // point where they could stop at it: ask again once it is written).
  std::int64_t request_stop();
  // The iteration the job stops at (-1: none asked).
  std::int64_t stop_at() const { return stop_at_.load(); }

  // The rows were restored from the checkpoint of `iteration`: the workers resuming from
  // it commit that iteration again, which must not write over that checkpoint (nor, at
  // exit, an unfinished iteration's rows over it).
  void restored_from(std::int64_t iteration) {
    restored_ = iteration;
    written_ = iteration;
  }

  // Shards that may not share the checkpoints' filesystem learn from each other when a
  // checkpoint is whole (checkpoints.h). Set before serving; none: files alone.
  void checkpoint_peers(std::optional<CheckpointPeers> peers) {
    std::lock_guard<std::mutex> lock(commit_mutex_);
    if (checkpoints_) checkpoints_->set_peers(std::move(peers));
  }
  // Writes the manifests of checkpoints the other shards have completed since this one
  // wrote its file, and prunes; cheap when none waits (the daemon calls it on its clock).
  void settle_checkpoints();

  // A transport::RequestHandler.
  // Called by several handler threads at once: the store has no global lock (see
  // shard_store.h), and commits take their rows out of the push path without one;
  // checkpoints and the committed iteration are serialized.
  void handle(const transport::Message& request, transport::OutMessage& reply, transport::Scratch& scratch);

  ShardStore& store() { return store_; }
  // Held while checkpointing; the daemon takes it for its final checkpoint.
  std::mutex& commit_mutex() { return commit_mutex_; }
  std::uint64_t rows_served() const { return rows_.load(); }
  // Periodic checkpoints written and failed, and the last iteration one was due at
  // (-1: none yet).
  std::uint64_t checkpoints_written() const { return checkpoints_written_.load(); }
  std::uint64_t checkpoint_failures() const { return checkpoint_failures_.load(); }
  std::int64_t last_checkpoint_iteration() const { return checkpointed_.load(); }
  // The iteration restored from (restored_from; -1: a checkpoint of no iteration, -2: none).
  std::int64_t restored_iteration() const { return restored_.load(); }
  // The last iteration whose checkpoint this shard wrote or restored (-1: none).
  std::int64_t last_written_checkpoint() const { return written_.load(); }
  // The highest iteration committed (-1: none).
  std::int64_t committed_iteration() const { return committed_.load(); }

 private:
  // handle() but for the apply of parked rows after the reply.
  void serve(const transport::Message& request, transport::OutMessage& reply, transport::Scratch& scratch);
  // The periodic checkpoint due after committing `iteration` (commit_mutex_ held).
  void write_checkpoint(std::uint64_t iteration);
  // The checkpoint asked for on command, while it is still ahead of every commit and
  // checkpoint (-1: none); commit_mutex_ held.
  std::int64_t asked_ahead() const;
  // request_checkpoint() and request_stop() with commit_mutex_ held.
  std::int64_t request_checkpoint_locked();
  std::int64_t request_stop_locked();

  ShardStore store_;
  std::mutex commit_mutex_;
  std::atomic<std::uint64_t> rows_{0};
  std::atomic<std::int64_t> committed_{-1};  // highest iteration committed
  std::atomic<std::int64_t> checkpointed_{-1};  // highest iteration whose checkpoint was due
  std::atomic<std::int64_t> requested_{-1};     // iteration of a checkpoint asked for (-1: none)
  std::atomic<std::int64_t> written_{-1};       // iteration of the last checkpoint written (or restored)
  std::atomic<std::int64_t> stop_at_{-1};       // the requested checkpoint is the job's last (-1: none)
  std::atomic<std::int64_t> restored_{-2};      // iteration restored from (-2: none)
  std::atomic<std::uint64_t> checkpoints_written_{0}, checkpoint_failures_{0};
  static constexpr std::int64_t kNone = -2;          // (-1 is iter-initial)
  std::atomic<std::int64_t> unsettled_{kNone};       // the newest checkpoint written, not yet whole
  CommitApply commit_apply_ = CommitApply::kHandler;
  std::uint64_t checkpoint_every_ = 0;
  std::optional<CheckpointDir> checkpoints_;
};

}  // namespace ember::ps
