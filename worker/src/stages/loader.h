// Stage 1, the loader: reads the global batches this job trains and runs the scheduler on
// each, a couple of iterations ahead of training, in a thread of its own. Every worker
// runs the same deterministic scheduler on the same batches, so their plans agree without
// a scheduler process. It hands over this worker's part of iteration t (a Step): its
// StepPlan, the features of its samples, and what follows the step (a flush for an
// evaluation or a checkpoint, or the end of the job).
#pragma once

#include <tbb/concurrent_queue.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/ps/job_config.h"
#include "ember/scheduler/batch_stream.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/step_plan.h"
#include "ember/worker/train_config.h"
#include "host/eviction_exchange.h"
#include "host/host_plans.h"

namespace ember::worker {

// Checkpoints the shards asked for on command (SIGUSR1), told by the training thread and
// read by the loader. A set, not the latest: shards signalled a commit apart name
// different iterations, and each is flushed for (else all but one would hold the PS's
// rows only).
class AskedCheckpoints {
 public:
  // Whether `at` is new.
  bool add(std::uint64_t at);
  bool contains(std::uint64_t at) const;

 private:
  mutable std::mutex mutex_;
  std::set<std::uint64_t> at_;
};

// One iteration's work as the loader hands it over.
struct Step {
  std::uint64_t iteration = 0;
  scheduler::StepPlan plan;
  std::vector<Key> keys;  // global keys: samples x tables, or each sample's bags in table order
  // Multi-hot: bag (i, t) of the step's samples is keys [bags[i * T + t], bags[i * T + t + 1]).
  std::vector<std::uint32_t> bags;
  std::vector<float> dense;   // samples x num_dense
  std::vector<float> labels;  // samples
  double sched_ms = 0;
  // --scheduler-per-host: the eviction words this worker sent and received while its
  // loader scheduled this step (a resumed job's first step: and the replay before it).
  ExchangeBytes exchanged;
  bool flush = false;  // flush after training this iteration (flush_plan)
  scheduler::StepPlan flush_plan;
  // Per-host aggregation (host/host_plans.h): the rows this worker hands to or takes from the
  // other workers of its host, in the iteration and in its flush.
  HostPlans host;
  HandOffs flush_host;
  bool evaluate = false;  // worker 0 evaluates after the flush
  // Worker 0's, with `evaluate`: the rows each worker (by rank) hands it from its
  // flush_plan.eval_hands, in their order.
  std::vector<std::vector<Key>> eval_hands_of;
  bool checkpoint = false;  // the PS checkpoints at the next commit: dense state saved
  bool last = false;
  // A resumed job's first step: the rows this worker held as latest at the checkpoint
  // (in the scheduler's replayed model), to pull with their state into these slots
  // before the step's own pulls.
  std::vector<scheduler::KeySlot> restore;
  // The PS keeps rows on disk (JobConfig::disk_tier) and the scheduler looks ahead: the
  // rows of iteration hint_iteration (a batch the lookahead read while this step was
  // planned), this worker's share of them (key mod workers = rank), to name to the
  // shards now (protocol.h kHint).
  std::vector<Key> hint_keys;
  std::uint64_t hint_iteration = 0;
  // Dynamic tables: this worker's share of the rows its shards reset before the step's
  // pulls (protocol.h kResetRows): those dropped after the last step (id kNoId), then
  // those made for the step's new ids. And, with `evaluate` or `last`, the directory as
  // it stands after the step (its rows dropped): the evaluation finds its ids' rows
  // through it, and the model dump names each slot's id.
  std::vector<scheduler::SlotAssignment> resets;
  std::shared_ptr<const scheduler::KeyDirectory> directory;
  // With `checkpoint` or `last` (and a --checkpoint-dir): the directory's saved state
  // after the step, which the dense checkpoint keeps (a job resumed on another shard
  // count re-places it). With `last`: this worker's share of the rows dropped after the
  // step, which the shards clear at the final commit (its checkpoint then holds the
  // directory's rows).
  std::string directory_state;
  // A job on a stream, where the PS checkpoints after this step (and at the last): the
  // stream's position after this step's batch (data::RecordStream::position_json).
  std::string stream_position;
  std::vector<scheduler::SlotAssignment> final_resets;
  // Dynamic tables: each shard's rows after the step (live, and made, kept out, expired
  // and capped so far).
  std::vector<scheduler::DirectoryCounts> dynamic_rows;
};

// Dynamic tables: the key directory before the job's first iteration. A new job's is
// empty, and a resumed job's is replayed with the scheduler; one `restored` from a
// checkpoint of another shard count (re-placed: KeyDirectory::reshard) is not, and then
// neither is the scheduler: every cache starts empty (a checkpoint's rows are all on the
// shards), so the model goes on as BSP's, on the new shards' slots.
// A job on a stream restores its directory from the checkpoint (no replay: the stream's
// early files may be gone) and reads on from the checkpoint's `stream_position`
// (data::RecordStream::position_json; empty: from the start, past the batches trained).
struct StartDirectory {
  scheduler::KeyDirectory directory;
  bool restored = false;
  std::string stream_position;
};

// Plans from iteration `sc.first_iteration` (a resumed job) to the end. The PS
// checkpoints on `schedule` and at I = `asked` (set by the training thread before the
// loader plans I - 1): the iteration before is flushed. At I = `stop_at` (set as early)
// the job stops: I - 1 is the last step.
//
// A resumed job (first iteration I > 0) replays the scheduler over batches 0 .. I - 1
// without training them, then flushes as the checkpoint's job did: its model of every
// cache is then the one an uninterrupted job has at I (flushes change no allocation), so
// the same samples meet the same rows on the same workers, and floating-point sums add
// up in the same order. Bounded staleness (het) is not replayed: its copies lag the PS,
// and a checkpoint holds only the PS's rows.
class Loader {
 public:
  // `host`: with per-host aggregation, this worker's host (each step then carries its
  // hand-offs). `evictions`: with a scheduler of this worker's host (sc.model_host, more
  // hosts than one), the channel the hosts' evictions go over after each iteration.
  // `directory`: a dataset of hashed ids' (dynamic tables), above.
  Loader(const data::Dataset& ds, scheduler::SchedulerConfig sc, const TrainConfig& c, std::uint32_t rank, ps::CheckpointSchedule schedule,
         const AskedCheckpoints& asked, const std::atomic<std::uint64_t>& stop_at, std::optional<HostGroup> host = std::nullopt,
         EvictionChannel* evictions = nullptr, bool hint_rows = false, std::optional<StartDirectory> directory = std::nullopt);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next step; throws what the loader thread threw.
  Step next();

