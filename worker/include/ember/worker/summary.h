// What a worker reports of its run (its summary line, docs/training.md#metrics): rows and
// bytes by kind and by link (docs/cluster.md#traffic-per-link), where its iterations'
// wall time went, and the run's totals.
#pragma once

#include <cstdint>
#include <utility>

#include "ember/ps/ps_client.h"
#include "ember/scheduler/step_plan.h"

namespace ember::worker {

// A worker's traffic on one class of link (docs/cluster.md#traffic-per-link): with the PS
// shards, the bytes through its sockets to them (ps_out, ps_in: counted by the transport
// where they leave and enter the socket) and the rows its requests carried, by kind (`ps`,
// as framed); with the other workers in the dense all-reduces (payload, by the
// algorithm: allreduce_link_bytes); and, within the host, the rows handed between its
// workers by the host tier (`handed`: pulled rows received, gradients handed over; their
// floats' bytes).
struct LinkTraffic {
  ps::WireTally ps;
  std::uint64_t ps_out = 0, ps_in = 0;
  std::uint64_t peer_out = 0, peer_in = 0;
  ps::WireTally handed;
  std::uint64_t out() const { return ps_out + peer_out + handed.out(); }
  std::uint64_t in() const { return ps_in + peer_in + handed.in(); }
};
struct Links {
  LinkTraffic intra_host, cross_host;
};

// Rows and bytes this worker moved (what crossed its sockets), docs/design.md accounting.
struct WireCounts {
  // Rows by kind, as the scheduler counts them (what ember-sim predicts): the plans'
  // pulls (with state, prefetched), pushes by kind, hits, flushed rows (evaluations,
  // checkpoints, the end) and replicated rows (fae's hot rows, a placement's replicated
  // tables: all-reduced every iteration, written back at flushes by worker 0). Not
  // counted: cold_pulls (the simulator's alone).
  scheduler::TrafficCounts rows;
  // Replicated rows loaded at the start; a resumed job's cached rows, pulled once before
  // its first iteration (Step::restore).
  std::uint64_t hot_load = 0, restored = 0;
  // Dynamic tables: rows made and dropped that this worker named to their shards (its
  // share of them, protocol.h kResetRows).
  std::uint64_t reset_rows = 0;
  // Payload this worker put into the dense all-reduces: dense gradients, the loss and the
  // replicated rows' gradients (4 bytes a float; a ring moves about twice that per link).
  std::uint64_t allreduce_bytes = 0;
  scheduler::RowFormat format;  // the job's rows: the bytes below
  // What the transport carried per kind of request, headers included (PsClient::tally):
  // the evaluation's and the final model dump's reads too.
  ps::WireTally framed;
  // The same framed bytes and rows, and the all-reduces' payload, by where they went:
  // within this worker's host or across hosts (hosts.h, link_traffic).
  Links links;
  // Rows handed within the host by per-host aggregation (host/host_plans.h): pull.rows the
  // pulled rows this worker received from another, push_grad.rows the gradients it handed
  // to another; bytes the floats sent (out) and received (in), every phase and flush.
  ps::WireTally handed;
  // --scheduler-per-host: the eviction words' bytes this worker sent to and received
  // from the other workers (worker/src/eviction_exchange.h), payload only.
  std::uint64_t exchange_bytes_out = 0, exchange_bytes_in = 0;

  std::uint64_t pushes() const { return rows.pushes(); }
  // Payload per kind (scheduler::wire_bytes of `rows`: keys, trainer counts, floats;
  // what ember-sim predicts), replicated rows' write-backs in `flush`.
  scheduler::WireBytes bytes() const { return scheduler::wire_bytes(rows, format); }
  // The same payload by direction, the restored rows included: out to the PS (the pulls'
  // keys, gradients, values), in from it (the pulled rows).
  std::uint64_t bytes_out() const;
  std::uint64_t bytes_in() const;
};

// Where a worker's iterations spent their wall time, in seconds; the phases add up to
// the training loop's wall time (docs/training.md "Phases"):
//   wait        for the loader's next step (the scheduler running behind);
//   sync        sync pushes before the barrier; commit: the barrier (slower workers) and
//               the commit; pull: write-backs, evictions and pulls; push: the full-set
//               pushes after training;
//   embedding   the fused embedding path: rows gathered and pooled into the model's input,
//               and the bags' gradients added into the rows' accumulators;
//   compute     the dense model's forward and backward;
//   allreduce   the collective alone (the dense gradients, the loss, the replicated rows'
//               gradients), with the copies in and out of its flat buffer;
//   dense_step  the dense optimizer's step (and the replicated rows' optimizer);
//   update      the local updates of the cached rows, and the iteration's bookkeeping;
//   flush       flushes for evaluations and checkpoints, the evaluation included.
// On a GPU each phase ends with a device synchronization, so that queued kernels count
// in the phase that queued them.
struct PhaseTimes {
  double wait = 0, sync = 0, commit = 0, pull = 0, embedding = 0, compute = 0, allreduce = 0, dense_step = 0, push = 0, update = 0,
         flush = 0;
  double total() const;
  // Each phase's name (summary.json, /metrics, the progress line), in iteration order.
  using Field = double PhaseTimes::*;
  static constexpr std::pair<const char*, Field> kNamed[] = {{"wait", &PhaseTimes::wait},           {"sync", &PhaseTimes::sync},
                                                             {"commit", &PhaseTimes::commit},       {"pull", &PhaseTimes::pull},
                                                             {"embedding", &PhaseTimes::embedding}, {"compute", &PhaseTimes::compute},
                                                             {"allreduce", &PhaseTimes::allreduce}, {"dense_step", &PhaseTimes::dense_step},
                                                             {"push", &PhaseTimes::push},           {"update", &PhaseTimes::update},
                                                             {"flush", &PhaseTimes::flush}};
};
inline double PhaseTimes::total() const {
  double t = 0;
  for (const auto& [name, field] : kNamed) t += this->*field;
  return t;
}

struct TrainSummary {
  std::uint32_t rank = 0;
  WireCounts wire;
  PhaseTimes phases;
  std::uint64_t iterations = 0;
  double seconds = 0;             // training loop, wall
  double samples_per_s = 0;       // global samples per second
  double final_loss = 0;          // mean over the last iteration's global batch
  double auc = -1, logloss = -1;  // final evaluation (worker 0; -1 when none)
  // The job was stopped early (a PS shard or a worker got SIGTERM): the iteration it
  // stopped at, checkpointed, from which --resume goes on; 0 when it ran to --iterations.
  std::uint64_t stopped_at = 0;
  // The job's hosts, and the all-reduce payload this worker sent to another host (by the
  // algorithm: hosts.h; wire.links.cross_host.peer_out).
  std::uint32_t hosts = 1;
  std::uint64_t allreduce_cross_host_bytes = 0;
};

}  // namespace ember::worker
