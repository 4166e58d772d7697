// StepPlan: what one worker does in one iteration, decided by the scheduler so that the
// worker executes it without further decisions. Executed in this order:
//   1. sync:   push_grads (partial gradients others need; then the copy is dropped),
//              push_values (own dirty rows another worker needs; the copy stays, clean)
//   2. pulls:  for each entry, first the evicted row leaves its slot (pushed as a value
//              if dirty, as a gradient if partial, silently if clean), then the row is
//              pulled into that slot (a prefetched row: copied from where the worker
//              pulled it during the previous iteration)
//   3. train:  `samples` of the global batch; `rows` gives the slot of every distinct row
//              of the micro-batch; a shared row (trainers > 1) keeps its gradient as a
//              partial (pushed later with its iteration and trainer count, so the PS
//              knows when the sum is complete), any other row gets the optimizer
//              applied locally (it becomes dirty)
//   4. after:  end_pushes (full-set sync: push these rows' gradients), then drops (stale
//              copies leave their slots without traffic)
// Peer sync (SchedulerConfig::peer_sync) adds, in step 1, hand_values: a row this worker
// holds as latest goes (value and state) to every other worker of its host that trains
// it, whose pull of it is marked `peer` and takes it from there instead of the PS (if
// this worker does not train it, its copy leaves at once). And a row that several
// workers of one host train (and no other) is applied in the host (RowRef::host): the
// first of them (lowest rank) applies the optimizer to the sum, the others hand it their
// gradients (hand_grads) after training and drop their copies.
// A placement (plan_file.h) adds two kinds of rows: `replicated` lists the rows of
// replicated tables the global batch touches (the same list in every worker's plan: their
// gradients are all-reduced, no row is pulled or pushed); an uncached row is pulled into
// a staging slot (at or past the cache's rows), its gradient is an end push whatever
// its trainers, and its copy is dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/types.h"

namespace ember::scheduler {

enum class EvictKind : std::uint8_t {
  kNone = 0,  // the slot was free
  kClean,     // silent
  kDirty,     // push the row's value (and optimizer state)
  kPartial,   // push the row's partial gradient
};

struct KeySlot {
  Key key;
  std::uint32_t slot;
};

struct PullEntry {
  Key key;
  std::uint32_t slot;
  Key evicted;  // valid unless kind == kNone
  EvictKind kind;
  // The row comes with its optimizer state: the puller applies the optimizer to it (its
  // sole trainer; het: always). A shared row's gradient goes to the PS instead.
  bool with_state = true;
  // Prefetch: the row's PS copy is final once the previous iteration's pulls are done (no
  // push of it from then until this iteration's pulls), so the worker may pull it while
  // the previous iteration computes, into a buffer, and fill the slot here.
  bool prefetch = false;
  // Peer sync: the row comes from another worker of this host (its HandValue), not the
  // PS: with its state, never prefetched, not a PS transmission.
  bool peer = false;
};

// A worker's eviction as the schedulers of other hosts need it (a scheduler that models
// one host learns the others' through Scheduler::apply_evictions).
struct RowEviction {
  Key key;
  WorkerId worker;
  bool partial;  // the worker held a partial gradient (else the latest copy)
  bool pushes;   // it went to the PS (a dirty value, an un-flushed gradient)
  bool operator==(const RowEviction&) const = default;
};

// Peer sync: a latest row handed (value and state) to worker `to`, from `slot`.
struct HandValue {
  Key key;
  std::uint32_t slot;
  WorkerId to;
};

// Peer sync's part of this worker in a row applied within its host (RowRef::host).
enum class HostApply : std::uint8_t {
  kNone = 0,  // not applied in the host
  kApplies,   // this worker, the row's first trainer, applies the host's summed gradient
  kHands,     // this worker hands its gradient to the one that applies it (hand_grads)
};

struct RowRef {
  Key key;
  std::uint32_t slot;
  std::uint32_t trainers;  // workers training this row in this iteration (1: only this one)
  // Staged for this iteration only: of an uncached table, or not admitted to the cache
  // (--cache-admission). Its gradient is an end push; its copy is dropped.
  bool uncached = false;
  // Peer sync: every trainer is on this worker's host; the first applies the summed
  // gradients (with the row's state), the others hand theirs to it (hand_grads).
  HostApply host = HostApply::kNone;

  // Trained by other workers too: the gradient is partial (on-demand sync) or pushed.
  bool shared() const { return trainers > 1; }
};

struct StepPlan {
  std::uint64_t iteration = 0;
  WorkerId worker = 0;
  std::vector<std::uint32_t> samples;  // indices into the global batch, ascending
  std::vector<KeySlot> push_grads;
  std::vector<KeySlot> push_values;
  std::vector<HandValue> hand_values;  // peer sync, step 1 (their slots are free after it)
  // Peer sync, after training: gradients of host-applied rows handed to their applier
  // (`to`); the copies then leave (they are in `drops` too).
  std::vector<HandValue> hand_grads;
  std::vector<PullEntry> pulls;
  std::vector<RowRef> rows;  // distinct rows of the micro-batch, first-appearance order
  std::vector<KeySlot> end_pushes;
  std::vector<KeySlot> drops;
  // Replicated rows the global batch trains (first-appearance order, every worker's plan
  // alike): their gradients are summed over the workers with the dense ones.
  std::vector<Key> replicated;
  // A flush's, worker 0's only: replicated rows trained since the last flush, whose
  // replica values (and state) go back to the PS.
  std::vector<Key> replicated_flush;
  // An evaluation's flush (Scheduler::flush): rows the evaluation reads that this worker
  // holds newer than the PS (a dirty owner's), handed to worker 0 instead of the PS
  // (value only; their states stay as they are), in slot order.
  std::vector<KeySlot> eval_hands;
  // With SchedulerConfig::id_rows_for, that worker's: each id of its samples (in sample
  // order, then the batch's order) as an index into `rows`, or kReplicatedRow | an index
  // into `replicated`. The embedding path needs no lookup per id.
  std::vector<std::uint32_t> id_rows;
  static constexpr std::uint32_t kReplicatedRow = 0x80000000u;

