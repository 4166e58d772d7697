// A training worker: run_worker joins the job, trains its share of every global batch
// and leaves. One iteration t, read in order (worker/src/):
//   stages/loader.h        the scheduler's plan for t, made ahead in a thread of its own
//   stages/ps_exchange.h   sync pushes, commit(t), evictions and pulls
//   host/host_exchange.h   beside each PS phase, the rows handed within the host
//   stages/compute_step.h  gather, forward/backward; dense all-reduce, dense optimizer
//                          (row gradients into the cache meanwhile)
//   stages/ps_exchange.h   full-set policies' end pushes
//   stages/row_updates.h   local optimizer for rows trained here alone, partials kept, drops
// and around them: job/ (join, PS connections, hosts, the c10d collective), host/ (the
// host tier's hand-offs and eviction exchange), checkpoint/ (resumes, checkpoints and
// stops), report/ (evaluation, metrics, the summary), and trainer.cc (the loop).
// The row-state contract the plans follow is in docs/design.md.
#pragma once

#include "ember/worker/summary.h"
#include "ember/worker/train_config.h"

namespace ember::worker {

// Runs one worker to the end. Throws ConfigError / IoError / ProtocolError / Error.
TrainSummary run_worker(const TrainConfig& config);

}  // namespace ember::worker
