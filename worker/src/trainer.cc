// A worker's life, top to bottom: set up (job, model, cache, stages), then for each step
// the loader hands over, one iteration through the stages in order (ps_exchange.h,
// compute_step.h, row_updates.h), the flush that evaluations and checkpoints need, and
// the report; then the end of the job.
#include "ember/worker/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <utility>

#include "checkpoint_requests.h"
#include "collective.h"
#include "compute_step.h"
#include "dense_checkpoint.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/worker/device.h"
#include "ember/worker/row_cache.h"
#include "evaluation.h"
#include "job.h"
#include "loader.h"
#include "ps_exchange.h"
#include "replicas.h"
#include "row_updates.h"
#include "run_report.h"

namespace ember::worker {

namespace {

scheduler::SchedulerConfig scheduler_config(const data::Dataset& ds, const TrainConfig& c) {
  scheduler::SchedulerOptions o;
  o.workers = c.workers;
  o.batch_per_worker = c.batch_per_worker;
  o.cache_ratio = c.cache_ratio;
  o.policy = c.policy;
  o.seed = c.seed;
  o.shuffle = c.shuffle;
  o.iterations = c.iterations;  // fae profiles its hot rows over the batches this job trains
  o.threads = c.sched_threads;
  o.for_training = true;
  o.lookahead = c.lookahead;
  o.eviction = c.eviction;
  o.prefetch = c.prefetch;
  o.refine_allocation = c.refine_allocation;
  o.placement = c.placement;
  return scheduler::make_scheduler_config(ds, o);
}

// A signal to this worker stops the job at a checkpoint while it trains, if the PS
// shards checkpoint and the dense state has a place (otherwise it ends the process).
class StopPossible {
 public:
  StopPossible(StopRequest* r, bool can) : stop_(can ? r : nullptr) {
    if (stop_ != nullptr) stop_->possible = true;
  }
  ~StopPossible() { end(); }
  void end() {
    if (stop_ != nullptr) stop_->possible = false;
    stop_ = nullptr;
  }

 private:
  StopRequest* stop_;
};

class Worker {
 public:
  explicit Worker(TrainConfig c) : c_(std::move(c)), job_(c_) {}
  // The stages hold references to the members.
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  TrainSummary run();
  [[noreturn]] void fail(std::exception_ptr error) { job_.fail(error); }

 private:
  // Everything before the first iteration; returns the scheduler's configuration.
  scheduler::SchedulerConfig set_up();
  // One iteration, through the stages in order. With prefetch, takes the next step from
  // the loader into `ahead` (unless s is the last) and starts its prefetched pulls.
  void train(Step& s, Loader& loader, std::optional<Step>& ahead);
  // Completes the dense all-reduce in flight (overlapped with the PS exchange), if any.
  void finish_allreduce();
  // After iteration s: the flush an evaluation, a checkpoint or the end needs.
  void flush(const Step& s);
  TrainSummary finish(std::uint64_t end, double seconds);

