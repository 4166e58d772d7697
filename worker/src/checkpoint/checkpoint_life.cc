#include "checkpoint/checkpoint_life.h"

#include <spdlog/spdlog.h>

#include <string>
#include <utility>

#include "ember/common/error.h"
#include "ember/ps/job_config.h"
#include "ember/ps/protocol.h"

namespace ember::worker {

void CheckpointLife::check(const TrainConfig& c) {
  if (c.resume && c.checkpoint_dir.empty())
    throw ConfigError("--resume needs --checkpoint-dir (where the workers wrote their dense state)");
}

CheckpointLife::CheckpointLife(const TrainConfig& c, Job& job)
    : c_(c),
      job_(job),
      rank_(job.rank()),
      dense_(c, job.rank(), job.ps_config().num_keys, job.dim(), job.ps_config().seed, [this](std::uint64_t it) {
        auto& control = job_.control();
        const auto lookup = [&control](const std::string& key) { return control.try_lookup(key); };
        const auto i = static_cast<std::int64_t>(it);
        return lookup(ps::shards_whole_key(i)).has_value() && ps::dense_states_ok(lookup, i, c_.workers);
      }) {
  const ps::JobConfig& ps = job.ps_config();
  // A resumed job starts where the PS's restored checkpoint left off.
  if (c.resume) {
    if (ps.restored_iteration < 0) {
      throw ConfigError("--resume: the PS shards restored no checkpoint of an iteration (start ember-ps with --restore DIR)");
    }
    first_ = static_cast<std::uint64_t>(ps.restored_iteration);
    if (first_ >= c.iterations) {
      throw ConfigError("--resume: the PS restored iteration " + std::to_string(first_) + ", at or past --iterations " +
                        std::to_string(c.iterations) + " (a finished job's model: raise --iterations to train on)");
    }
  }
  if (!c.checkpoint_dir.empty() && !ps.checkpoints && !c.resume) {
    spdlog::warn("--checkpoint-dir {}: the PS shards have no --checkpoint-dir, so no dense state is written", c.checkpoint_dir);
  }
}

void CheckpointLife::restore(CtrModel& model, torch::optim::Optimizer& optimizer, torch::Device device) {
  if (c_.resume) restored_ = dense_.load(first_, model, optimizer, device);
}

CheckpointLife::StopWindow CheckpointLife::stop_window() const {
  return StopWindow(c_.stop, job_.ps_config().checkpoints && !c_.checkpoint_dir.empty());
}

void CheckpointLife::commit(PsExchange& exchange, std::uint64_t t) {
  heard(exchange.commit(t, commit_flags(std::exchange(checkpoint_commit_, false))));
}

void CheckpointLife::commit_flush(PsExchange& exchange, const Step& s) {
  heard(exchange.commit(s.last ? s.iteration + 1 : s.iteration, commit_flags(s.last)));
}

void CheckpointLife::flushed(const Step& s, CtrModel& model, torch::optim::Optimizer& optimizer) {
  if (!s.checkpoint && !s.last) return;
  checkpoint_commit_ = s.checkpoint;
  if (!job_.ps_config().checkpoints) return;
  // Every worker says what became of its part.
  const std::uint64_t at = s.iteration + 1;
  const char* state = "none";
  if (!c_.checkpoint_dir.empty()) state = dense_.save(at, model, optimizer, s.directory_state, s.stream_position) ? "written" : "failed";
  job_.control().publish(ps::dense_state_key(static_cast<std::int64_t>(at), rank_), state);
}

void CheckpointLife::check_stop(const Step& s) const {
  if (const std::uint64_t stop = stop_at_.load(); stop > 0 && s.iteration + 1 >= stop && !s.last) {
    // The other workers stop, so say why this one cannot.
    throw Error("the job was asked to stop at iteration " + std::to_string(stop) + ", which this worker learned after planning past it");
  }
}

std::uint32_t CheckpointLife::commit_flags(bool checkpoint) {
  std::uint32_t flags = checkpoint ? ps::kCommitCheckpoint : 0;
  // Every commit says so until a shard names the stop (one flushing for a checkpoint
  // asked for earlier names it once that is written).
  StopRequest* stop = c_.stop;
  if (stop != nullptr && stop->signal.load() != 0 && stop_at_.load() == 0) {
    if (stop_commits_++ == 0) spdlog::info("worker {}: asking the PS shards to stop the job at a checkpoint", rank_);
    if (stop_commits_ > 2 * ps::kCheckpointLead) {
      throw Error("signal " + std::to_string(stop->signal.load()) +
                  " asked this worker to stop the job at a checkpoint, but no PS shard named one in " + std::to_string(stop_commits_ - 1) +
                  " commits");
    }
    flags |= ps::kCommitStop;
  }
  return flags;
}

void CheckpointLife::heard(const CommitNews& news) {
  for (const std::uint64_t at : news.checkpoints_at) {
    if (asked_.add(at) && rank_ == 0) {
      spdlog::info("a PS shard asked for a checkpoint at iteration {}: the workers flush after iteration {}", at, at - 1);
    }
  }
  if (const std::uint64_t at = news.stop_at; at > 0 && (stop_at_.load() == 0 || at < stop_at_.load())) {
    stop_at_ = at;
    if (rank_ == 0) spdlog::info("the job was asked to stop: the workers stop after iteration {}, once it is checkpointed", at - 1);
  }
}

}  // namespace ember::worker
