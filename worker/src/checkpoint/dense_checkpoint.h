// The workers' part of a checkpoint: the dense model and its optimizer as of the start of
// an iteration (the PS shards' checkpoint of that iteration holds the rows), one file per
// worker (hosts may share no filesystem; the replicas are identical), written atomically.
// Pruned as the job's checkpoints, not by count alone: the files of the newest
// `keep_checkpoints` iterations whose checkpoint is whole for the job (the shards' part
// and every worker's dense state: job_config.h), and any newer, are kept. Loading checks that the file was written by a job
// that trains the same way (model, optimizer, seed, shape, rows). Besides, each file holds
// the model's layers ("model_config") and the PS's seed ("ps_seed"): ember-export builds
// the model from them (read_dense_state).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

#include "ember/worker/dense_state.h"
#include "ember/worker/model.h"
#include "ember/worker/train_config.h"

namespace ember::worker {

// What a dense checkpoint keeps beside the model for a job of dynamic tables: its key
// directory (KeyDirectory::save) and, on a stream, the stream's position.
struct DenseRestore {
  std::string directory;
  std::string stream_position;
};

class DenseCheckpoints {
 public:
  // `whole_for_job(it)`: whether iteration it's checkpoint is whole for the job (must not
  // wait; unknown is false).
  // `ps_seed`: the PS's seed of initial rows, kept in the file for ember-export (rows a
  // PS checkpoint lacks were never touched: they hold their initial values).
  DenseCheckpoints(const TrainConfig& c, std::uint32_t rank, std::uint64_t num_keys, std::uint32_t dim, std::uint64_t ps_seed,
                   std::function<bool(std::uint64_t)> whole_for_job)
      : c_(c), rank_(rank), num_keys_(num_keys), dim_(dim), ps_seed_(ps_seed), whole_for_job_(std::move(whole_for_job)) {}

  // A failure to write is logged, not thrown: training goes on and the earlier
  // checkpoints are intact, as on the PS. Returns whether the file was written.
  // `directory_state`: dynamic tables' KeyDirectory::save() as of the checkpoint (empty:
  // none), kept in the file.
  // `stream_position`: a job on a stream's (data::RecordStream::position_json), kept alike.
  bool save(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer, const std::string& directory_state = {},
            const std::string& stream_position = {}) const;
  // Loads this worker's file of `iteration`, or another worker's when its own is missing
  // or corrupt (verify_dense_file; each passed over is logged). Throws ConfigError naming
  // what is missing or does not match this job, DataError when every file of the
  // iteration there is corrupt (naming each). Returns the file's directory state (empty:
  // none; a file with one may name other keys than this job's, another shard count) and
  // stream position.
  DenseRestore load(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer, torch::Device device) const;

 private:
  // What must match for the dense state to continue this job's training.
  nlohmann::json meta(std::uint64_t iteration) const;
  void prune() const;

  const TrainConfig& c_;
  std::uint32_t rank_;
  std::uint64_t num_keys_;
  std::uint32_t dim_;
  std::uint64_t ps_seed_;
  std::function<bool(std::uint64_t)> whole_for_job_;
};

}  // namespace ember::worker
