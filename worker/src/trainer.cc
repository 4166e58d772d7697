// A worker's life, top to bottom: set up (job, model, cache, stages), then for each step
// the loader hands over, one iteration through the stages in order (stages/ps_exchange.h
// with host/host_exchange.h beside it, stages/compute_step.h, stages/row_updates.h), the
// flush that evaluations and checkpoints need, and the report; then the end of the job.
#include "ember/worker/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "checkpoint/checkpoint_life.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/scheduler/batch_stream.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/scheduler_config.h"
#include "ember/scheduler/simulator.h"
#include "ember/worker/device.h"
#include "ember/worker/row_cache.h"
#include "host/host_channels.h"
#include "host/host_exchange.h"
#include "job/collective.h"
#include "job/job.h"
#include "report/evaluation.h"
#include "report/held_rows.h"
#include "report/run_report.h"
#include "stages/compute_step.h"
#include "stages/loader.h"
#include "stages/phase_clock.h"
#include "stages/ps_exchange.h"
#include "stages/replicas.h"
#include "stages/row_updates.h"

namespace ember::worker {

namespace {

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
  // A dataset of hashed ids' KeyDirectory over the shards' slots (none: fixed tables).
  std::optional<StartDirectory> key_directory();
  // Where a resumed stream job's loader goes on (empty: not a stream, or not resumed).
  std::string stream_start();
  // The model, its optimizer and the stages (after joining).
  void make_stages(const scheduler::SchedulerConfig& sc);
  // One iteration, through the stages in order. With prefetch, takes the next step from
  // the loader into `ahead` (unless s is the last) and starts its prefetched pulls.
  void train(Step& s, Loader& loader, std::optional<Step>& ahead, PhaseClock& clock);
  // After iteration s: the flush an evaluation, a checkpoint or the end needs.
  void flush(const Step& s);
  TrainSummary finish(std::uint64_t end, double seconds);
  // The transport's byte counts into wire_: by kind, and by link (hosts.h).
  void take_tallies() {
    wire_.framed = job_.ps().tally();
    wire_.links = link_traffic(job_.hosts(), job_.rank(), job_.ps().tally_by_shard(), job_.ps().socket_bytes_by_shard(),
                               c_.allreduce == "hierarchical", wire_.allreduce_bytes, wire_.handed);
  }

