// Per-host aggregation of row traffic (`--host-aggregation`, docs/cluster.md): the
// workers of one host send each row across hosts once per phase of an iteration.
//   - A row that several of them pull is pulled by the first of them (lowest rank) and
//     handed to the others.
//   - The gradients of a row that several of them push (sync pushes, partial evictions,
//     full-set end pushes, flushes) are handed to the first of them, which adds them to
//     its own and pushes the sum once, saying how many trainers it holds (protocol.h,
//     encode_trainers): the PS completes the row when all its trainers are in, as
//     before. Every gradient pushed names its host, summed or not, and the PS sums a
//     host's first, in the order of their bytes; a phase sums a host's gradients of a
//     row only when it holds all of them (scheduler/host_parts.h), in that same order,
//     so the sum does not depend on which phase a gradient left in (docs/checkpoints.md,
//     flushes under per-host aggregation).
// Only rows whose PS shard runs on another host travel this way; values (write-backs,
// dirty evictions) have one sender and go as before. Every worker runs the same
// scheduler, so each knows every plan of its host, and with them what it sends to and
// receives from each worker of its host: the loader derives the hand-offs from the
// host's plans (host_plans), the PS exchange runs them over a HostChannel (Gloo within
// the host: collective.h), with no negotiation and no new member to fail.
//
// Peer sync (`--peer-sync`, docs/design.md) uses the same channel: a dirty row handed
// by its holder to the one worker of its host that trains it next (StepPlan::
// hand_values) goes there in the sync phase, and fills that worker's slot at its pulls.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ember/common/types.h"
#include "ember/scheduler/host_parts.h"
#include "ember/scheduler/step_plan.h"

namespace ember::worker {

// Float buffers between the workers of one host, their sizes known to both sides.
class HostChannel {
 public:
  virtual ~HostChannel() = default;
  // send[j]: floats for local rank j; recv[j], sized by the caller: what j sends here.
  // Starts every send and receive and returns what waits for them (called once; the
  // buffers must live until it returns); it throws IoError if a peer is lost.
  virtual std::function<void()> start(const std::vector<std::vector<float>>& send, std::vector<std::vector<float>>& recv) = 0;
  // The same, waited for.
  void exchange(const std::vector<std::vector<float>>& send, std::vector<std::vector<float>>& recv) { start(send, recv)(); }
};

// One phase's hand-offs for one worker, as positions into that phase's list of rows
// (HostPlans says which list).
struct HandOffs {
  // Per local rank: positions whose rows this worker sends there, in message order.
  std::vector<std::vector<std::uint32_t>> send;
  // Per local rank: positions the rows received from there are for, in message order.
  std::vector<std::vector<std::uint32_t>> recv;
  // Per position (empty: none handed): 0 where another worker of the host moves the row
  // (this one hands its gradient over, or receives the pulled row); else how many
  // trainers' gradients this worker's push sums (1: its own), or 1 for its own pull.
  std::vector<std::uint32_t> share;
  // Pulls (empty: as the plan says): per position, whether the row is pulled and handed
  // with its state (a row one worker of the host applies itself, pulled for several).
  std::vector<std::uint8_t> state;
  // Whether the phase hands anything over: per-host aggregation's, on any worker of the
  // host (the same answer on all of them); peer sync's, to or from this worker. The
  // exchange is point to point: a worker with nothing to send or receive may skip it.
  bool any = false;

  bool handed(std::size_t i) const { return !share.empty() && share[i] == 0; }
  std::uint32_t share_of(std::size_t i) const { return share.empty() ? 1 : share[i]; }
  bool with_state(std::size_t i, bool planned) const { return state.empty() ? planned : state[i] != 0; }
  std::uint64_t sent() const;      // rows this worker sends
  std::uint64_t received() const;  // rows it receives
};

// The hand-offs of one iteration, each over a list of the worker's plan:
//   sync   push_grads
//   evict  the pulls that evict a partial gradient (kind kPartial), in pull order
//   pull   pulls
//   end    end_pushes
//   peer   peer sync: sent, positions of hand_values; received, positions of pulls
//   apply  peer sync's host-applied rows: sent, positions of hand_grads; received,
//          positions of rows (this worker applies them)
// and of a flush (flush plan's push_grads).
struct HostPlans {
  HandOffs sync, evict, pull, end, peer, apply;
};

// What a worker knows of its host to derive the hand-offs.
struct HostGroup {
  std::vector<WorkerId> ranks;      // the host's workers, ascending (local rank: the index)
  std::uint32_t me = 0;             // this worker's local rank
  std::function<bool(Key)> across;  // whether the row's shard runs on another host
  bool aggregate = true;            // per-host aggregation's hand-offs
  bool peer = false;                // peer sync's
  bool active() const { return ranks.size() > 1; }
};

// `plans`: every worker's plans of the iteration (by rank); `parts`: the host's parts
// still to push, kept across iterations by the caller (one per host, from the job's
// first iteration or a checkpoint's, where none are left).
HostPlans host_plans(const HostGroup& g, const std::vector<scheduler::StepPlan>& plans, scheduler::HostParts& parts);
HandOffs host_flush(const HostGroup& g, const std::vector<scheduler::StepPlan>& plans, scheduler::HostParts& parts);

}  // namespace ember::worker
