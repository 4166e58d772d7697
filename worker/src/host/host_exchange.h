// The host tier's stage: every row handed between the workers of one host in an
// iteration, beside the PS phase it stands in for (docs/design.md "The host hierarchy"):
//   sync       per-host aggregation's gradients handed to the worker that pushes them
//              (hand_grads, for PsExchange::sync_pushes); peer sync's latest rows handed
//              to their trainers on this host (hand_values)
//   pulls      the evicted partial gradients handed over (hand_grads, for
//              PsExchange::pull); rows one worker pulled for the others (hand_pulled_rows);
//              peer sync's rows into the slots of their pulls (take_peer_rows)
//   end        full-set gradients handed over (hand_grads, for PsExchange::end_pushes)
//   update     peer sync's host-applied rows: the others' gradients to the row's applier,
//              waited for at the rows' next use (start_apply, finish_apply)
// The hand-offs come from the loader (host_plans.h: every worker knows its host's plans);
// the rows travel over a HostChannel (Gloo within the host). PsExchange keeps the PS.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/step_plan.h"
#include "ember/worker/row_cache.h"
#include "ember/worker/summary.h"
#include "host/host_plans.h"

namespace ember::worker {

// Gradients received from the other workers of the host, by local rank (HandOffs::recv's
// order), row after row.
using HandedGrads = std::vector<std::vector<float>>;

class HostExchange {
 public:
  // `channel`: to this host's other workers (null: no per-host aggregation or peer sync,
  // or alone on the host; then every hand-off must be empty).
  HostExchange(RowCache& cache, WireCounts& wire, scheduler::RowFormat row, std::unique_ptr<HostChannel> channel);

  // Whether this worker shares its host with others under the host tier (a channel).
  bool active() const { return channel_ != nullptr; }
  // The gradients in `slots` (a phase's list) that `h` hands to other workers, sent;
  // returns those handed here. Counted in wire.handed.push_grad.
  HandedGrads hand_grads(const HandOffs& h, const std::vector<std::uint32_t>& slots);
  // Peer sync, in the sync phase: the plan's hand_values go to their trainers on this
  // host, and the rows handed here wait for take_peer_rows.
  void hand_values(const scheduler::StepPlan& p, const HandOffs& h);
  // After the PS pulls: the rows pulled here that `h` hands to others, sent, and those
  // handed here filled into their slots.
  void hand_pulled_rows(const scheduler::StepPlan& p, const HandOffs& h);
  // Peer sync's rows (hand_values) into the slots of their pulls; Error unless they are
  // the pulls the plan marks peer.
  void take_peer_rows(const scheduler::StepPlan& p, std::uint64_t t);
  // Peer sync, after training: starts handing the gradients of host-applied rows to their
  // applier and receiving those handed here, and takes the rows this worker applies;
  // finish_apply() adds the received gradients to its own, in rank order, and applies
  // the optimizer. The wait is deferred to the rows' next use (the next sync phase, a
  // flush, the end), where the workers wait for each other anyway.
  void start_apply(const scheduler::StepPlan& p, const HandOffs& h);
  void finish_apply(const ps::OptimizerConfig& optimizer);

 private:
  // The channel, or Error naming what was planned without one.
  HostChannel& channel(const char* what);
  // The gradients `h` hands over, per local rank: those of the slots slot_of(position)
  // read into `send`, and `recv` sized for those coming here; counted in
  // wire.handed.push_grad (hand_grads, start_apply).
  template <typename SlotOf>
  void gradient_buffers(const HandOffs& h, SlotOf&& slot_of, std::vector<std::vector<float>>& send, std::vector<std::vector<float>>& recv);

  RowCache& cache_;
  WireCounts& wire_;
  scheduler::RowFormat row_;  // dim and state floats of a row
  std::unique_ptr<HostChannel> channel_;
  // Rows handed here by peer sync (value and state), from each local rank, for the pulls
  // at peer_at_'s positions.
  std::vector<std::vector<float>> peer_rows_;
  std::vector<std::vector<std::uint32_t>> peer_at_;
  // Host-applied rows in flight (start_apply to finish_apply): the gradients sent and
  // received, the slots each giver's rows add to, this worker's own such rows.
  std::vector<std::vector<float>> apply_send_, apply_recv_;
  std::vector<std::vector<std::uint32_t>> apply_into_;
  std::vector<std::uint32_t> apply_own_;
  std::function<void()> apply_wait_;
};

}  // namespace ember::worker