 private:
  // What crosses from the loader thread: a step, or the error that ended it.
  struct Handoff {
    Step step;
    std::exception_ptr error;
  };
  void run();
  // Schedules g (and, per host, exchanges the iteration's evictions with the other
  // hosts); the time of both.
  double schedule(const scheduler::GlobalBatch& g, std::vector<scheduler::StepPlan>& plans);
  // Step t, global batch g (read into b): this worker's plan (scheduling g), its
  // samples' features and what follows the step; a resumed job's first step takes
  // `restore`.
  Step make_step(std::uint64_t t, data::Batch& b, scheduler::GlobalBatch& g, std::vector<scheduler::StepPlan>& plans,
                 std::vector<scheduler::KeySlot>& restore);
  // Dynamic tables: batch t's ids become slots; the rows the shards reset for t (those
  // dropped after t - 1, then those made now), this worker's share.
  std::vector<scheduler::SlotAssignment> admit(std::uint64_t t, scheduler::GlobalBatch& g);
  // Dynamic tables: the rows dropped after t leave the scheduler (the shards clear them
  // at t + 1's commit).
  void drop_after(std::uint64_t t);
  // This worker's share of a step's resets (each named by one worker).
  std::vector<scheduler::SlotAssignment> share_of(const std::vector<scheduler::SlotAssignment>& all) const;

  const data::Dataset& ds_;
  std::uint64_t first_;  // the first iteration this job trains
  bool replay_;          // the scheduler replays 0 .. first_ - 1
  scheduler::Scheduler sched_;
  const TrainConfig& c_;
  std::uint32_t rank_;
  scheduler::FlushSchedule flushes_;  // the job's; asked_ and stop_at_ add to it
  const AskedCheckpoints& asked_;
  const std::atomic<std::uint64_t>& stop_at_;
  std::optional<HostGroup> host_;
  scheduler::HostParts host_parts_;  // the host's gradient parts still to push (host_plans)
  EvictionChannel* evictions_;
  bool hint_rows_ = false;
  std::vector<Key> hints_;  // collected while planning the next step
  std::uint64_t hints_for_ = 0;
  std::optional<scheduler::KeyDirectory> dir_;
  std::string stream_start_;                        // StartDirectory::stream_position
  std::vector<scheduler::SlotAssignment> dropped_;  // after the last batch (id kNoId), for the next step's resets
  ExchangeBytes exchanged_;                         // since the last step made
  tbb::concurrent_bounded_queue<Handoff> queue_;    // two steps ahead at most
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ember::worker
