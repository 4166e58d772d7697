// Stage 2, the PS exchange: every row that crosses between this worker's cache and the
// PS shards in an iteration, in the order of the row-state contract (docs/design.md):
//   sync pushes   partial gradients and dirty values another worker needs, before the
//                 barrier, all acknowledged (a commit must find them at the PS);
//   commit        after the workers' barrier: the PS applies every complete
//                 aggregation before anyone pulls rows for the iteration;
//   pulls         evicted rows leave (dirty: value; partial: gradient) and the missing
//                 rows fill their slots, in one round trip (prefetched rows from where
//                 they were pulled during the iteration before);
//   end pushes    full-set policies push every trained row's gradient after training.
// It also keeps the bookkeeping of the partial gradients the cache holds (which
// iteration computed each, and how many workers trained the row then). Under the host
// hierarchy each phase takes its hand-offs (host_plans.h): a row another worker of this
// host moves is not sent here, a gradient pushed here may sum others' (handed over by
// HostExchange, host_exchange.h, and passed in).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/ps/ps_client.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/step_plan.h"
#include "ember/worker/row_cache.h"
#include "ember/worker/summary.h"
#include "host/host_exchange.h"
#include "host/host_plans.h"

namespace ember::worker {

// What the shards said in a commit's acknowledgements.
struct CommitNews {
  std::vector<std::uint64_t> checkpoints_at;  // checkpoints asked for on command, still ahead
  std::uint64_t stop_at = 0;                  // a checkpoint after which the job stops (0: none)
};

// The slots of a phase's list of rows (push_grads, end_pushes): what HandOffs' positions
// index there, for HostExchange::hand_grads and the pushes.
std::vector<std::uint32_t> slots_of(const std::vector<scheduler::KeySlot>& list);
// The slots of the pulls of `p` that evict a partial gradient, in pull order (the list
// HostPlans::evict's positions index).
std::vector<std::uint32_t> evicted_partials(const scheduler::StepPlan& p);

class PsExchange {
 public:
  PsExchange(ps::PsClient& client, RowCache& cache, WireCounts& wire, scheduler::RowFormat row, std::uint32_t cache_rows);

  // The plan's sync pushes (`flush`: of a flush, counted apart), push_grads handed as
  // `h` says; `handed`: the gradients other workers of this host handed here (h.recv).
  void sync_pushes(const scheduler::StepPlan& p, bool flush, const HandOffs& h = {}, const HandedGrads& handed = {});
  // commit(iteration) on every shard, with `flags` (ps_service.h).
  CommitNews commit(std::uint64_t iteration, std::uint32_t flags);
  // A resumed job's cached rows (Step::restore), with their state, after the first
  // iteration's commit and before its pulls.
  void restore(const std::vector<scheduler::KeySlot>& rows, std::uint64_t t);
  // Evictions and pulls of iteration t (`h`: its hand-offs, evict and pull; `evicted`:
  // the partial gradients of evicted rows handed here, HostPlans::evict's recv). Rows a
  // worker of this host hands over (HostExchange, after this) are not pulled here.
  void pull(const scheduler::StepPlan& p, std::uint64_t t, const HostPlans& h = {}, const HandedGrads& evicted = {});
  // After iteration t's pulls: starts the pulls `next` (t + 1's plan) marks prefetch,
  // into buffers; t + 1's pull() waits for them and fills their slots. The scheduler
  // marks only rows no push changes between t's pulls and t + 1's, so the PS (committed
  // through t) serves what t + 1 would get; the shards refuse a prefetch of a row with
  // an update pending, and any push of a prefetched row before commit(t + 1).
  // Rows another worker of this host pulls for it (next_h.pull) are not pulled here.
  void prefetch(const scheduler::StepPlan& next, std::uint64_t t, const HostPlans& next_h = {});
  // Names rows of iteration `iteration` to the shards' disk tiers (Step::hint_keys); the
  // replies are awaited at the next hint.
  void hint(const std::vector<Key>& keys, std::uint64_t iteration);
  // Full-set sync: every trained row's gradient, with its trainer count (`h`, `handed`:
  // as for sync_pushes).
  void end_pushes(const scheduler::StepPlan& p, std::uint64_t t, const HandOffs& h = {}, const HandedGrads& handed = {});
  // The partial gradient in `slot` was computed in iteration t by `trainers` workers; it
  // stays in the cache until a plan pushes it.
  void keep_partial(std::uint32_t slot, std::uint64_t t, std::uint32_t trainers);
  // Dynamic tables: slots made for new ids (or cleared, id KeyDirectory::kNoId), named to
  // their shards, which reset them at commit(t); acknowledged.
  void reset_rows(const std::vector<scheduler::SlotAssignment>& resets, std::uint64_t t);
  // Per-host aggregation: every gradient pushed names this worker's host (protocol.h), so
  // that the shards sum a host's gradients alike whether they left it summed or one by
  // one (a flush then changes no sum).
  void group_as(std::uint32_t host) { group_ = host; }

