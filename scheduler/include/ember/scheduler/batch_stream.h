// A job's global batches as every worker's loader and ember-sim read them, and the
// iterations after which a job flushes: one rule for both, so that the simulator plans
// exactly what the workers train.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ember/common/checkpoint_schedule.h"
#include "ember/data/dataset.h"
#include "ember/data/stream.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/host_schedulers.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_config.h"

namespace ember::scheduler {

// The job's batches in order: `reader`'s global batches epoch after epoch (when an epoch
// ends the next starts, reshuffled when the reader shuffles), or a stream's batches
// (data/stream.h), each as a dataset batch and as its global keys. The scheduler's
// lookahead window reads the same batches ahead with a reader of its own (a copy of
// `reader`), never past the job's end.
class BatchStream {
 public:
  // `reader` has read nothing yet and holds at least one batch per epoch; `lookahead`
  // is the scheduler's window (SchedulerConfig::lookahead; 0: none).
  BatchStream(const data::BatchReader& reader, std::vector<std::uint64_t> table_offsets, std::uint32_t lookahead);
  // A stream's batches of `batch_size` records (no lookahead).
  BatchStream(data::StreamOptions stream, std::size_t batch_size, std::vector<std::uint64_t> table_offsets);

  // The job's next batch: `b` (dense features and labels) and its global keys `g`.
  // False only when a stream's `stopped` ended its wait for records.
  bool next(data::Batch& b, GlobalBatch& g);
  // Before `s` schedules iteration t of a job of `end` iterations: shows its window the
  // batches it lacks (Scheduler::look_ahead_through), read by the lookahead's reader.
  void look_ahead(Scheduler& s, std::uint64_t t, std::uint64_t end);
  void look_ahead(HostSchedulers& s, std::uint64_t t, std::uint64_t end);
  // Passes over the first `n` batches without scheduling them (those a resumed job
  // trained before its checkpoint, when it does not replay them): the lookahead's
  // reader too when there is a window.
  bool skip(std::uint64_t n);
  // A stream's: goes on from `position` (a checkpoint's, RecordStream::seek_json) instead
  // of skipping.
  void seek(const std::string& position, const std::string& origin);
  // The stream's position (RecordStream::position_json; empty: batches of a dataset).
  std::string stream_position() const { return stream_ ? stream_->position_json() : std::string(); }
  // Called with each batch the lookahead reads, and its iteration (a PS disk tier's
  // hints: the rows iteration it will use, named --lookahead iterations ahead).
  void on_ahead(std::function<void(std::uint64_t iteration, const GlobalBatch&)> f) { on_ahead_ = std::move(f); }

 private:
  struct Epochs {
    data::BatchReader reader;
    std::uint64_t epoch = 0;
    void next(data::Batch& out);
  };
  std::optional<Epochs> main_, ahead_;          // a dataset's
  std::unique_ptr<data::RecordStream> stream_;  // or a stream's
  std::vector<std::uint64_t> offsets_;
  std::uint32_t lookahead_;
  data::Batch ahead_batch_;       // the lookahead's, reused
  std::uint64_t ahead_next_ = 0;  // the iteration of the lookahead's next batch
  std::function<void(std::uint64_t, const GlobalBatch&)> on_ahead_;
};

// The stream of `o` (o.stream), `stopped` asked while it waits. ConfigError for a bad
// format.
data::StreamOptions stream_options(const SchedulerOptions& o, std::function<bool()> stopped = {});
// The data a job of `o` trains on: the dataset in `dir`, or with a stream, the stream's
// shape (data::stream_manifest) and no rows (then `dir` is not read).
data::Dataset open_job_data(const std::string& dir, const SchedulerOptions& o, data::OpenOptions open = {});
// The batches a job of `o` on `ds` (open_job_data's) trains, as every worker, ember-sim
// and the one-process reference read them: the stream's, or global_batch_reader's;
// `table_offsets` and `lookahead` as BatchStream's.
BatchStream job_batches(const data::Dataset& ds, const SchedulerOptions& o, std::vector<std::uint64_t> table_offsets,
                        std::uint32_t lookahead, std::function<bool()> stopped = {});

// After which iterations a job flushes (brings the PS up to date: Scheduler::flush):
// before each evaluation (every `eval_every` iterations and after the last), before
// each periodic checkpoint (`checkpoints`), and at the job's end. A worker also flushes
// before a checkpoint asked for on command and when the job stops early
// (worker/src/loader.cc); bounded staleness (het) never flushes.
struct FlushSchedule {
  std::uint64_t end = 0;         // the job's iterations
  std::uint64_t eval_every = 0;  // 0: evaluation after the last iteration only
  CheckpointSchedule checkpoints;

  bool last(std::uint64_t t) const { return t + 1 == end; }
  bool evaluates_after(std::uint64_t t) const { return last(t) || (eval_every > 0 && (t + 1) % eval_every == 0); }
  // An evaluation's flush alone (no checkpoint, not the last): only the evaluated rows.
  bool evaluation_only_after(std::uint64_t t) const { return evaluates_after(t) && !last(t) && !checkpoints_after(t); }
  bool checkpoints_after(std::uint64_t t) const { return checkpoints.flush_after(t); }
  bool flushes_after(std::uint64_t t) const { return evaluates_after(t) || checkpoints_after(t); }
};

}  // namespace ember::scheduler
