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
  static const char* const names[kKinds] = {"pull", "pull_state", "prefetch", "push_grad", "push_value", "commit", "read", "hint", "reset"};
  return kind >= 0 && kind < kKinds ? names[kind] : "unknown";
}

void PsService::handle(const transport::Message& req, transport::OutMessage& reply, transport::Scratch& scratch) {
  serve(req, reply, scratch);
  count(req.header, reply);  // once answered (a refusal throws past this)
}

void PsService::count(const transport::MessageHeader& h, const transport::OutMessage& reply) {
  // Relaxed: totals for monitoring.
  int kind = -1;
  std::uint64_t rows = 0;
  switch (h.type) {
    case MessageType::kPull:
      kind = (h.flags & kHint) != 0        ? ServedCounts::kHint
             : (h.flags & kRead) != 0      ? ServedCounts::kRead
             : (h.flags & kPrefetch) != 0  ? ServedCounts::kPrefetch
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
    case MessageType::kResetRows:
      kind = ServedCounts::kReset, rows = h.key_count / 2;
      break;
    default:
      return;
  }
  auto& k = served_.kinds[kind];
  constexpr auto relaxed = std::memory_order_relaxed;
  k.requests.fetch_add(1, relaxed);
  k.rows.fetch_add(rows, relaxed);
  k.bytes_in.fetch_add(transport::kHeaderBytes + h.payload_bytes(), relaxed);
  k.bytes_out.fetch_add(transport::kHeaderBytes + 8ull * reply.key_count + 4ull * reply.value_count, relaxed);
}

void PsService::serve(const transport::Message& req, transport::OutMessage& reply, transport::Scratch& scratch) {
  switch (req.header.type) {
    case MessageType::kPull:
      return serve_pull(req, reply, scratch);
    case MessageType::kPushGrad:
      return serve_push_grad(req, reply);
    case MessageType::kPushValue:
      return serve_push_value(req, reply);
    case MessageType::kCommit:
      return serve_commit(req, reply);
    case MessageType::kResetRows:
      return serve_reset_rows(req, reply);
    default:
      throw ProtocolError(std::string("a PS does not serve ") + transport::type_name(req.header.type) + " requests");
  }
}

void PsService::serve_pull(const transport::Message& req, transport::OutMessage& reply, transport::Scratch& scratch) {
  const auto& h = req.header;
  const bool with_state = (h.flags & kWithState) != 0;
  const std::uint32_t per = with_state ? store_.row_floats() : store_.config().dim;
  if (h.value_count != 0) throw ProtocolError("pull with values");
  const std::int64_t committed = checkpoints_.committed_iteration();
  std::span<const Key> keys(req.keys, h.key_count);
  if ((h.flags & kHint) != 0) {
    if ((h.flags & ~kHint) != 0) throw ProtocolError("a hint with other pull flags");
    store_.hint(keys, h.iteration);
    reply.header.type = MessageType::kPullReply;
    reply.header.flags = h.flags;
    return;
  }
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
  if (store_.tiered()) {
    // Rows on a disk tier move between memory and disk: copied while pinned.
    scratch.values.resize(static_cast<std::size_t>(h.key_count) * per);
    if (with_state)
      store_.pull_with_state(keys, scratch.values.data());
    else
      store_.pull(keys, scratch.values.data());
    reply.values = scratch.values.data();
    return;
  }
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
}

void PsService::serve_push_grad(const transport::Message& req, transport::OutMessage& reply) {
  const auto& h = req.header;
  const std::uint32_t dim = store_.config().dim;
  if (h.key_count % 2 != 0) throw ProtocolError("push-grad: keys must be followed by one trainer count each");
  const std::uint32_t n = h.key_count / 2;
  if (h.value_count != static_cast<std::uint64_t>(n) * dim) {
    throw ProtocolError("push-grad: " + std::to_string(h.value_count) + " values for " + std::to_string(n) + " rows of dim " +
                        std::to_string(dim));
  }
  // Each count: the row's trainers in its low 32 bits and, from a host that summed
  // several of them (per-host aggregation), the share this gradient sums and the host
  // (0: one, none). protocol.h. One group per request: a request comes from one host.
  thread_local std::vector<std::uint32_t> trainers, shares;  // reused: no allocation per request
  trainers.resize(n);
  shares.clear();
  std::uint32_t group = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto [count, share, g] = decode_trainers(req.keys[n + i]);
    if (count > ShardStore::kMaxTrainers)
      throw ProtocolError("push-grad: trainer count " + std::to_string(count) + " is not a worker count");
    if (i == 0) group = g;
    if (g != group)
      throw ProtocolError("push-grad: rows of hosts " + std::to_string(group) + " and " + std::to_string(g) + " in one request");
    trainers[i] = count;
    if (share > 1 && shares.empty()) shares.assign(n, 1);
    if (!shares.empty()) shares[i] = std::max<std::uint32_t>(share, 1);
  }
  // The gradients stay in the request's payload where the transport lends it (TCP).
  store_.push_grad(h.iteration, std::span<const Key>(req.keys, n), trainers, req.values, req.lend_payload ? req.lend_payload() : nullptr,
                   shares, group);
  reply.header.type = MessageType::kAck;
}