 private:
  // Partial gradients to push, grouped by the iteration that computed them (one push each).
  struct GradBatch {
    std::vector<Key> keys;
    std::vector<std::uint32_t> trainers;
    std::vector<std::uint32_t> shares;  // trainers each gradient sums (host/host_plans.h); empty: 1 each
    std::vector<std::uint32_t> slots;   // their gradients are read from the cache when pushed
    std::vector<float> grads;
    // Gradients other workers of this host handed over, for row `first`: summed with
    // this worker's in the order of their bytes (sum_host_parts).
    std::vector<std::pair<std::uint32_t, const float*>> added;
  };
  using GradsByIteration = std::map<std::uint64_t, GradBatch>;
  // Rows pulled together (with their state, or without).
  struct Pulled {
    std::vector<Key> keys;
    std::vector<std::uint32_t> slots;
    std::vector<float> rows;
    ps::PsFuture sent;
    void clear() {
      keys.clear();
      slots.clear();
    }
    // Sends the pull (if any keys) for iteration t (`when`: committed, or ahead of t's commit).
    void start(ps::PsClient& client, bool with_state, std::uint64_t t, ps::PsClient::Pull when = ps::PsClient::Pull::kCommitted);
    // Waits for it, then fills the slots.
    void fill(RowCache& cache, bool with_state);
  };
  // Adds the partial gradient in `slot` to its iteration's batch (`share`: the trainers
  // its push will sum); returns where it went.
  std::pair<std::uint64_t, std::uint32_t> take_grad(std::uint32_t slot, GradsByIteration& by_iter, std::uint32_t share = 1);
  // Sends the gradients (one push per iteration); the caller waits for `sent`.
  void push_partials(GradsByIteration& by_iter, std::vector<ps::PsFuture>& sent);
  // Partial gradients of `slots` into batches by iteration, with their shares and the
  // gradients handed here added (a phase's list, `h` its hand-offs, `received` the
  // gradients handed here).
  void take_grads(const HandOffs& h, const std::vector<std::uint32_t>& slots, GradsByIteration& by_iter,
                  const std::vector<std::vector<float>>& received);
  ps::PsClient& client_;
  std::uint32_t group_ = 0;
  RowCache& cache_;
  WireCounts& wire_;
  scheduler::RowFormat row_;                     // dim and state floats of a row
  std::vector<std::uint64_t> partial_iter_;      // per slot: iteration of its partial gradient
  std::vector<std::uint32_t> partial_trainers_;  // per slot: workers that trained it then
  // Prefetched rows (with their state, without), for iteration ahead_for_.
  Pulled ahead_state_, ahead_plain_;
  ps::PsFuture hint_sent_;
  std::vector<float> no_rows_;  // a hint's reply carries none
  std::uint64_t ahead_for_ = 0;
};

}  // namespace ember::worker
