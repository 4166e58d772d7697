#include "ember/ps/ps_service.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <memory>

#include "ember/common/error.h"

namespace ember::ps {

using transport::MessageType;

CommitApplyChoice choose_commit_apply(const std::string& asked, std::uint32_t row_bytes, std::uint32_t io_threads,
                                      std::uint32_t apply_threads, unsigned cores) {
  if (asked == "handler") return {CommitApply::kHandler, "asked"};
  if (asked == "applier") return {CommitApply::kApplier, "asked"};
  if (asked != "auto") throw ConfigError("where commits are applied: '" + asked + "' (auto, handler, applier)");
  const std::uint64_t threads = std::uint64_t{io_threads} + apply_threads;
  const bool big = row_bytes >= 1024, spare = cores > 0 && 2 * threads <= cores;
  const std::string why = "auto: rows of " + std::to_string(row_bytes) + " B, " + std::to_string(threads) + " I/O and applier threads on " +
                          std::to_string(cores) + (cores == 1 ? " core" : " cores");
  return {big && spare ? CommitApply::kApplier : CommitApply::kHandler, why};
}

const char* ServedCounts::name(int kind) {
  static const char* const names[kKinds] = {"pull", "pull_state", "prefetch", "push_grad", "push_value", "commit"};
  return kind >= 0 && kind < kKinds ? names[kind] : "unknown";
}

void PsService::handle(const transport::Message& req, transport::OutMessage& reply, transport::Scratch& scratch) {
  serve(req, reply, scratch);
  {
    // Counted once answered (a refusal throws past this); relaxed: totals for monitoring.
    const auto& h = req.header;
    int kind = -1;
    std::uint64_t rows = 0;
    switch (h.type) {
      case MessageType::kPull:
        kind = (h.flags & kPrefetch) != 0    ? ServedCounts::kPrefetch
               : (h.flags & kWithState) != 0 ? ServedCounts::kPullState
                                             : ServedCounts::kPull;
        rows = h.key_count;
        break;
      case MessageType::kPushGrad:
        kind = ServedCounts::kPushGrad, rows = h.key_count / 2;
        break;
      case MessageType::kPushValue:
        kind = ServedCounts::kPushValue, rows = h.key_count;
        break;
      case MessageType::kCommit:
        kind = ServedCounts::kCommit;
        break;
      default:
        break;
    }
    if (kind >= 0) {
      auto& k = served_.kinds[kind];
      constexpr auto relaxed = std::memory_order_relaxed;
      k.requests.fetch_add(1, relaxed);
      k.rows.fetch_add(rows, relaxed);
      k.bytes_in.fetch_add(transport::kHeaderBytes + h.payload_bytes(), relaxed);
      k.bytes_out.fetch_add(transport::kHeaderBytes + 8ull * reply.key_count + 4ull * reply.value_count, relaxed);
    }
  }
  // Rows this thread received and a commit took: applied after this reply is sent, on
  // this core (their gradients are in its cache), with the client no longer waiting.
  if (store_.deferred_here()) scratch.after_reply = [this] { store_.apply_deferred_here(); };
}

void PsService::serve(const transport::Message& req, transport::OutMessage& reply, transport::Scratch& scratch) {
  const auto& h = req.header;
  const std::uint32_t dim = store_.config().dim, rf = store_.row_floats();
  switch (h.type) {
    case MessageType::kPull: {
      const bool with_state = (h.flags & kWithState) != 0;
      const std::uint32_t per = with_state ? rf : dim;
      if (h.value_count != 0) throw ProtocolError("pull with values");
      const std::int64_t committed = committed_.load();
      std::span<const Key> keys(req.keys, h.key_count);
      if ((h.flags & kPrefetch) != 0) {
        if (h.iteration == 0 || static_cast<std::int64_t>(h.iteration) > committed + 1) {
          throw ProtocolError("prefetch for iteration " + std::to_string(h.iteration) +
                              " before the commit of the one before (last committed " + std::to_string(committed) + ")");
        }
        store_.lend_ahead(keys, h.iteration);
      } else if (h.iteration > 0 && static_cast<std::int64_t>(h.iteration) > committed) {
        throw ProtocolError("pull for iteration " + std::to_string(h.iteration) + " before its commit (last committed " +
                            std::to_string(committed) + ")");
      }
      reply.header.type = MessageType::kPullReply;
      reply.header.flags = h.flags;
      reply.value_count = h.key_count * per;
      // Rows that follow each other in the store (consecutive keys) form one segment; when
      // segments are long the reply leaves straight from the store, else a copy is cheaper.
      scratch.rows.resize(h.key_count);
      store_.row_pointers(keys, scratch.rows.data());
      auto& segs = scratch.segments;
      segs.clear();
      for (const float* r : scratch.rows) transport::append_run(segs, r, per);
      if (!segs.empty() && segs.size() * transport::kMinRowsPerPiece <= h.key_count) {
        reply.value_segments = segs.data();
        reply.segment_count = static_cast<std::uint32_t>(segs.size());
      } else {
        scratch.values.resize(static_cast<std::size_t>(h.key_count) * per);
        for (std::size_t i = 0; i < scratch.rows.size(); ++i) std::memcpy(&scratch.values[i * per], scratch.rows[i], per * sizeof(float));
        reply.values = scratch.values.data();
      }
      return;
    }
    case MessageType::kPushGrad: {
      if (h.key_count % 2 != 0) throw ProtocolError("push-grad: keys must be followed by one trainer count each");
      const std::uint32_t n = h.key_count / 2;
      if (h.value_count != static_cast<std::uint64_t>(n) * dim) {
        throw ProtocolError("push-grad: " + std::to_string(h.value_count) + " values for " + std::to_string(n) + " rows of dim " +
                            std::to_string(dim));
      }
      thread_local std::vector<std::uint32_t> trainers;  // reused: no allocation per request
      trainers.resize(n);
      for (std::uint32_t i = 0; i < n; ++i) {
        if (req.keys[n + i] > ShardStore::kMaxTrainers)
          throw ProtocolError("push-grad: trainer count " + std::to_string(req.keys[n + i]) + " is not a worker count");
        trainers[i] = static_cast<std::uint32_t>(req.keys[n + i]);
      }
      // The gradients stay in the request's payload where the transport lends it (TCP).
      store_.push_grad(h.iteration, std::span<const Key>(req.keys, n), trainers, req.values,
                       req.lend_payload ? req.lend_payload() : nullptr);
      reply.header.type = MessageType::kAck;
      return;
    }
    case MessageType::kPushValue: {
      if (h.value_count != static_cast<std::uint64_t>(h.key_count) * rf) {
        throw ProtocolError("push-value: " + std::to_string(h.value_count) + " values for " + std::to_string(h.key_count) + " rows of " +
                            std::to_string(rf) + " floats");
      }
      store_.push_value(std::span<const Key>(req.keys, h.key_count), req.values);
      reply.header.type = MessageType::kAck;
      return;
    }
    case MessageType::kCommit: {
      reply.header.type = MessageType::kAck;
      // Every worker commits each iteration; the first commit of a checkpoint iteration
      // writes it. Until it is written that worker is not acknowledged and the others'
      // commits wait on commit_mutex_, so no worker has gone on to the next iteration.
      const auto it = static_cast<std::int64_t>(h.iteration);
      const bool checkpoint =
          checkpoints_.has_value() && it > checkpointed_.load() && it != restored_.load() &&
          (schedule_.checkpoints_at_commit(h.iteration) || (h.flags & kCommitCheckpoint) != 0 || it == requested_.load());
      std::uint64_t updated = 0;
      if (checkpoint || commit_apply_ == CommitApply::kApplier) {
        // (A checkpoint below waits for every apply in flight: this one goes to the applier.)
        updated = store_.commit_async();
      } else {
        // Acknowledged before the rows are applied: each handler thread applies the rows
        // it received once it has sent its next ack (handle() below); a pull of the next
        // iteration applies or waits for the rows it reads (see shard_store.h).
        updated = store_.commit_deferred();
      }
      CommitAck ack;
      ack.rows_updated = updated;
      std::lock_guard<std::mutex> lock(commit_mutex_);
      // Published after the rows left the push path: a pull of this iteration sees them.
      committed_ = std::max(committed_.load(), it);
      store_.end_lending(h.iteration);  // rows prefetched for it may be updated again
      if (checkpoint && it > checkpointed_.load()) {
        checkpointed_ = it;  // this iteration's, written or not: once
        write_checkpoint(h.iteration);
      }
      // A worker asked to stop: after this commit, so the stop is a lead past it.
      if ((h.flags & kCommitStop) != 0 && checkpoints_ && stop_at_.load() < 0) {
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
      encode_commit_ack(ack, reply.header);
      return;
    }
    default:
      throw ProtocolError(std::string("a PS does not serve ") + transport::type_name(h.type) + " requests");
  }
}

std::int64_t PsService::request_checkpoint() {
  if (!checkpoints_) return -1;
  std::lock_guard<std::mutex> lock(commit_mutex_);
  return request_checkpoint_locked();
}

std::int64_t PsService::asked_ahead() const {
  const std::int64_t asked = requested_.load();
  return asked > committed_.load() && asked > checkpointed_.load() ? asked : -1;
}

std::int64_t PsService::request_checkpoint_locked() {
  if (const std::int64_t asked = asked_ahead(); asked >= 0) return asked;
  const std::int64_t at = std::max<std::int64_t>(committed_.load(), 0) + kCheckpointLead;
  requested_ = at;
  return at;
}

std::int64_t PsService::request_stop() {
  if (!checkpoints_) return -1;
  // Under the lock that commit acks are written under: an ack that names the iteration
  // also says the job stops there.
  std::lock_guard<std::mutex> lock(commit_mutex_);
  return request_stop_locked();
}

std::int64_t PsService::request_stop_locked() {
  if (const std::int64_t asked = asked_ahead(); asked >= 0 && stop_at_.load() != asked) return -2;
  const std::int64_t at = request_checkpoint_locked();
  stop_at_ = at;
  return at;
}

void PsService::write_checkpoint(std::uint64_t iteration) {
  if (const std::size_t waiting = store_.pending(); waiting > 0) {
    spdlog::warn("iteration {}: checkpoint skipped, {} rows await gradients from other workers", iteration, waiting);
    return;
  }
  const auto it = static_cast<std::int64_t>(iteration);
  std::filesystem::path file;
  try {
    file = checkpoints_->file_for(it);
    store_.save(file, it);
  } catch (const std::exception& e) {
    // The commit stands and the earlier checkpoints are intact (files are written whole):
    // training goes on, and the next checkpoint iteration tries again.
    ++checkpoint_failures_;
    spdlog::error("iteration {}: checkpoint into {} failed: {}", iteration, checkpoints_->root().string(), e.what());
    std::error_code ec;
    if (!file.empty()) std::filesystem::remove(file.parent_path(), ec);  // its directory, if nothing is in it
    return;
  }
  ++checkpoints_written_;
  written_ = it;
  bool whole = false;
  try {
    whole = checkpoints_->finish(it);
  } catch (const std::exception& e) {  // the file is written; the manifest or pruning is not
    spdlog::warn("iteration {}: checkpoint written to {}, but: {}", iteration, file.string(), e.what());
    return;
  }
  if (!whole && checkpoints_->has_peers()) unsettled_ = it;  // the last shard's word may come later
  prune_pending_ = checkpoints_->pruning_pending();
  spdlog::info("iteration {}: checkpoint written to {}{}", iteration, file.string(),
               whole ? " (every shard's file is in: manifest written)" : "");
}

void PsService::settle_checkpoints() {
  if (unsettled_.load() == kNone && !prune_pending_.load()) return;
  std::lock_guard<std::mutex> lock(commit_mutex_);
  const std::int64_t it = unsettled_.load();
  if (!checkpoints_) return;
  try {
    if (it == kNone) {
      checkpoints_->settle_pruning();
    } else if (checkpoints_->settle(it)) {
      unsettled_ = kNone;
      spdlog::info("iteration {}: every shard's checkpoint file is written: manifest written", it);
    }
  } catch (const std::exception& e) {
    unsettled_ = kNone;  // said once; the next checkpoint tries again
    spdlog::warn("iteration {}: checkpoint manifest or pruning failed: {}", it, e.what());
  }
  prune_pending_ = checkpoints_->pruning_pending();  // whether the next call must look again
}

}  // namespace ember::ps