void PsService::serve_push_value(const transport::Message& req, transport::OutMessage& reply) {
  const auto& h = req.header;
  const std::uint32_t rf = store_.row_floats();
  if (h.value_count != static_cast<std::uint64_t>(h.key_count) * rf) {
    throw ProtocolError("push-value: " + std::to_string(h.value_count) + " values for " + std::to_string(h.key_count) + " rows of " +
                        std::to_string(rf) + " floats");
  }
  store_.push_value(std::span<const Key>(req.keys, h.key_count), req.values);
  reply.header.type = MessageType::kAck;
}

void PsService::serve_commit(const transport::Message& req, transport::OutMessage& reply) {
  const auto& h = req.header;
  reply.header.type = MessageType::kAck;
  // Every worker commits each iteration; the first commit of a checkpoint iteration
  // writes it. Until it is written that worker is not acknowledged and the others'
  // commits wait on the commit lock, so no worker has gone on to the next iteration.
  const bool checkpoint = checkpoints_.due_at_commit(h.iteration, h.flags);
  if (auto tier = store_.tier_stats()) {
    // At the first commit of a job's last iteration every push is in (the final flush's
    // are behind a barrier) and no worker has read past them (the evaluation, the dump).
    std::lock_guard lock(tier_mutex_);
    if (!tier_at_commit_ || h.iteration > tier_iteration_) tier_iteration_ = h.iteration, tier_at_commit_ = *tier;
  }
  CommitAck ack;
  if (checkpoint || commit_apply_ == CommitApply::kApplier) {
    // (A checkpoint waits for every apply in flight: this one goes to the applier.)
    ack.rows_updated = store_.commit_async();
  } else {
    // Acknowledged before the rows are applied: each handler thread applies the rows it
    // received once it has sent its next ack (after_reply()); a pull of the next
    // iteration applies or waits for the rows it reads (see shard_store.h).
    ack.rows_updated = store_.commit_deferred();
  }
  apply_resets(h.iteration);  // after the updates taken above, before any pull of this iteration
  checkpoints_.committed(h.iteration, h.flags, checkpoint, ack);
  encode_commit_ack(ack, reply.header);
}

void PsService::serve_reset_rows(const transport::Message& req, transport::OutMessage& reply) {
  const auto& h = req.header;
  if (h.key_count % 2 != 0 || h.value_count != 0) {
    throw ProtocolError("reset-rows: " + std::to_string(h.key_count) + " keys and " + std::to_string(h.value_count) +
                        " values (slots, then their ids; no values)");
  }
  const std::uint32_t n = h.key_count / 2;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (!store_.owns(req.keys[i])) throw ProtocolError("reset-rows: slot " + std::to_string(req.keys[i]) + " is not this shard's");
  }
  // (A resumed job sends its first iteration's again: the same rows, reset alike.)
  std::lock_guard lock(resets_mutex_);
  Resets& r = resets_[h.iteration];
  r.slots.insert(r.slots.end(), req.keys, req.keys + n);
  r.ids.insert(r.ids.end(), req.keys + n, req.keys + 2 * n);
  reply.header.type = MessageType::kAck;
}

void PsService::apply_resets(std::uint64_t iteration) {
  std::lock_guard lock(resets_mutex_);
  while (!resets_.empty() && resets_.begin()->first <= iteration) {
    const Resets& r = resets_.begin()->second;
    store_.reset_rows(resets_.begin()->first, r.slots, r.ids);
    resets_.erase(resets_.begin());
  }
}

}  // namespace ember::ps
