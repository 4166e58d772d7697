// PsService: a shard's request handling over the PS protocol (protocol.h): pull (values,
// or values and optimizer state), push-grad, push-value, commit. Bad requests (unknown
// keys, wrong sizes) get an error reply, never a crash.
//
// A commit is acknowledged before its rows are applied: each handler thread then applies
// the rows it received once its next ack is sent (after_reply(), which handler() hands
// the transport with handle()), or the store's applier does (CommitApply); requests that
// read them apply or wait for them.
// Checkpoints (CheckpointCoordinator, checkpoint_coordinator.h): at each commit the
// CheckpointSchedule names (ember-ps --checkpoint-every) the first commit's rows go to the
// applier and the shard checkpoints once (at the iteration boundary, once they are
// applied, before that commit is acknowledged); so does a commit flagged kCommitCheckpoint
// (workers that flushed the rows they own for it), and the first commit of an iteration
// asked for on command (request_checkpoint). While such a checkpoint is ahead, commit acks
// name it (CommitAck::checkpoint_at), so the workers learn it in time to flush for it, and
// say whether the job is to stop after it (request_stop, or a commit flagged kCommitStop).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ember/ps/checkpoint_coordinator.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/job_config.h"
#include "ember/ps/protocol.h"
#include "ember/ps/shard_store.h"
#include "ember/transport/channel.h"

namespace ember::ps {

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
// most half the cores, the handler otherwise (smaller rows cost too little to apply for a
// hand-off to pay, and without spare cores the appliers take time from the handlers;
// ember-bench ps compares the two). `cores`: those the shard may run on (usable_cpus(): a
// shard under taskset or a cpuset has fewer than the host). ConfigError for another name.
CommitApplyChoice choose_commit_apply(const std::string& asked, std::uint32_t row_bytes, std::uint32_t io_threads,
                                      std::uint32_t apply_threads, unsigned cores);

// What a shard served, per kind of request, as framed on the wire (48-byte header, 8
// bytes a key, 4 a float): requests answered (refusals not counted), rows, bytes received
// and sent. Read while serving (Prometheus, the stats file) and written at the end
// (--summary-file "served"): the rows a job really moved, by kind, which its tests
// compare with ember-sim's prediction. Pulls are counted by flag: a prefetch, with
// state, plain, or a read outside training (kRead: evaluations, dumps, loads).
struct ServedCounts {
  enum Kind { kPull, kPullState, kPrefetch, kPushGrad, kPushValue, kCommit, kRead, kHint, kReset, kKinds };
  static const char* name(int kind);
  struct PerKind {
    std::atomic<std::uint64_t> requests{0}, rows{0}, bytes_in{0}, bytes_out{0};
  };
  PerKind kinds[kKinds];
};

class PsService {
 public:
  explicit PsService(StoreConfig config) : store_(std::move(config)), checkpoints_(store_) {}

  void apply_commits_on(CommitApply where) { commit_apply_ = where; }

  // Checkpoint into `dir` (a directory per checkpoint, a manifest once whole, older ones
  // pruned: checkpoints.h) at every commit the schedule names (none with every = 0), and
  // at those asked for by a commit's flag or request_checkpoint.
  void checkpoint_every(std::uint64_t every, CheckpointDir dir, std::uint32_t full_every = 1) {
    checkpoints_.checkpoint_every(every, std::move(dir), full_every);
  }

  // Asks for a checkpoint at the first commit of the iteration kCheckpointLead after the
  // last committed one (or the one already asked for and still ahead: the workers may
  // be flushing for it); returns that iteration, or -1 without a checkpoint directory.
  std::int64_t request_checkpoint() { return checkpoints_.request_checkpoint(); }
  // The same, and the job stops there: the workers flush, commit that iteration (which
  // every shard checkpoints), save their dense state and finish, as at the end of their
  // --iterations. Returns -1 without a checkpoint directory, and -2 while a checkpoint
  // asked for without stopping is still ahead (the workers may have planned past the
  // point where they could stop at it: ask again once it is written).
  std::int64_t request_stop() { return checkpoints_.request_stop(); }
  // The iteration the job stops at (-1: none asked).
  std::int64_t stop_at() const { return checkpoints_.stop_at(); }

  // The rows were restored from the checkpoint of `iteration`: the workers resuming from
  // it commit that iteration again, which must not write over that checkpoint (nor, at
  // exit, an unfinished iteration's rows over it).
  void restored_from(std::int64_t iteration) { checkpoints_.restored_from(iteration); }