  void clear();
};

// Rows crossing between workers and the PS in one iteration (docs/design.md accounting).
struct TrafficCounts {
  std::uint64_t pulls = 0;
  std::uint64_t push_grad = 0;   // gradients: sync (1a) and full-set sync
  std::uint64_t push_value = 0;  // values: dirty rows another worker needs (1b)
  std::uint64_t push_evict = 0;  // dirty or partial rows leaving a full cache
  std::uint64_t hits = 0;        // micro-batch rows already cached as latest
  // Replicated rows (fae's hot rows, replicated tables) all-reduced among the workers,
  // summed over the workers as the other kinds are (not PS traffic). Named hot_sync, as
  // is hot_flush below, after the output fields they fill (ember-sim's JSON, the
  // worker's metrics): an interface, kept although the code calls these rows replicated.
  std::uint64_t hot_sync = 0;
  std::uint64_t cold_pulls = 0;  // pulls of rows no earlier iteration used: no policy avoids them
  // Pulls into a full cache that admission turned away (--cache-admission): staged for
  // their iteration, their gradients pushed at its end (in pulls and push_grad too).
  std::uint64_t not_admitted = 0;
  // Subsets, for bytes: pulls that carry the row's optimizer state (the puller applies
  // the optimizer to the row itself: its sole trainer; every pull of het), and
  // evictions that push a partial gradient rather than a value.
  std::uint64_t pull_state = 0;
  std::uint64_t evict_partial = 0;
  // Pulls marked for prefetch (PullEntry::prefetch): pulled during the previous
  // iteration, off the critical path.
  std::uint64_t prefetched = 0;
  // Rows pushed by flushes (before an evaluation or a checkpoint, and at the end):
  // counted apart, as the job counts them.
  std::uint64_t flush_grad = 0, flush_value = 0;
  // Replicated rows written back to the PS by a flush (their replica values and state).
  std::uint64_t hot_flush = 0;
  // Rows an evaluation's flush hands to worker 0 (values, between workers): not PS
  // transmissions (StepPlan::eval_hands).
  std::uint64_t eval_handed = 0;
  // Peer sync: latest rows handed (value and state) from one worker to another of its
  // host instead of a pull (and, for a dirty row, a value push): not PS transmissions.
  std::uint64_t peer_value = 0;
  // Peer sync: gradients handed to a host-applied row's applier (within the host).
  std::uint64_t peer_grad = 0;

  std::uint64_t pushes() const { return push_grad + push_value + push_evict; }
  std::uint64_t transmissions() const { return pulls + pushes(); }
  TrafficCounts& operator+=(const TrafficCounts& o);
};

// One embedding row's size: `dim` floats of value and `state` floats of optimizer state.
struct RowFormat {
  std::uint32_t dim = 16;
  std::uint32_t state = 0;
  // A row and its optimizer state as a PS shard stores them (floats).
  std::uint64_t stored_bytes() const { return (std::uint64_t{dim} + state) * sizeof(float); }
};

// Payload bytes on the wire per kind (both directions): keys (8 bytes), a gradient's
// trainer count and iteration (8 bytes), and floats (4 bytes); message headers excluded.
// A pull sends its key and receives the value, with the state only where counted in
// pull_state; a gradient carries no state; a value (write-back, dirty eviction, flush)
// carries its state. A replica's write-back (hot_flush) counts as a flush of values.
// Peer sync's hand-offs (`peer`, within a host) count as values.
struct WireBytes {
  std::uint64_t pull = 0, push_grad = 0, push_value = 0, push_evict = 0, flush = 0, peer = 0;
  std::uint64_t total() const { return pull + push_grad + push_value + push_evict + flush + peer; }
};
WireBytes wire_bytes(const TrafficCounts& c, RowFormat f);
// As JSON (nlohmann's to_json, for any of its json types): the kinds and their total,
// as ember-sim's output and the worker's summary write them.
template <class Json>
void to_json(Json& j, const WireBytes& b) {
  j = Json{{"pull", b.pull},   {"push_grad", b.push_grad}, {"push_value", b.push_value}, {"push_evict", b.push_evict},
           {"flush", b.flush}, {"total", b.total()}};
  if (b.peer > 0) j["peer"] = b.peer;  // (runs without peer sync write what they wrote)
}
// Payload bytes of n keys pulled (with_state or not), of n gradients, of n values.
std::uint64_t pull_bytes(std::uint64_t n, RowFormat f, bool with_state);
std::uint64_t grad_bytes(std::uint64_t n, RowFormat f);
std::uint64_t value_bytes(std::uint64_t n, RowFormat f);

}  // namespace ember::scheduler