  TrainConfig c_;
  Job job_;
  torch::Device device_{torch::kCPU};
  std::optional<data::Dataset> ds_;
  std::optional<RunReport> report_;
  std::optional<CheckpointLife> life_;
  std::optional<Collective> collective_;
  std::unique_ptr<HostChannel> host_channel_;   // the host tier's, until host_ takes it (null: off, or alone on the host)
  std::unique_ptr<EvictionChannel> evictions_;  // --scheduler-per-host's (null: off, or one host)
  std::optional<RowHandover> handover_;         // evaluations' held rows to worker 0 (none: no --eval-every)
  std::shared_ptr<CtrModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<RowCache> cache_;
  std::optional<Replicas> replicas_;
  std::optional<PsExchange> exchange_;
  std::optional<HostExchange> host_;
  std::optional<ComputeStep> compute_;
  bool on_demand_ = false;
  std::shared_ptr<const scheduler::KeyDirectory> final_directory_;  // dynamic tables: after the last step
  WireCounts wire_;
  PhaseTimes phases_;
  double auc_ = -1, logloss_ = -1;
};

std::string Worker::stream_start() {
  // A stream job's checkpoint resumed as a --dataset job has no stream to seek.
  if (c_.stream.empty()) return {};
  if (!life_->restored_stream_position().empty()) return life_->restored_stream_position();
  // A directory starts at its first file; a resume without a saved position skips the
  // batches trained.
  if (c_.stream.rfind("kafka://", 0) != 0 || life_->first() > 0) return {};
  // Kafka: where each partition starts (its earliest offset) is decided once, by worker
  // 0, for every worker: retention between two workers' starts would part them.
  constexpr const char* kKey = "stream_start";
  if (job_.rank() != 0) return job_.control().lookup(kKey, c_.join_timeout);
  const std::size_t batch = static_cast<std::size_t>(c_.workers) * c_.batch_per_worker;
  const std::string start = data::open_stream(scheduler::stream_options(c_), batch)->start_position_json();
  job_.control().publish(kKey, start);
  spdlog::info("worker 0: the stream starts at {}", start);
  return start;
}

std::optional<StartDirectory> Worker::key_directory() {
  if (!ds_->manifest().hashed_ids) return std::nullopt;
  const std::uint32_t shards = job_.ps().shards();
  const std::uint64_t per_shard = job_.ps_config().num_keys / shards, batch_ids = scheduler::batch_ids_bound(*ds_, c_);
  if (c_.shard_max_rows > 0 && per_shard < scheduler::KeyDirectory::slots_needed(c_.shard_max_rows, batch_ids)) {
    throw ConfigError("--shard-max-rows " + std::to_string(c_.shard_max_rows) + " and a global batch's " + std::to_string(batch_ids) +
                      " ids need " + std::to_string(scheduler::KeyDirectory::slots_needed(c_.shard_max_rows, batch_ids)) +
                      " slots a shard; the shards have " + std::to_string(per_shard) + " (ember-ps --slots-per-shard)");
  }
  const scheduler::DynamicTableOptions options = scheduler::dynamic_table_options(c_, shards);
  const std::string& saved = life_->restored_directory();
  if (!saved.empty()) {
    // A checkpoint of other shards (or slots): its rows were re-placed on the shards' restore,
    // the directory is alike. (Of the same: the loader replays it, as the scheduler.)
    const std::string origin = "--resume: the key directory of iteration " + std::to_string(life_->first()) + "'s dense checkpoint";
    scheduler::KeyDirectory d = scheduler::KeyDirectory::load(saved, origin);
    if (d.options().shards != shards || d.slots_per_shard() != per_shard) {
      spdlog::info("worker {}: resuming dynamic tables of {} shards x {} slots on {} x {}: {} rows re-placed, caches start empty",
                   job_.rank(), d.options().shards, d.slots_per_shard(), shards, per_shard, d.totals().live);
      return StartDirectory{d.reshard(options, per_shard, batch_ids, life_->first()), true, stream_start()};
    }
    if (d.placed_at() > 0 || !c_.stream.empty()) {
      // Re-placed by an earlier resume: a replay from iteration 0 would not make its slots.
      // On a stream: its early files may be gone; it goes on from the saved position.
      if (!d.decides_as(options)) throw ConfigError(origin + ": saved with other --create-after, --expire-after or --shard-max-rows");
      spdlog::info("worker {}: resuming dynamic tables {}: caches start empty", job_.rank(),
                   c_.stream.empty() ? "placed anew at iteration " + std::to_string(d.placed_at()) : std::string("of a stream"));
      return StartDirectory{std::move(d), true, stream_start()};
    }
  }
  return StartDirectory{scheduler::KeyDirectory(options, per_shard), false, stream_start()};
}

scheduler::SchedulerConfig Worker::set_up() {
  device_ = parse_device(c_.device);
  resolve_cache_backend(c_.cache_backend, device_);  // --cache-backend errors before joining
  ds_.emplace(scheduler::open_job_data(c_.dataset, c_));
  const bool dynamic = ds_->manifest().hashed_ids;
  // (A host's gradient parts may outlive a dropped row: not with dynamic tables yet.)
  if (dynamic && c_.host_aggregation) throw ConfigError("--host-aggregation does not apply to dynamic tables (hashed ids) yet");
  // Config errors before joining; dynamic tables' key space is the shards' slots, known
  // once joined.
  scheduler::SchedulerConfig sc;
  if (!dynamic) sc = scheduler::make_scheduler_config(*ds_, c_);
  at::set_num_threads(c_.torch_threads);
  report_.emplace(c_);
  CheckpointLife::check(c_);
  job_.join(*ds_);
  if (dynamic) {
    c_.dynamic_slots = job_.ps_config().num_keys;
    sc = scheduler::make_scheduler_config(*ds_, c_);
  }
  on_demand_ = sc.policy.sync() == scheduler::Sync::kOnDemand;
  scheduler::set_hosts(sc, c_, job_.hosts().host_of, job_.hosts().host_of[job_.rank()]);
  sc.id_rows_for = static_cast<int>(job_.rank());  // each id's row in this worker's plans: no lookup per id
  report_->set_rank(job_.rank());
  life_.emplace(c_, job_);
  collective_.emplace(c_, c_.workers, job_.control(), job_.rank(), device_, job_.hosts());
  if (c_.host_aggregation || c_.peer_sync) host_channel_ = make_host_channel(c_, job_.control(), job_.rank(), job_.hosts());
  if (c_.scheduler_per_host && job_.hosts().hosts() > 1) {
    evictions_ = make_eviction_channel(c_, c_.workers, job_.control(), job_.rank());
    spdlog::info("worker {}: its scheduler models host {}'s {} workers of {}; the hosts exchange their evictions", job_.rank(),
                 sc.model_host, job_.hosts().workers[job_.hosts().host_of[job_.rank()]].size(), c_.workers);
  }
  // Evaluations before the end take held rows from their holders (Scheduler::flush).
  if (c_.eval_every > 0 && sc.hand_evaluated_rows && sc.policy.sync() != scheduler::Sync::kBoundedStaleness)
    handover_.emplace(c_, c_.workers, job_.control(), job_.rank());
  make_stages(sc);
  sc.first_iteration = life_->first();
  return sc;
}

void Worker::make_stages(const scheduler::SchedulerConfig& sc) {
  const ps::JobConfig& ps = job_.ps_config();
  const std::uint32_t rank = job_.rank(), dim = job_.dim();
  c_.model.num_dense = static_cast<std::uint32_t>(ds_->num_dense());
  c_.model.num_tables = static_cast<std::uint32_t>(ds_->num_tables());
  c_.model.dim = dim;
  if (c_.model.scripted()) c_.model.file = std::filesystem::absolute(c_.model.file).string();  // readable from anywhere
  torch::manual_seed(c_.seed);
  model_ = make_model(c_.model);  // initialized on the CPU: the same weights on every device
  // What checkpoints and dumps record, so that they are not read back through another
  // file (make_model compares it then).
  if (c_.model.scripted()) c_.model.file_identity = model_file_identity(c_.model.file);
  model_->to(device_);
  optimizer_ = make_dense_optimizer(c_.dense_optimizer, model_->parameters(), c_.dense_lr);
  life_->restore(*model_, *optimizer_, device_);
  // Uncached rows are staged in slots past the cache's, for one iteration.
  const std::uint32_t slots = sc.cache_rows + sc.staging_rows();
  cache_ = make_row_cache(c_.cache_backend, device_, slots, dim, job_.state_floats());
  spdlog::info("worker {}: model {}, policy {}, cache {} rows + {} staging ({:.1f} MB, {} backend on {}){}", rank, c_.model.kind, c_.policy,
               sc.cache_rows, sc.staging_rows(), cache_->memory_bytes() / 1e6, cache_->backend(), device_.str(),
               c_.placement.empty() ? "" : ", placement " + c_.placement);
  replicas_.emplace(dim, job_.state_floats());
  if (!sc.replicated.empty()) replicas_->load(job_.ps(), sc.replicated, wire_, rank);
  const scheduler::RowFormat row{dim, job_.state_floats()};
  exchange_.emplace(job_.ps(), *cache_, wire_, row, slots);
  host_.emplace(*cache_, wire_, row, std::move(host_channel_));
  compute_.emplace(*model_, *optimizer_, *collective_, *replicas_, device_, c_, dim, ps.optimizer, wire_);
  if (c_.progressive_window > 0) {
    compute_->on_scored(
        [this](std::uint64_t t, const float* logits, const float* marks, std::size_t n) { report_->scored(t, logits, marks, n); });
  }
}

void Worker::train(Step& s, Loader& loader, std::optional<Step>& ahead, PhaseClock& clock) {
  const scheduler::StepPlan& p = s.plan;
  const std::uint64_t t = s.iteration;
  // sync: the rows applied within the host last iteration first; partial gradients and
  // dirty values other workers need, acknowledged.
  const ps::OptimizerConfig& optimizer = job_.ps_config().optimizer;
  host_->finish_apply(optimizer);
  exchange_->sync_pushes(p, false, s.host.sync, host_->hand_grads(s.host.sync, slots_of(p.push_grads)));
  // Peer sync hands rows over from the cache: in a resumed job's first step, once the
  // cache is restored (below). (Its sync pushes are all of flushed rows: none is made.)
  const bool restoring = t == life_->first() && t > 0;
  if (!restoring) host_->hand_values(p, s.host.peer);
  // Dynamic tables: the rows made and dropped, named to their shards before the commit
  // that resets them.
  if (!s.resets.empty()) exchange_->reset_rows(s.resets, t);
  clock.lap(&PhaseTimes::sync);
  // commit: after every worker's sync pushes; flagged for checkpoints and stops.
  job_.control().barrier(transport::BarrierGroup::kWorkers, barrier_before_commit(t));
  life_->commit(*exchange_, t);
  clock.lap(&PhaseTimes::commit);
  // pulls: a resumed job's cached rows, evictions and pulls; with prefetch, t + 1's plan
  // is ready (the loader plans ahead): its rows whose PS copy is final travel now.
  if (!s.restore.empty()) exchange_->restore(s.restore, t);
  wire_.exchange_bytes_out += s.exchanged.out;
  wire_.exchange_bytes_in += s.exchanged.in;
  if (restoring) host_->hand_values(p, s.host.peer);
  if (!p.pulls.empty()) {
    // The evicted partial gradients handed over first; the rows one worker of the host
    // pulled for the others, and peer sync's, once the PS's are in.
    exchange_->pull(p, t, s.host, host_->hand_grads(s.host.evict, evicted_partials(p)));
    host_->hand_pulled_rows(p, s.host.pull);
    host_->take_peer_rows(p, t);
  } else {
    exchange_->pull(p, t, s.host);
  }
  // A PS disk tier reads the rows of an iteration --lookahead ahead meanwhile.
  if (!s.hint_keys.empty()) exchange_->hint(s.hint_keys, s.hint_iteration);
  if (c_.prefetch && !s.last) {
    clock.lap(&PhaseTimes::pull);
    ahead = loader.next();
    clock.lap(&PhaseTimes::wait);
    exchange_->prefetch(ahead->plan, t, ahead->host);
  }
  clock.lap(&PhaseTimes::pull);
  // The dense model stepped first (t - 1's all-reduce, when it overlapped this PS
  // exchange); the rows pooled, the model's forward and backward.
  compute_->wait_allreduce(clock);
  compute_->embed(s, *cache_);
  clock.lap(&PhaseTimes::embedding);
  compute_->forward_backward(s);
  clock.lap(&PhaseTimes::compute);
  // Dense gradients and loss summed, the bags' gradients into the rows.
  compute_->allreduce(s.flush, clock);
  // pushes: full-set policies' end pushes (they read the row gradients).
  exchange_->end_pushes(p, t, s.host.end, host_->hand_grads(s.host.end, slots_of(p.end_pushes)));
  clock.lap(&PhaseTimes::push);
  // row updates: peer sync's gradients to their host's applier; local optimizer for rows
  // trained here alone (or applied in the host), partials kept, drops.
  host_->start_apply(p, s.host.apply);
  update_rows(p, t, on_demand_, optimizer, *cache_, *exchange_);
  clock.lap(&PhaseTimes::update);
}

void Worker::flush(const Step& s) {
  const std::uint64_t t = s.iteration;
  Stopwatch clock;
  // The all-reduce is complete (ComputeStep::allreduce waits at a flush): the hot rows
  // and the dense model are evaluated and saved as trained.
  host_->finish_apply(job_.ps_config().optimizer);
  exchange_->sync_pushes(s.flush_plan, true, s.flush_host, host_->hand_grads(s.flush_host, slots_of(s.flush_plan.push_grads)));
  replicas_->push(job_.ps(), s.flush_plan.replicated_flush, wire_);  // worker 0's plan lists them: the replicas agree
  HeldRows held;
  if (s.evaluate && handover_) {
    held = handover_->hand(s.flush_plan, s.eval_hands_of, *cache_, job_.dim());
    wire_.rows.eval_handed += s.flush_plan.eval_hands.size();
  }
  if (!s.final_resets.empty()) exchange_->reset_rows(s.final_resets, t + 1);  // at the final commit, t + 1
  job_.control().barrier(transport::BarrierGroup::kWorkers, barrier_after_flush(t));
  life_->commit_flush(*exchange_, s);
  if (job_.rank() == 0 && s.evaluate) {
    const double flush_s = clock.seconds();
    clock.reset();
    const Evaluation e = evaluate(*ds_, c_, job_.ps(), *model_, device_, job_.dim(), t, held, s.directory.get());
    if (e.ran) {
      auc_ = e.auc;
      logloss_ = e.logloss;
      report_->evaluation(t, e.auc, e.logloss, e.samples, flush_s, clock.seconds());
    }
  }
  life_->flushed(s, *model_, *optimizer_);
}

TrainSummary Worker::run() {
  scheduler::SchedulerConfig sc = set_up();
  const std::uint64_t first = life_->first();
  // Without a directory for the dense state the PS's checkpoints still get flushed rows.
  std::optional<HostGroup> host;
  if (host_->active()) {
    host = host_group(job_.hosts(), job_.rank());
    host->aggregate = c_.host_aggregation;
    host->peer = c_.peer_sync;
    if (host->aggregate) exchange_->group_as(host->ranks.front() + 1);  // one id per host
  }
  Loader loader(*ds_, std::move(sc), c_, job_.rank(), job_.ps_config().schedule(), life_->asked(), life_->stop_at(), std::move(host),
                evictions_.get(), job_.ps_config().disk_tier, key_directory());
  Stopwatch total;
  report_->start(first);
  std::uint64_t end = c_.iterations;  // earlier if the job is stopped
  CheckpointLife::StopWindow stop_window = life_->stop_window();
  std::optional<Step> ahead;  // the next step, taken early for its prefetches
  PhaseClock clock(phases_, device_);
  for (std::uint64_t t = first; t < c_.iterations; ++t) {
    Stopwatch it_clock;
    report_->begin(wire_, phases_);
    const double waited = phases_.wait;
    Step s = ahead ? std::move(*ahead) : loader.next();
    ahead.reset();
    clock.lap(&PhaseTimes::wait);
    if (auto why = job_.control().failure()) throw JobFailed("job failed: " + *why);
    train(s, loader, ahead, clock);
    life_->check_stop(s);
    if (s.flush) {
      flush(s);
      clock.lap(&PhaseTimes::flush);
    }
    take_tallies();
    report_->iteration(s, it_clock.millis(), (phases_.wait - waited) * 1e3,
                       compute_->loss_known() ? std::optional(compute_->loss()) : std::nullopt, wire_, phases_);
    clock.lap(&PhaseTimes::update);  // the iteration's bookkeeping
    if (s.last) {
      end = t + 1;
      final_directory_ = s.directory;
      break;
    }
  }
  stop_window.end();  // training is over: a signal now ends the process
  return finish(end, total.seconds());
}

TrainSummary Worker::finish(std::uint64_t end, double seconds) {
  const std::uint32_t rank = job_.rank();
  TrainSummary sum;
  sum.rank = rank;
  sum.seconds = seconds;
  sum.iterations = end - life_->first();
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
  if (rank == 0 && !c_.dump_dir.empty())
    dump_model(c_, job_.ps(), *model_, job_.ps_config().num_keys, job_.dim(), end - 1, final_directory_.get());
  take_tallies();  // every request this worker made, the dump's reads included
  // Everyone waits for worker 0's evaluation and dump before leaving.
  job_.control().barrier(transport::BarrierGroup::kWorkers, barrier_before_leaving(end));
  sum.wire = wire_;
  sum.hosts = job_.hosts().hosts();
  sum.allreduce_cross_host_bytes = wire_.links.cross_host.peer_out;
  sum.phases = phases_;
  sum.final_loss = compute_->loss();
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
