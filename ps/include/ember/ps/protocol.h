// The PS wire protocol on top of the message format (transport/message.h): what each
// request and reply carries between a worker's PsClient and a shard's PsService, and what
// the header's flags and iteration mean in each.
//
// Payloads (n rows; dim value floats and `state` optimizer-state floats per row):
//   kPull       keys[n]                          -> kPullReply values[n * dim]
//               flags & kWithState: values[n * (dim + state)]; the reply echoes the flags.
//               header iteration t > 0: refused unless commit(t) came first (under BSP
//               the rows of t include every update of t - 1).
//               flags & kPrefetch: rows for iteration t pulled before commit(t), once
//               commit(t - 1) is in; refused if a row has an update not applied yet, and
//               until commit(t) any push of these rows is refused (it would change a row
//               already served for t).
//               flags & kHint: the rows a worker will pull for iteration t, sent
//               --lookahead iterations ahead -> kPullReply with no values. A shard with
//               a disk tier reads them into memory meanwhile (disk_tier.h); counted as
//               ServedCounts::kHint.
//               flags & kRead: a read outside training (an evaluation, the model dump,
//               replicated rows loaded, a resumed job's cached rows): served as any
//               pull, counted apart (ServedCounts::kRead).
//   kPushGrad   keys[n], then one trainer count per key (2n keys in all: the workers that
//               trained the row in the header's iteration), values[n * dim] gradients
//               -> kAck. A gradient a host summed over several of the row's trainers
//               (per-host aggregation) says how many in its count's bits 32-47, and
//               every gradient from an aggregating host names the host in bits 48-63
//               (encode_trainers); the row is complete once its trainers are all in.
//   kPushValue  keys[n], values[n * (dim + state)] rows written back -> kAck
//   kCommit     (empty; flags: kCommitCheckpoint, kCommitStop) -> kAck (CommitAck)
//   kResetRows  slots[n], then ids[n] (2n keys; dynamic tables, KeyDirectory): rows
//               made for new ids at iteration t (the header's), sent before commit(t)
//               -> kAck. The shard resets each slot at the first commit(t) to come,
//               after the updates it applies and before any pull of t: the row
//               initial_row(seed, id), its state as new, an aggregation of the slot's
//               old id that will never complete discarded. Id kFreeSlot: a row dropped
//               (expired or capped), its slot cleared (zeros, the state as new).
//               The workers of a job share one iteration's resets out, each slot named
//               once (the shard applies them in no set order).
// Anything refused gets kError with the reason (transport/channel.h), never a crash.
//
// commit(t) ends the sync phase of iteration t - 1 on one worker: once every worker's is
// in, the rows hold every update of t - 1 and may be pulled for t.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ember/common/types.h"
#include "ember/transport/message.h"

namespace ember::ps {

// A push-grad's count: the row's trainers, how many of them the gradient sums (1: the
// pusher's own alone, sent as 0), and the group it was summed in (0: none; per-host
// aggregation: the host, so that the shard sums a row's gradients host by host whether
// they came summed or one by one; ShardStore::push_grad).
inline constexpr std::uint32_t kMaxGroup = 0xffff;
inline std::uint64_t encode_trainers(std::uint32_t trainers, std::uint32_t share, std::uint32_t group = 0) {
  return trainers | (share > 1 ? std::uint64_t{share & 0xffff} << 32 : 0) | (std::uint64_t{group & kMaxGroup} << 48);
}
struct TrainerCount {
  std::uint32_t trainers, share, group;
};
inline TrainerCount decode_trainers(std::uint64_t count) {
  return {static_cast<std::uint32_t>(count), static_cast<std::uint32_t>((count >> 32) & 0xffff), static_cast<std::uint32_t>(count >> 48)};
}

// kResetRows' id of a slot whose row was dropped.
inline constexpr std::uint64_t kFreeSlot = kNoId;

// A pull's flag: each row with its optimizer state (for a worker that will own the row).
inline constexpr std::uint32_t kWithState = 1;
// A pull's flag: a prefetch (above).
inline constexpr std::uint32_t kPrefetch = 2;
// A pull's flag: a read outside training (above).
inline constexpr std::uint32_t kRead = 4;
// A pull's flag: a hint of rows to be pulled later (above).
inline constexpr std::uint32_t kHint = 8;

// A commit's flag: the workers flushed the rows they own (and their partial gradients)
// for this iteration's commit; write a checkpoint of it.
inline constexpr std::uint32_t kCommitCheckpoint = 1;
// A commit's flag: the worker sending it was asked to stop (SIGTERM/SIGINT): stop the job
// at a checkpoint, as PsService::request_stop() does. Ignored without a checkpoint
// directory, and while a checkpoint asked for without stopping is still ahead (the worker
// flags its commits until an ack names the stop).
inline constexpr std::uint32_t kCommitStop = 2;

// A commit ack's flag, beside the rows updated (which never reach it): the checkpoint the
// ack names is the job's last; the workers stop after committing it.
inline constexpr std::uint32_t kAckStop = 1u << 31;

// What a commit's kAck says. In the header: `flags` = the rows updated (capped below
// kAckStop's bit) | kAckStop when `stop`; `iteration` = checkpoint_at when a checkpoint
// is ahead, else the commit's own iteration (which the transport echoes).
struct CommitAck {
  // Rows the commit updated on this shard (acknowledged before they are applied).
  std::uint64_t rows_updated = 0;
  // A checkpoint asked for on command and still ahead of the commit: the iteration at
  // whose commit the shard writes it, so that the workers flush for it in time (0: none).
  std::uint64_t checkpoint_at = 0;
  // The job stops after checkpoint_at's checkpoint (only with one).
  bool stop = false;
};

// Writes `ack` into a commit reply's header.
inline void encode_commit_ack(const CommitAck& ack, transport::MessageHeader& h) {
  h.flags = static_cast<std::uint32_t>(std::min<std::uint64_t>(ack.rows_updated, kAckStop - 1)) | (ack.stop ? kAckStop : 0);
  if (ack.checkpoint_at != 0) h.iteration = ack.checkpoint_at;
}

// Reads the ack of a commit of `commit_iteration`. (A push's ack has flags 0: no rows
// updated.)
inline CommitAck decode_commit_ack(const transport::MessageHeader& h, std::uint64_t commit_iteration) {
  CommitAck ack;
  ack.rows_updated = h.flags & ~kAckStop;
  ack.checkpoint_at = h.iteration > commit_iteration ? h.iteration : 0;
  ack.stop = ack.checkpoint_at != 0 && (h.flags & kAckStop) != 0;
  return ack;
}

}  // namespace ember::ps