  // Shards that may not share the checkpoints' filesystem learn from each other when a
  // checkpoint is whole (checkpoints.h). Set before serving; none: files alone.
  void checkpoint_peers(std::optional<CheckpointPeers> peers) { checkpoints_.set_peers(std::move(peers)); }
  // Writes the manifests of checkpoints the other shards have completed since this one
  // wrote its file, and prunes; cheap when none waits (the daemon calls it on its clock).
  void settle_checkpoints() { checkpoints_.settle(); }

  // A transport::RequestHandler.
  // Called by several handler threads at once: the store has no global lock (see
  // shard_store.h), and commits take their rows out of the push path without one;
  // checkpoints and the committed iteration are serialized.
  void handle(const transport::Message& request, transport::OutMessage& reply, transport::Scratch& scratch);
  // The handler's work after each reply, on the thread that sent it: the rows a commit
  // parked with this thread are applied there (CommitApply::kHandler), while the client
  // no longer waits. One atomic load when there are none.
  void after_reply() {
    if (store_.deferred_here()) store_.apply_deferred_here();
  }
  // handle() and after_reply() together, for a transport's server.
  transport::ServerHandler handler() {
    return transport::ServerHandler(
        [this](const transport::Message& r, transport::OutMessage& o, transport::Scratch& s) { handle(r, o, s); },
        [this] { after_reply(); });
  }

  ShardStore& store() { return store_; }
  CheckpointCoordinator& checkpoints() { return checkpoints_; }
  // Held while checkpointing; the daemon takes it for its final checkpoint.
  std::mutex& commit_mutex() { return checkpoints_.mutex(); }
  // Rows served, all kinds together.
  std::uint64_t rows_served() const {
    std::uint64_t n = 0;
    for (const auto& k : served_.kinds) n += k.rows.load(std::memory_order_relaxed);
    return n;
  }
  const ServedCounts& served() const { return served_; }
  // Periodic checkpoints written and failed, and the last iteration one was due at
  // (-1: none yet).
  std::uint64_t checkpoints_written() const { return checkpoints_.written(); }
  std::uint64_t checkpoint_failures() const { return checkpoints_.failures(); }
  std::int64_t last_checkpoint_iteration() const { return checkpoints_.last_due(); }
  // The iteration restored from (restored_from; -1: a checkpoint of no iteration, -2: none).
  std::int64_t restored_iteration() const { return checkpoints_.restored_iteration(); }
  // The last iteration whose checkpoint this shard wrote or restored (-1: none).
  std::int64_t last_written_checkpoint() const { return checkpoints_.last_written(); }
  // The highest iteration committed (-1: none).
  std::int64_t committed_iteration() const { return checkpoints_.committed_iteration(); }
  // A disk tier's counters at the first commit of the newest iteration committed: a
  // job's training and flushes, without the reads that follow its last commit (the final
  // evaluation, the model dump). Empty without a tier, or before any commit.
  std::optional<TierStats> tier_at_last_commit() const {
    std::lock_guard lock(tier_mutex_);
    return tier_at_commit_;
  }

 private:
  // handle() but for the counting: decodes the request and calls the store.
  void serve(const transport::Message& request, transport::OutMessage& reply, transport::Scratch& scratch);
  void serve_pull(const transport::Message& request, transport::OutMessage& reply, transport::Scratch& scratch);
  void serve_push_grad(const transport::Message& request, transport::OutMessage& reply);
  void serve_push_value(const transport::Message& request, transport::OutMessage& reply);
  void serve_commit(const transport::Message& request, transport::OutMessage& reply);
  void serve_reset_rows(const transport::Message& request, transport::OutMessage& reply);
  // The resets sent for iterations up to `iteration`, applied (under resets_mutex_, so
  // that no commit of that iteration is acknowledged before they are done).
  void apply_resets(std::uint64_t iteration);
  // Counts an answered request in served_.
  void count(const transport::MessageHeader& request, const transport::OutMessage& reply);

  ShardStore store_;
  CheckpointCoordinator checkpoints_;  // uses store_
  ServedCounts served_;
  CommitApply commit_apply_ = CommitApply::kHandler;
  // Dynamic tables: the rows to reset at each iteration's first commit, by iteration.
  struct Resets {
    std::vector<Key> slots;
    std::vector<std::uint64_t> ids;
  };
  std::mutex resets_mutex_;
  std::map<std::uint64_t, Resets> resets_;
  mutable std::mutex tier_mutex_;  // the two below
  std::uint64_t tier_iteration_ = 0;
  std::optional<TierStats> tier_at_commit_;
};

}  // namespace ember::ps