  TrainConfig c_;
  Job job_;
  torch::Device device_{torch::kCPU};
  std::optional<data::Dataset> ds_;
  std::optional<RunReport> report_;
  std::optional<Collective> collective_;
  std::shared_ptr<CtrModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<RowCache> cache_;
  std::optional<Replicas> hot_;
  std::optional<PsExchange> exchange_;
  std::optional<ComputeStep> compute_;
  std::optional<CheckpointRequests> requests_;
  std::optional<DenseCheckpoints> dense_checkpoints_;
  std::uint64_t first_ = 0;  // the first iteration (a resumed job's restored one)
  bool on_demand_ = false;
  bool checkpoint_commit_ = false;  // the next commit's: flushed for a checkpoint
  WireCounts wire_;
  PhaseTimes phases_;
  double last_loss_ = 0, auc_ = -1, logloss_ = -1;
};

scheduler::SchedulerConfig Worker::set_up() {
  device_ = parse_device(c_.device);
  resolve_cache_backend(c_.cache_backend, device_);  // --cache-backend errors before joining
  ds_.emplace(data::Dataset::open(c_.dataset));
  auto sc = scheduler_config(*ds_, c_);  // config errors before joining
  on_demand_ = sc.policy.sync() == scheduler::Sync::kOnDemand;
  at::set_num_threads(c_.torch_threads);
  report_.emplace(c_);
  if (c_.resume && c_.checkpoint_dir.empty())
    throw ConfigError("--resume needs --checkpoint-dir (where the workers wrote their dense state)");
  job_.join(*ds_);
  const ps::JobConfig& ps = job_.ps_config();
  const std::uint32_t rank = job_.rank(), dim = job_.dim();
  report_->set_rank(rank);
  requests_.emplace(c_.stop, rank);
  // A resumed job starts where the PS's restored checkpoint left off.
  if (c_.resume) {
    if (ps.restored_iteration < 0) {
      throw ConfigError("--resume: the PS shards restored no checkpoint of an iteration (start ember-ps with --restore DIR)");
    }
    first_ = static_cast<std::uint64_t>(ps.restored_iteration);
    if (first_ >= c_.iterations) {
      throw ConfigError("--resume: the PS restored iteration " + std::to_string(first_) + ", at or past --iterations " +
                        std::to_string(c_.iterations) + " (a finished job's model: raise --iterations to train on)");
    }
  }
  if (!c_.checkpoint_dir.empty() && !ps.checkpoints && !c_.resume) {
    spdlog::warn("--checkpoint-dir {}: the PS shards have no --checkpoint-dir, so no dense state is written", c_.checkpoint_dir);
  }
  collective_.emplace(c_, job_.control(), rank, device_);
  c_.model.num_dense = static_cast<std::uint32_t>(ds_->num_dense());
  c_.model.num_tables = static_cast<std::uint32_t>(ds_->num_tables());
  c_.model.dim = dim;
  torch::manual_seed(c_.seed);
  model_ = make_model(c_.model);  // initialized on the CPU: the same weights on every device
  model_->to(device_);
  optimizer_ = make_dense_optimizer(c_.dense_optimizer, model_->parameters(), c_.dense_lr);
  dense_checkpoints_.emplace(c_, rank, ps.num_keys, dim, ps.seed, [this](std::uint64_t it) {
    auto& control = job_.control();
    const auto lookup = [&control](const std::string& key) { return control.try_lookup(key); };
    const auto i = static_cast<std::int64_t>(it);
    return lookup(ps::shards_whole_key(i)).has_value() && ps::dense_states_ok(lookup, i, c_.workers);
  });
  if (c_.resume) dense_checkpoints_->load(first_, *model_, *optimizer_, device_);
  // Uncached rows are staged in slots past the cache's, for one iteration.
  const std::uint32_t slots = sc.cache_rows + sc.staging_rows();
  cache_ = make_row_cache(c_.cache_backend, device_, slots, dim, job_.state_floats());
  spdlog::info("worker {}: model {}, policy {}, cache {} rows + {} staging ({:.1f} MB, {} backend on {}){}", rank, c_.model.kind, c_.policy,
               sc.cache_rows, sc.staging_rows(), cache_->memory_bytes() / 1e6, cache_->backend(), device_.str(),
               c_.placement.empty() ? "" : ", placement " + c_.placement);
  hot_.emplace(dim, job_.state_floats());
  if (!sc.replicated.empty()) hot_->load(job_.ps(), sc.replicated, wire_, rank);
  exchange_.emplace(job_.ps(), job_.control(), *cache_, wire_, dim, job_.state_floats(), slots);
  compute_.emplace(*model_, *optimizer_, *collective_, *hot_, device_, c_, dim, ps.optimizer);
  sc.first_iteration = first_;
  return sc;
}

void Worker::finish_allreduce() {
  if (compute_->allreduce_pending()) last_loss_ = compute_->finish_allreduce(wire_);
}

void Worker::train(Step& s, Loader& loader, std::optional<Step>& ahead) {
  const scheduler::StepPlan& p = s.plan;
  const std::uint64_t t = s.iteration;
  // Each phase's wall time: the stopwatch is read and restarted at its end.
  Stopwatch clock;
  auto lap = [&clock](double& phase) {
    phase += clock.seconds();
    clock.reset();
  };
  exchange_->sync_pushes(p, false);
  lap(phases_.sync);
  exchange_->barrier(barrier_before_commit(t));
  requests_->heard(exchange_->commit(t, requests_->commit_flags(std::exchange(checkpoint_commit_, false))));
  lap(phases_.commit);
  if (!s.restore.empty()) exchange_->restore(s.restore, t);
  exchange_->pull(p, t);
  if (c_.prefetch && !s.last) {
    // t + 1's plan is ready (the loader plans ahead): its rows whose PS copy is final
    // travel while this iteration computes.
    ahead = loader.next();
    exchange_->prefetch(ahead->plan, t);
  }
  lap(phases_.pull);
  // The dense model must be stepped before this forward pass.
  finish_allreduce();
  lap(phases_.allreduce);
  const U64Map<std::uint32_t> row_of = index_rows(p);
  compute_->forward_backward(s, row_of, *cache_);
  lap(phases_.compute);
  compute_->start_allreduce();
  if (!c_.overlap_allreduce) finish_allreduce();
  lap(phases_.allreduce);
  compute_->update_rows(*cache_);
  lap(phases_.update);
  exchange_->end_pushes(p, row_of, t);
  lap(phases_.push);
  update_rows(p, t, on_demand_, job_.ps_config().optimizer, *cache_, *exchange_);
  lap(phases_.update);
}

void Worker::flush(const Step& s) {
  const std::uint64_t t = s.iteration;
  finish_allreduce();  // the hot rows and the dense model are evaluated and saved
  exchange_->sync_pushes(s.flush_plan, true);
  hot_->push(job_.ps(), s.flush_plan.replicated_flush, wire_);  // worker 0's plan lists them: the replicas agree
  // The last flush commits the iteration after, flagged: shards with a checkpoint
  // directory write the finished model, from which a longer run can resume.
  exchange_->barrier(barrier_after_flush(t));
  requests_->heard(exchange_->commit(s.last ? t + 1 : t, requests_->commit_flags(s.last)));
  if (job_.rank() == 0 && s.evaluate) {
    const Evaluation e = evaluate(*ds_, c_, job_.ps(), *model_, device_, job_.dim(), t);
    if (e.ran) {
      auc_ = e.auc;
      logloss_ = e.logloss;
      report_->evaluation(t, e.auc, e.logloss, e.samples);
    }
  }
  if (s.checkpoint || s.last) {
    checkpoint_commit_ = s.checkpoint;
    if (job_.ps_config().checkpoints) {
      // Every worker says what became of its part, so that shards and workers prune by
      // checkpoints whole for the job.
      const char* state = "none";
      if (!c_.checkpoint_dir.empty()) state = dense_checkpoints_->save(t + 1, *model_, *optimizer_) ? "written" : "failed";
      job_.control().publish(ps::dense_state_key(static_cast<std::int64_t>(t + 1), job_.rank()), state);
    }
  }
}

TrainSummary Worker::run() {
  scheduler::SchedulerConfig sc = set_up();
  // Without a directory for the dense state the PS's checkpoints still get flushed rows.
  Loader loader(*ds_, std::move(sc), c_, job_.rank(), job_.ps_config().schedule(), requests_->asked(), requests_->stop_at());
  Stopwatch total;
  report_->start(first_);
  std::uint64_t end = c_.iterations;  // earlier if the job is stopped
  StopPossible stop_possible(c_.stop, job_.ps_config().checkpoints && !c_.checkpoint_dir.empty());
  std::optional<Step> ahead;  // the next step, taken early for its prefetches
  for (std::uint64_t t = first_; t < c_.iterations; ++t) {
    Stopwatch it_clock;
    Step s = ahead ? std::move(*ahead) : loader.next();
    ahead.reset();
    const double wait_ms = it_clock.millis();
    if (auto why = job_.control().failure()) throw JobFailed("job failed: " + *why);
    report_->begin(wire_, phases_);
    train(s, loader, ahead);
    if (const std::uint64_t stop = requests_->stop_at().load(); stop > 0 && t + 1 >= stop && !s.last) {
      // Cannot happen within kCheckpointLead; the other workers stop, so say why this one cannot.
      throw Error("the job was asked to stop at iteration " + std::to_string(stop) + ", which this worker learned after planning past it");
    }
    if (s.flush) flush(s);
    wire_.framed = job_.ps().tally();
    report_->iteration(s, it_clock.millis(), wait_ms, last_loss_, wire_, phases_);
    if (s.last) {
      end = t + 1;
      break;
    }
  }
  finish_allreduce();
  stop_possible.end();  // training is over: a signal now ends the process
  return finish(end, total.seconds());
}

TrainSummary Worker::finish(std::uint64_t end, double seconds) {
  const std::uint32_t rank = job_.rank();
  TrainSummary sum;
  sum.rank = rank;
  sum.seconds = seconds;
  sum.iterations = end - first_;
  sum.samples_per_s = static_cast<double>(c_.workers) * c_.batch_per_worker * static_cast<double>(sum.iterations) / sum.seconds;
  if (end < c_.iterations) {
    sum.stopped_at = end;
    if (rank == 0) {
      spdlog::info(
          "the job stopped at iteration {} of {}, as asked (a signal to a PS shard or a worker): its checkpoint holds the model "
          "(resume with --resume)",
          end, c_.iterations);
    }
  }
  wire_.framed = job_.ps().tally();
  if (rank == 0 && !c_.dump_dir.empty()) dump_model(c_, job_.ps(), *model_, job_.ps_config().num_keys, job_.dim(), end - 1);
  // Everyone waits for worker 0's evaluation and dump before leaving.
  job_.control().barrier(transport::BarrierGroup::kWorkers, barrier_before_leaving(end));
  sum.wire = wire_;
  sum.phases = phases_;
  sum.final_loss = last_loss_;
  sum.auc = auc_;
  sum.logloss = logloss_;
  report_->summary(sum);
  job_.control().leave();
  return sum;
}

}  // namespace

TrainSummary run_worker(const TrainConfig& config) {
  Worker w(config);
  try {
    return w.run();
  } catch (...) {
    w.fail(std::current_exception());
  }
}

}  // namespace ember::worker
