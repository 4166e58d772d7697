#include "ember/worker/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "ember/cache/embedding_cache.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/common/process.h"
#include "ember/data/dataset.h"
#include "ember/ps/placement.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/ps_service.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/simulator.h"
#include "ember/transport/control.h"
#include "ember/transport/rdma.h"
#include "ember/worker/metrics.h"
#include "ember/worker/row_cache.h"

namespace ember::worker {

namespace fs = std::filesystem;
using json = nlohmann::json;
using scheduler::EvictKind;
using scheduler::StepPlan;

namespace {

// The start of worker `rank`'s dense checkpoint files' names (the iteration follows).
std::string dense_checkpoint_prefix(std::uint32_t rank) { return "worker-" + std::to_string(rank) + "-iter-"; }

}  // namespace

fs::path dense_checkpoint_file(const fs::path& dir, std::uint32_t rank, std::uint64_t iteration) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%09llu", static_cast<unsigned long long>(iteration));
  return dir / (dense_checkpoint_prefix(rank) + digits + ".pt");
}

namespace {

// Checkpoints shards asked for on command (SIGUSR1), told by the training thread and read
// by the loader. A set, not the latest: shards signalled a commit apart name different
// iterations, and each is flushed for (else all but one would hold the PS's rows only).
class AskedCheckpoints {
 public:
  // Whether `at` is new.
  bool add(std::uint64_t at) {
    std::lock_guard lock(mutex_);
    return at_.insert(at).second;
  }
  bool contains(std::uint64_t at) const {
    std::lock_guard lock(mutex_);
    return at_.count(at) > 0;
  }

 private:
  mutable std::mutex mutex_;
  std::set<std::uint64_t> at_;
};

// One iteration's work as the loader hands it over: this worker's plan and the features
// of its samples, copied out of the global batch.
struct Step {
  std::uint64_t iteration = 0;
  StepPlan plan;
  std::vector<Key> keys;       // samples x tables, global keys
  std::vector<float> dense;    // samples x num_dense
  std::vector<float> labels;   // samples
  double sched_ms = 0;
  bool flush = false;          // flush after training this iteration
  StepPlan flush_plan;
  bool evaluate = false;       // worker 0 evaluates after the flush
  bool checkpoint = false;     // the PS checkpoints at the next commit: dense state saved
  bool last = false;
};

// The scheduler, a few iterations ahead of training, in its own thread, from iteration
// `first` (a resumed job) on. The PS checkpoints at commit(I) for (I + 1) %
// checkpoint_every == 0 (0: never) and at I = `asked` (on command; set by the training
// thread before the loader plans I - 1): the iteration before is flushed. At I =
// `stop_at` (set as early) the job stops: I - 1 is the last step, as at --iterations.
class Loader {
 public:
  Loader(const data::Dataset& ds, scheduler::SchedulerConfig sc, const TrainConfig& c, std::uint32_t rank, std::uint64_t checkpoint_every,
         const AskedCheckpoints& asked, const std::atomic<std::uint64_t>& stop_at)
      : ds_(ds), sched_(std::move(sc)), c_(c), rank_(rank), checkpoint_every_(checkpoint_every), asked_(asked), stop_at_(stop_at) {
    thread_ = std::thread([this] {
      name_this_thread("loader");
      run();
    });
  }
  ~Loader() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Next step, or throws what the loader thread threw.
  Step next() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !queue_.empty() || error_; });
    if (queue_.empty()) std::rethrow_exception(error_);
    Step s = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    return s;
  }
  const scheduler::SchedulerConfig& config() const { return sched_.config(); }

 private:
  void run() {
    try {
      data::BatchOptions bo;
      bo.batch_size = static_cast<std::size_t>(c_.workers) * c_.batch_per_worker;
      bo.shuffle = c_.shuffle;
      bo.seed = c_.seed;
      data::BatchReader reader(ds_.split(data::Split::kTrain), bo);
      if (reader.batches_per_epoch() == 0) {
        throw ConfigError("the training split of " + c_.dataset + " holds fewer samples than one global batch (" +
                          std::to_string(bo.batch_size) + ")");
      }
      data::Batch b;
      scheduler::GlobalBatch g;
      std::vector<StepPlan> plans;
      std::uint64_t epoch = 0;
      auto next_batch = [&] {
        if (!reader.next(b)) {
          reader.start_epoch(++epoch);
          reader.next(b);
        }
      };
      const std::uint64_t first = sched_.config().first_iteration;
      for (std::uint64_t t = 0; t < first; ++t) next_batch();  // the batches trained before the checkpoint
      const std::uint32_t T = static_cast<std::uint32_t>(ds_.num_tables()), D = static_cast<std::uint32_t>(ds_.num_dense());
      for (std::uint64_t t = first; t < c_.iterations; ++t) {
        next_batch();
        scheduler::to_global_batch(b, sched_.config().table_offsets, g);
        Step s;
        s.iteration = t;
        s.sched_ms = sched_.schedule(g, plans).sched_ms;
        s.plan = std::move(plans[rank_]);
        for (std::uint32_t i : s.plan.samples) {
          s.keys.insert(s.keys.end(), g.keys.begin() + static_cast<std::ptrdiff_t>(i) * T, g.keys.begin() + static_cast<std::ptrdiff_t>(i + 1) * T);
          const float* d = b.dense(i);
          s.dense.insert(s.dense.end(), d, d + D);
          s.labels.push_back(static_cast<float>(b.label(i)));
        }
        // A stopped job skips the final evaluation (it takes long, and the stop may have a
        // deadline); the resumed job evaluates at its end.
        s.last = t + 1 == c_.iterations || stop_at_.load() == t + 1;
        s.evaluate = t + 1 == c_.iterations || (c_.eval_every > 0 && (t + 1) % c_.eval_every == 0);
        s.checkpoint = !s.last && ((checkpoint_every_ > 0 && (t + 2) % checkpoint_every_ == 0) || asked_.contains(t + 1));
        s.flush = s.evaluate || s.checkpoint || s.last;
        if (s.flush && sched_.config().policy.kind != scheduler::PolicyKind::kHet) {
          sched_.flush(plans);
          s.flush_plan = std::move(plans[rank_]);
        }
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return queue_.size() < 2 || stop_; });
        if (stop_) return;
        const bool last = s.last;
        queue_.push_back(std::move(s));
        cv_.notify_all();
        if (last) return;
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  const data::Dataset& ds_;
  scheduler::Scheduler sched_;
  const TrainConfig& c_;
  std::uint32_t rank_;
  std::uint64_t checkpoint_every_;
  const AskedCheckpoints& asked_;
  const std::atomic<std::uint64_t>& stop_at_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Step> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
};

// What the PS shards serve (published by shard 0), checked against this worker's data.
struct PsConfig {
  std::uint64_t num_keys = 0;
  std::uint32_t dim = 0;
  ps::OptimizerConfig optimizer;
  std::uint64_t seed = 0;
  std::string transport = "tcp";
  std::uint64_t checkpoint_every = 0;  // the PS checkpoints at commit(I), (I + 1) % N == 0
  bool checkpoints = false;            // the PS has a checkpoint directory (also: on command)
  std::int64_t restored_iteration = -1;  // the checkpoint the PS restored (-1: none)
};

torch::Device parse_device(const std::string& text) {
  std::optional<torch::Device> d;
  try {
    d.emplace(text);
  } catch (const c10::Error&) {
    throw ConfigError("--device '" + text + "': choose cpu, cuda or cuda:N");
  }
  if (d->is_cuda() && !torch::cuda::is_available()) {
    throw ConfigError("--device " + text + ": no CUDA device visible to LibTorch (" + std::string(TORCH_VERSION) +
                      (torch::cuda::device_count() == 0 ? ", built without CUDA or no GPU" : "") + "); use --device cpu");
  }
  if (!d->is_cpu() && !d->is_cuda()) throw ConfigError("--device '" + text + "': choose cpu, cuda or cuda:N");
  return *d;
}

PsConfig parse_ps_config(const std::string& text) {
  try {
    auto j = json::parse(text);
    PsConfig p;
    p.num_keys = j.at("num_keys");
    p.dim = j.at("dim");
    p.optimizer.kind = ps::parse_optimizer(j.at("optimizer"));
    p.optimizer.lr = j.at("lr");
    p.optimizer.weight_decay = j.at("weight_decay");
    p.seed = j.at("seed");
    p.transport = j.value("transport", "tcp");
    p.checkpoint_every = j.value("checkpoint_every", std::uint64_t{0});
    p.checkpoints = j.value("checkpoints", p.checkpoint_every > 0);
    p.restored_iteration = j.value("restored_iteration", std::int64_t{-1});
    return p;
  } catch (const json::exception& e) {
    throw ProtocolError(std::string("the PS published a malformed configuration: ") + e.what());
  }
}

scheduler::SchedulerConfig scheduler_config(const data::Dataset& ds, const TrainConfig& c) {
  scheduler::SchedulerConfig sc;
  sc.workers = c.workers;
  sc.batch_per_worker = c.batch_per_worker;
  sc.table_offsets = ds.manifest().table_offsets();
  sc.num_keys = ds.manifest().total_table_rows();
  sc.cache_rows = scheduler::cache_rows_for(c.cache_ratio, sc.num_keys);
  sc.policy = scheduler::parse_policy(c.policy);
  if (sc.policy.kind == scheduler::PolicyKind::kBrute) {
    throw ConfigError("--policy brute is simulator-only (ember-sim); training runs vanilla, laia, plan, herald, het:S or fae:F");
  }
  sc.seed = c.seed;
  sc.threads = c.sched_threads;
  if (sc.policy.kind == scheduler::PolicyKind::kFae) {
    // The hot rows, profiled over the batches this job will train (as ember-sim does):
    // every worker computes the same set from the same data.
    scheduler::SimOptions so;
    so.workers = c.workers;
    so.batch_per_worker = c.batch_per_worker;
    so.iterations = c.iterations;
    so.warmup = 0;
    so.seed = c.seed;
    so.shuffle = c.shuffle;
    so.cache_ratio = c.cache_ratio;
    sc.hot = scheduler::profile_hot_rows(ds, so, sc.policy.hot_fraction);
  }
  return sc;
}

std::unique_ptr<torch::optim::Optimizer> make_dense_optimizer(const std::string& name, std::vector<torch::Tensor> params, float lr) {
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
  if (name == "adagrad") return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(lr));
  throw ConfigError("--dense-optimizer '" + name + "': choose sgd or adagrad");
}

std::vector<float> flatten_params(CtrModel& model) {
  std::vector<float> out;
  for (const auto& p : model.named_parameters()) {
    auto t = p.value().detach().contiguous().to(torch::kCPU);
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

void fill_model_shape(const data::Dataset& ds, std::uint32_t dim, TrainConfig& c) {
  c.model.num_dense = static_cast<std::uint32_t>(ds.num_dense());
  c.model.num_tables = static_cast<std::uint32_t>(ds.num_tables());
  c.model.dim = dim;
}

// Group consecutive partial gradients by the iteration that computed them.
struct GradBatch {
  std::vector<Key> keys;
  std::vector<std::uint32_t> trainers;
  std::vector<std::uint32_t> slots;  // their gradients are read from the cache when pushed
  std::vector<float> grads;
};

class Worker {
 public:
  explicit Worker(TrainConfig c) : c_(std::move(c)) {}

  TrainSummary run();

 private:
  void join();
  void setup_collective();
  void execute(Step& s);
  void sync_pushes(const StepPlan& p, bool flush);
  // Sends the gradients (one push per iteration that computed them); waited by the caller.
  void push_partials(std::map<std::uint64_t, GradBatch>& by_iter, std::vector<ps::PsFuture>& sent);
  // `checkpoint`: this worker flushed for a checkpoint of `iteration` (ps_service.h).
  void commit_barrier(std::uint64_t generation, std::uint64_t iteration, bool checkpoint = false);
  void take_grad(std::uint32_t slot, std::map<std::uint64_t, GradBatch>& by_iter);
  void evaluate(std::uint64_t iteration);
  void dump(std::uint64_t iteration);
  // The dense model and optimizer as of the start of `iteration` (the PS's checkpoint of
  // that iteration holds the rows), written atomically; older ones pruned.
  void save_dense(std::uint64_t iteration);
  // Loads what save_dense wrote for `iteration`; throws ConfigError naming what is
  // missing or does not match this job.
  void load_dense(std::uint64_t iteration);
  json dense_meta(std::uint64_t iteration) const;
  void log_json(const json& j);

  TrainConfig c_;
  std::optional<data::Dataset> ds_;
  std::unique_ptr<transport::ControlMember> control_;
  std::unique_ptr<transport::verbs::Fabric> fabric_;  // --transport rdma; outlives client_
  std::unique_ptr<ps::PsClient> client_;
  PsConfig ps_;
  std::uint32_t rank_ = 0, dim_ = 0, state_ = 0;
  bool on_demand_ = false;
  // fae:F: the hot rows, replicated on every worker (value + state, in key order), their
  // gradients summed with the dense ones each iteration, the PS's optimizer applied here.
  std::vector<Key> hot_keys_;
  U64Map<std::uint32_t> hot_index_;
  std::vector<float> hot_rows_;
  torch::Tensor hot_grad_, hot_touched_;  // host, [H, dim] and [H]
  void load_hot_rows(const std::vector<std::uint8_t>& hot);
  void push_hot_rows();
  c10::intrusive_ptr<c10d::Store> store_;
  // Sums tensors over the workers: Gloo, or NCCL on a GPU (their base classes differ
  // between LibTorch versions, hence a function).
  std::function<void(std::vector<torch::Tensor>&)> allreduce_;
  std::shared_ptr<CtrModel> model_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  std::unique_ptr<RowCache> cache_;
  torch::Device device_{torch::kCPU};
  bool collective_on_device_ = false;  // NCCL on a GPU; otherwise Gloo on host tensors
  std::vector<std::uint64_t> partial_iter_;       // per slot: iteration of its partial gradient
  std::vector<std::uint32_t> partial_trainers_;   // per slot: workers that trained it then
  WireCounts wire_;
  PhaseTimes phases_;
  std::ofstream metrics_;
  double last_loss_ = 0, auc_ = -1, logloss_ = -1;
  AskedCheckpoints checkpoint_asked_;               // checkpoints shards announced (on command)
  std::atomic<std::uint64_t> stop_asked_{0};        // one after which the job stops (0: none)
  std::uint64_t stop_commits_ = 0;                  // commits flagged kCommitStop (c_.stop)
  bool checkpoint_commit_ = false;                  // the next commit's: flushed for a checkpoint
};

void Worker::log_json(const json& j) {
  if (metrics_.is_open()) metrics_ << j.dump() << '\n' << std::flush;
}

void Worker::join() {
  transport::MemberOptions mo;
  mo.coordinator = c_.coordinator;
  mo.token = c_.token;
  mo.role = transport::Role::kWorker;
  mo.rank = c_.rank;
  mo.timeouts.heartbeat_timeout = c_.heartbeat_timeout;
  mo.timeouts.heartbeat_interval = std::max(std::chrono::milliseconds(20), c_.heartbeat_timeout / 10);
  mo.timeouts.join_timeout = c_.join_timeout;
  spdlog::info("joining the job at {}", c_.coordinator);
  control_ = std::make_unique<transport::ControlMember>(mo);
  rank_ = control_->rank();
  if (control_->shape().workers != c_.workers) {
    throw ConfigError("--workers " + std::to_string(c_.workers) + " but the job has " + std::to_string(control_->shape().workers) + " workers");
  }
  ps_ = parse_ps_config(control_->lookup("ps_config", c_.join_timeout));
  const std::uint64_t rows = ds_->manifest().total_table_rows();
  if (ps_.num_keys != rows) {
    throw ConfigError("dataset mismatch: " + c_.dataset + " has " + std::to_string(rows) + " embedding rows in its tables, the PS serves " +
                      std::to_string(ps_.num_keys) + " (was ember-ps started with another --dataset?)");
  }
  if (ps_.transport != c_.transport) {
    throw ConfigError("--transport " + c_.transport + " but the PS shards serve " + ps_.transport + " (start both with the same --transport)");
  }
  dim_ = ps_.dim;
  state_ = ps::state_floats(ps_.optimizer.kind, dim_);
  std::vector<ps::ShardAddress> shards;
  for (const auto& p : control_->peers_of(transport::Role::kPs)) shards.push_back(ps::parse_address(p.data_address));
  if (fabric_) {
    transport::RdmaOptions ro;
    ro.slot_bytes = c_.rdma_slot_mib << 20;
    ro.timeout = c_.timeout;
    client_ = std::make_unique<ps::PsClient>(shards, dim_, state_, ps::rdma_connector(*fabric_, c_.token, ro), c_.ps_connections);
  } else {
    client_ = std::make_unique<ps::PsClient>(shards, dim_, state_, ps::tcp_connector(c_.token, c_.timeout, c_.socket_buffer_kib << 10),
                                           c_.ps_connections);
  }
  spdlog::info("worker {}/{}: {} PS shard(s), {} rows of dim {}, sparse optimizer {} (lr {})", rank_, c_.workers, shards.size(), ps_.num_keys,
               dim_, ps::optimizer_name(ps_.optimizer.kind), ps_.optimizer.lr);
}

void Worker::setup_collective() {
  // Worker 0 hosts the c10d store on any free port and publishes where it is.
  c10d::TCPStoreOptions so;
  so.timeout = c_.join_timeout;
  if (rank_ == 0) {
    so.port = 0;
    so.isServer = true;
    so.numWorkers = c_.workers;
    so.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(c_.gloo_host, so);
    control_->publish("gloo_store", c_.gloo_host + ":" + std::to_string(store->getPort()));
    store_ = store;
  } else {
    auto addr = ps::parse_address(control_->lookup("gloo_store", c_.join_timeout));
    so.port = addr.port;
    store_ = c10::make_intrusive<c10d::TCPStore>(addr.host, so);
  }
#ifdef USE_C10D_NCCL
  if (device_.is_cuda()) {
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = std::max(std::chrono::milliseconds(60000), c_.heartbeat_timeout * 3);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, static_cast<int>(rank_), static_cast<int>(c_.workers), nccl);
    allreduce_ = [pg](std::vector<torch::Tensor>& t) { pg->allreduce(t)->wait(); };
    collective_on_device_ = true;
    return;
  }
#endif
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c_.gloo_host));
  opts->timeout = std::max(std::chrono::milliseconds(60000), c_.heartbeat_timeout * 3);
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, static_cast<int>(rank_), static_cast<int>(c_.workers), opts);
  allreduce_ = [pg](std::vector<torch::Tensor>& t) { pg->allreduce(t)->wait(); };
}

// The phases' times since `since`, scaled (1: seconds, 1e3: milliseconds).
json phase_json(const PhaseTimes& now, const PhaseTimes& since, double scale) {
  return {{"sync", (now.sync - since.sync) * scale},          {"commit", (now.commit - since.commit) * scale},
          {"pull", (now.pull - since.pull) * scale},          {"compute", (now.compute - since.compute) * scale},
          {"allreduce", (now.allreduce - since.allreduce) * scale}, {"push", (now.push - since.push) * scale},
          {"update", (now.update - since.update) * scale}};
}

void Worker::take_grad(std::uint32_t slot, std::map<std::uint64_t, GradBatch>& by_iter) {
  GradBatch& b = by_iter[partial_iter_[slot]];
  b.keys.push_back(cache_->key(slot));
  b.trainers.push_back(partial_trainers_[slot]);
  b.slots.push_back(slot);
}

void Worker::push_partials(std::map<std::uint64_t, GradBatch>& by_iter, std::vector<ps::PsFuture>& sent) {
  for (auto& [iter, b] : by_iter) {
    b.grads.clear();
    cache_->read_grads(b.slots, b.grads);
    sent.push_back(client_->start_push_grad(iter, b.keys, b.trainers, b.grads));
    wire_.bytes_out += b.keys.size() * 16 + b.grads.size() * 4;
  }
}

void Worker::sync_pushes(const StepPlan& p, bool flush) {
  std::map<std::uint64_t, GradBatch> grads;
  for (const auto& g : p.push_grads) {
    take_grad(g.slot, grads);
    cache_->drop(g.slot);
  }
  // The gradients and the write-backs in flight together; all acknowledged before the
  // barrier (a commit must find them at the PS).
  std::vector<ps::PsFuture> sent;
  push_partials(grads, sent);
  if (!p.push_values.empty()) {
    std::vector<Key> keys;
    std::vector<std::uint32_t> slots;
    std::vector<float> rows;
    rows.reserve(p.push_values.size() * (dim_ + state_));
    for (const auto& v : p.push_values) {
      keys.push_back(v.key);
      slots.push_back(v.slot);
      cache_->set_row_state(v.slot, cache::RowState::kLatestClean);
    }
    cache_->read_rows(slots, rows);
    sent.push_back(client_->start_push_value(keys, rows));
    wire_.bytes_out += keys.size() * 8 + rows.size() * 4;
  }
  for (auto& f : sent) f.wait();
  (flush ? wire_.flush_grad : wire_.push_grad) += p.push_grads.size();
  (flush ? wire_.flush_value : wire_.push_value) += p.push_values.size();
}

void Worker::load_hot_rows(const std::vector<std::uint8_t>& hot) {
  for (Key k = 0; k < hot.size(); ++k) {
    if (hot[k]) {
      hot_index_.try_emplace(k, static_cast<std::uint32_t>(hot_keys_.size()));
      hot_keys_.push_back(k);
    }
  }
  client_->pull(hot_keys_, hot_rows_, true, 0);
  wire_.hot_load += hot_keys_.size();
  hot_grad_ = torch::zeros({static_cast<std::int64_t>(hot_keys_.size()), static_cast<std::int64_t>(dim_)});
  hot_touched_ = torch::zeros({static_cast<std::int64_t>(hot_keys_.size())});
  spdlog::info("worker {}: fae: {} hot rows replicated ({:.1f} MB)", rank_, hot_keys_.size(), hot_rows_.size() * 4 / 1e6);
}

void Worker::push_hot_rows() {
  if (hot_keys_.empty()) return;
  client_->push_value(hot_keys_, hot_rows_);
  wire_.flush_value += hot_keys_.size();
  wire_.bytes_out += hot_keys_.size() * 8 + hot_rows_.size() * 4;
}

void Worker::commit_barrier(std::uint64_t generation, std::uint64_t iteration, bool checkpoint) {
  control_->barrier(transport::BarrierGroup::kWorkers, generation);
  std::uint32_t flags = checkpoint ? ps::kCommitCheckpoint : 0;
  // Asked to stop (a signal to this worker): every commit says so until a shard names the
  // stop (one flushing for a checkpoint asked for earlier names it once that is written).
  if (c_.stop != nullptr && c_.stop->signal.load() != 0 && stop_asked_.load() == 0) {
    if (stop_commits_++ == 0) spdlog::info("worker {}: asking the PS shards to stop the job at a checkpoint", rank_);
    if (stop_commits_ > 2 * ps::kCheckpointLead) {
      throw Error("signal " + std::to_string(c_.stop->signal.load()) + " asked this worker to stop the job at a checkpoint, but no PS shard named one in " +
                  std::to_string(stop_commits_ - 1) + " commits");
    }
    flags |= ps::kCommitStop;
  }
  ps::PsFuture f = client_->start_commit(iteration, flags);
  f.wait();
  for (const std::uint64_t at : f.checkpoints_at()) {
    if (checkpoint_asked_.add(at) && rank_ == 0) spdlog::info("a PS shard asked for a checkpoint at iteration {}: the workers flush after iteration {}", at, at - 1);
  }
  if (const std::uint64_t at = f.stop_at(); at > 0 && (stop_asked_.load() == 0 || at < stop_asked_.load())) {
    stop_asked_ = at;
    if (rank_ == 0) spdlog::info("the job was asked to stop: the workers stop after iteration {}, once it is checkpointed", at - 1);
  }
}

void Worker::execute(Step& s) {
  const StepPlan& p = s.plan;
  const std::uint64_t t = s.iteration;
  const std::uint32_t T = c_.model.num_tables, n = static_cast<std::uint32_t>(p.samples.size());
  const std::uint32_t global_n = c_.workers * c_.batch_per_worker;

  // Each phase's wall time: the stopwatch is read and restarted at its end.
  Stopwatch clock;
  auto lap = [&clock](double& phase) {
    phase += clock.seconds();
    clock.reset();
  };
  // 1-2. Sync, barrier, commit: the PS applies every update of earlier iterations.
  sync_pushes(p, false);
  lap(phases_.sync);
  commit_barrier(2 * t, t, std::exchange(checkpoint_commit_, false));
  lap(phases_.commit);

  // 3. Evictions leave (their data copied out first: the pull overwrites the slot), pulls.
  if (!p.pulls.empty()) {
    std::map<std::uint64_t, GradBatch> evicted_grads;
    std::vector<Key> evicted_keys, pull_keys;
    std::vector<std::uint32_t> evicted_slots, pull_slots;
    std::vector<float> evicted_rows;
    for (const auto& e : p.pulls) {
      pull_keys.push_back(e.key);
      pull_slots.push_back(e.slot);
      if (e.kind == EvictKind::kDirty) {
        evicted_keys.push_back(e.evicted);
        evicted_slots.push_back(e.slot);
        ++wire_.push_evict;
      } else if (e.kind == EvictKind::kPartial) {
        take_grad(e.slot, evicted_grads);
        ++wire_.push_evict;
      }
    }
    // Write-backs, evicted gradients and the pull in flight together: one round trip.
    std::vector<ps::PsFuture> sent;
    if (!evicted_keys.empty()) {
      cache_->read_rows(evicted_slots, evicted_rows);
      sent.push_back(client_->start_push_value(evicted_keys, evicted_rows));
      wire_.bytes_out += evicted_keys.size() * 8 + evicted_rows.size() * 4;
    }
    push_partials(evicted_grads, sent);
    std::vector<float> rows;
    ps::PsFuture pulled = client_->start_pull(pull_keys, rows, true, t, ps::PsClient::Dedup::kNo);  // a slot per key: distinct
    for (auto& f : sent) f.wait();
    pulled.wait();
    cache_->fill(pull_slots, pull_keys, rows.data());
    wire_.pulls += p.pulls.size();
    wire_.bytes_out += pull_keys.size() * 8;
    wire_.bytes_in += rows.size() * 4;
  }
  wire_.hits += p.rows.size() - p.pulls.size();
  lap(phases_.pull);

  // 4. Train the micro-batch.
  // Each distinct row's index in p.rows: its slot here, its trainer count for pushes.
  U64Map<std::uint32_t> row_of;
  for (std::uint32_t j = 0; j < p.rows.size(); ++j) row_of.try_emplace(p.rows[j].key, j);
  // Cold rows come from the cache; fae's hot rows from the replica.
  std::vector<std::uint32_t> slots, hot_h;
  std::vector<std::int64_t> cold_pos, hot_pos;
  slots.reserve(static_cast<std::size_t>(n) * T);
  for (std::size_t i = 0; i < static_cast<std::size_t>(n) * T; ++i) {
    if (const std::uint32_t* h = hot_keys_.empty() ? nullptr : hot_index_.find(s.keys[i])) {
      hot_pos.push_back(static_cast<std::int64_t>(i));
      hot_h.push_back(*h);
    } else {
      cold_pos.push_back(static_cast<std::int64_t>(i));
      slots.push_back(p.rows[*row_of.find(s.keys[i])].slot);
    }
  }
  // Positions of cold and hot rows in the batch, on the device (fae only; used forward
  // and backward).
  torch::Tensor cold_idx, hot_idx;
  torch::Tensor emb_flat;
  if (hot_pos.empty()) {
    emb_flat = cache_->gather(slots);
  } else {
    cold_idx = torch::tensor(cold_pos).to(device_);
    hot_idx = torch::tensor(hot_pos).to(device_);
    emb_flat = torch::empty({static_cast<std::int64_t>(n) * T, static_cast<std::int64_t>(dim_)}, torch::TensorOptions().device(device_));
    if (!cold_pos.empty()) emb_flat.index_copy_(0, cold_idx, cache_->gather(slots));
    auto hv = torch::empty({static_cast<std::int64_t>(hot_h.size()), static_cast<std::int64_t>(dim_)});
    for (std::size_t j = 0; j < hot_h.size(); ++j) {
      std::memcpy(hv.data_ptr<float>() + j * dim_, &hot_rows_[static_cast<std::size_t>(hot_h[j]) * (dim_ + state_)], dim_ * sizeof(float));
    }
    emb_flat.index_copy_(0, hot_idx, hv.to(device_));
  }
  auto emb = emb_flat.view({n, static_cast<std::int64_t>(T), dim_});
  emb.set_requires_grad(true);
  auto dense = torch::from_blob(s.dense.data(), {n, static_cast<std::int64_t>(c_.model.num_dense)}, torch::kFloat32).to(device_);
  auto labels = torch::from_blob(s.labels.data(), {n}, torch::kFloat32).to(device_);
  opt_->zero_grad();
  auto logits = model_->forward(dense, emb);
  // The sum over this micro-batch scaled by the global batch: the all-reduced sum is the
  // gradient of the global batch's mean loss, whatever the partition.
  auto loss = torch::binary_cross_entropy_with_logits(logits, labels, {}, {}, at::Reduction::Sum) / static_cast<double>(global_n);
  loss.backward();
  auto eg = emb.grad().reshape({-1, static_cast<std::int64_t>(dim_)});
  lap(phases_.compute);
  if (!hot_pos.empty()) {
    // This worker's part of the hot rows' gradients; summed over workers with the dense ones.
    auto g = eg.index_select(0, hot_idx).to(torch::kCPU);
    auto h = torch::tensor(std::vector<std::int64_t>(hot_h.begin(), hot_h.end()));
    hot_grad_.index_add_(0, h, g);
    hot_touched_.index_fill_(0, h, 1.0f);
  }
  {
    std::vector<torch::Tensor> parts;
    for (auto& param : model_->parameters()) parts.push_back(param.grad().reshape(-1));
    parts.push_back(loss.detach().reshape(1));
    if (!hot_keys_.empty()) {
      parts.push_back(hot_grad_.reshape(-1).to(device_));
      parts.push_back(hot_touched_.to(device_));
    }
    // Gloo reduces host tensors: on a GPU the flat gradient makes one round trip to the
    // host (with NCCL, built in with EMBER_TORCH_NCCL, it stays on the device).
    std::vector<torch::Tensor> flat{collective_on_device_ ? torch::cat(parts) : torch::cat(parts).to(torch::kCPU)};
    allreduce_(flat);
    std::int64_t off = 0;
    for (auto& param : model_->parameters()) {
      const std::int64_t k = param.numel();
      param.mutable_grad().copy_(flat[0].narrow(0, off, k).view_as(param));  // copy_ moves it back to the device
      off += k;
    }
    last_loss_ = flat[0][off].item<double>();
    if (!hot_keys_.empty()) {
      // Every replica applies the same summed gradients to the hot rows any worker
      // trained, with the PS's optimizer code: the replicas stay identical.
      const std::int64_t H = static_cast<std::int64_t>(hot_keys_.size());
      auto sums = flat[0].narrow(0, off + 1, H * dim_).to(torch::kCPU).contiguous();
      auto touched = flat[0].narrow(0, off + 1 + H * dim_, H).to(torch::kCPU).contiguous();
      const float* g = sums.data_ptr<float>();
      const float* tc = touched.data_ptr<float>();
      const std::uint32_t per = dim_ + state_;
      std::uint64_t trained = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        if (tc[h] == 0) continue;
        float* row = &hot_rows_[static_cast<std::size_t>(h) * per];
        ps::apply(ps_.optimizer, ps_.optimizer.lr, dim_, row, row + dim_, g + h * dim_);
        ++trained;
      }
      wire_.hot_sync += trained;
      hot_grad_.zero_();
      hot_touched_.zero_();
    }
  }
  lap(phases_.allreduce);
  opt_->step();
  if (hot_pos.empty()) {
    cache_->scatter_add_grad(slots, eg);
  } else if (!cold_pos.empty()) {
    cache_->scatter_add_grad(slots, eg.index_select(0, cold_idx));
  }

  lap(phases_.update);
  // Full-set sync pushes every trained row's gradient (with its trainer count).
  if (!p.end_pushes.empty()) {
    GradBatch b;
    for (const auto& e : p.end_pushes) {
      b.keys.push_back(e.key);
      b.trainers.push_back(p.rows[*row_of.find(e.key)].trainers);
      b.slots.push_back(e.slot);
    }
    cache_->read_grads(b.slots, b.grads);
    client_->push_grad(t, b.keys, b.trainers, b.grads);
    wire_.push_grad += b.keys.size();
    wire_.bytes_out += b.keys.size() * 16 + b.grads.size() * 4;
  }
  lap(phases_.push);
  std::vector<std::uint32_t> sole, pushed;
  for (const auto& r : p.rows) {
    if (r.trainers == 1) {
      sole.push_back(r.slot);
      cache_->set_row_state(r.slot, on_demand_ ? cache::RowState::kLatestDirty : cache::RowState::kLatestClean);
    } else if (on_demand_) {
      partial_iter_[r.slot] = t;
      partial_trainers_[r.slot] = r.trainers;
      cache_->set_row_state(r.slot, cache::RowState::kPartial);
    } else {
      pushed.push_back(r.slot);  // its gradient went out above
    }
  }
  cache_->apply(sole, ps_.optimizer, ps_.optimizer.lr);  // rows only this worker trained: the PS's update, here
  cache_->zero_grad(pushed);
  for (const auto& d : p.drops) cache_->drop(d.slot);
  lap(phases_.update);
}

void Worker::evaluate(std::uint64_t iteration) {
  const auto& val = ds_->split(data::Split::kVal);
  if (val.rows() == 0) {
    spdlog::warn("no validation split in {}: skipping evaluation (ember-data prep --val-fraction)", c_.dataset);
    return;
  }
  torch::NoGradGuard no_grad;
  data::BatchOptions bo;
  bo.batch_size = 4096;
  bo.drop_last = false;
  data::BatchReader reader(val, bo);
  data::Batch b;
  std::vector<float> probs;
  std::vector<std::uint8_t> labels;
  const std::uint32_t T = c_.model.num_tables, D = c_.model.num_dense;
  const auto offsets = ds_->manifest().table_offsets();
  std::vector<Key> keys;
  std::vector<float> rows, dense;
  while (reader.next(b)) {
    std::size_t n = b.size();
    if (c_.eval_samples > 0) n = std::min<std::size_t>(n, c_.eval_samples - probs.size());
    if (n == 0) break;
    keys.resize(n * T);
    dense.resize(n * D);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::uint32_t t = 0; t < T; ++t) keys[i * T + t] = offsets[t] + b.id(static_cast<int>(t), i);
      std::memcpy(&dense[i * D], b.dense(i), D * sizeof(float));
      labels.push_back(b.label(i));
    }
    client_->pull(keys, rows, false, iteration);
    auto emb = torch::from_blob(rows.data(), {static_cast<std::int64_t>(n), static_cast<std::int64_t>(T), dim_}, torch::kFloat32).to(device_);
    auto x = torch::from_blob(dense.data(), {static_cast<std::int64_t>(n), static_cast<std::int64_t>(D)}, torch::kFloat32).to(device_);
    auto p = torch::sigmoid(model_->forward(x, emb)).to(torch::kCPU).contiguous();
    probs.insert(probs.end(), p.data_ptr<float>(), p.data_ptr<float>() + n);
    if (c_.eval_samples > 0 && probs.size() >= c_.eval_samples) break;
  }
  auc_ = auc(probs, labels);
  logloss_ = logloss(probs, labels);
  spdlog::info("eval after iteration {}: AUC {:.4f}, logloss {:.4f} on {} validation samples", iteration + 1, auc_, logloss_, probs.size());
  log_json({{"eval", true}, {"iteration", iteration + 1}, {"auc", auc_}, {"logloss", logloss_}, {"samples", probs.size()}});
}

void Worker::dump(std::uint64_t iteration) {
  fs::create_directories(c_.dump_dir);
  auto dense = flatten_params(*model_);
  write_file_atomic(fs::path(c_.dump_dir) / "dense.bin", std::string_view(reinterpret_cast<const char*>(dense.data()), dense.size() * 4));
  const std::uint64_t N = ps_.num_keys;
  if (N * dim_ * 4 > (std::uint64_t{4} << 30)) throw ConfigError("--dump-dir: the tables are over 4 GiB; use the PS checkpoints instead");
  std::string rows;
  rows.reserve(N * dim_ * 4);
  std::vector<Key> keys;
  std::vector<float> out;
  for (Key k0 = 0; k0 < N; k0 += 65536) {
    keys.clear();
    for (Key k = k0; k < std::min<Key>(N, k0 + 65536); ++k) keys.push_back(k);
    client_->pull(keys, out, false, iteration);
    rows.append(reinterpret_cast<const char*>(out.data()), out.size() * 4);
  }
  write_file_atomic(fs::path(c_.dump_dir) / "rows.bin", rows);
  json meta = {{"dim", dim_}, {"num_keys", N}, {"dense_floats", dense.size()}, {"iterations", iteration + 1}, {"model", c_.model.kind}};
  write_file_atomic(fs::path(c_.dump_dir) / "model.json", meta.dump(2) + "\n");
  spdlog::info("model written to {} ({} dense floats, {} rows)", c_.dump_dir, dense.size(), N);
}

// The first line of an error (LibTorch's carry a backtrace).
std::string first_line(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string s = c != nullptr ? c->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

json Worker::dense_meta(std::uint64_t iteration) const {
  // What must match for the dense state to continue this job's training.
  return {{"iteration", iteration},  {"model", c_.model.kind},         {"dense_optimizer", c_.dense_optimizer},
          {"dense_lr", c_.dense_lr}, {"seed", c_.seed},                {"workers", c_.workers},
          {"batch_per_worker", c_.batch_per_worker}, {"shuffle", c_.shuffle}, {"num_keys", ps_.num_keys}, {"dim", dim_}};
}

void Worker::save_dense(std::uint64_t iteration) {
  torch::serialize::OutputArchive root, model, optimizer;
  model_->save(model);
  opt_->save(optimizer);
  root.write("model", model);
  root.write("optimizer", optimizer);
  root.write("meta", c10::IValue(dense_meta(iteration).dump()));
  std::ostringstream bytes;
  root.save_to(bytes);
  const fs::path file = dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration);
  try {
    fs::create_directories(c_.checkpoint_dir);
    write_file_atomic(file, bytes.str());
  } catch (const std::exception& e) {
    // As on the PS: the run goes on, and the earlier checkpoints are intact.
    spdlog::error("worker {}: dense checkpoint of iteration {} not written: {}", rank_, iteration, e.what());
    return;
  }
  if (c_.keep_checkpoints == 0) return;
  const std::string prefix = dense_checkpoint_prefix(rank_);
  std::vector<fs::path> mine;
  for (const auto& e : fs::directory_iterator(c_.checkpoint_dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.path().extension() == ".pt") mine.push_back(e.path());
  }
  std::sort(mine.begin(), mine.end());
  for (std::size_t i = 0; i + c_.keep_checkpoints < mine.size(); ++i) {
    std::error_code ec;
    fs::remove(mine[i], ec);
  }
}

void Worker::load_dense(std::uint64_t iteration) {
  fs::path file = dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration);
  if (!fs::exists(file)) {
    // Another worker's copy of the same iteration holds the same state.
    for (std::uint32_t r = 0; r < c_.workers && !fs::exists(file); ++r) file = dense_checkpoint_file(c_.checkpoint_dir, r, iteration);
    if (!fs::exists(file)) {
      throw ConfigError("--resume: the PS restored iteration " + std::to_string(iteration) + " but " + c_.checkpoint_dir +
                        " holds no worker's dense state of it (" + dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration).filename().string() +
                        "); restore the PS from a checkpoint the workers also wrote (ember-worker --checkpoint-dir)");
    }
  }
  torch::serialize::InputArchive root, model, optimizer;
  json meta;
  try {
    root.load_from(file.string(), device_);
    c10::IValue m;
    root.read("meta", m);
    meta = json::parse(m.toStringRef());
    root.read("model", model);
    root.read("optimizer", optimizer);
  } catch (const std::exception& e) {
    throw DataError(file.string() + ": not a readable dense checkpoint: " + first_line(e));
  }
  const json want = dense_meta(iteration);
  for (const auto& [key, value] : want.items()) {
    if (!meta.contains(key) || meta[key] != value) {
      throw ConfigError("--resume: " + file.string() + " was written by a job with " + key + " " + (meta.contains(key) ? meta[key].dump() : "unset") +
                        ", this one has " + value.dump());
    }
  }
  try {
    model_->load(model);
    opt_->load(optimizer);
  } catch (const std::exception& e) {
    throw ConfigError("--resume: " + file.string() + " does not fit this model (" + first_line(e) + ")");
  }
  spdlog::info("worker {}: resuming at iteration {}: dense model and optimizer from {}", rank_, iteration, file.string());
}

TrainSummary Worker::run() {
  if (c_.transport == "rdma") {
    fabric_ = transport::verbs::make_ibverbs_fabric();  // one line, exit 2, without a device
  } else if (c_.transport != "tcp") {
    throw ConfigError("--transport '" + c_.transport + "': choose tcp or rdma");
  }
  if (c_.coordinator.empty()) throw ConfigError("--coordinator is required (the control plane endpoint of ember-ps shard 0)");
  if (c_.token.empty()) throw ConfigError("a job token is required (--token or --token-file)");
  device_ = parse_device(c_.device);
  resolve_cache_backend(c_.cache_backend, device_);  // --cache-backend errors before joining
  ds_.emplace(data::Dataset::open(c_.dataset));
  auto sc = scheduler_config(*ds_, c_);  // config errors before joining
  on_demand_ = sc.policy.on_demand();
  at::set_num_threads(c_.torch_threads);
  if (!c_.metrics_file.empty()) {
    metrics_.open(c_.metrics_file, std::ios::trunc);
    if (!metrics_) throw IoError(errno_message("open " + c_.metrics_file));
  }
  if (c_.resume && c_.checkpoint_dir.empty()) throw ConfigError("--resume needs --checkpoint-dir (where the workers wrote their dense state)");
  join();
  // A resumed job starts where the PS's restored checkpoint left off.
  std::uint64_t first = 0;
  if (c_.resume) {
    if (ps_.restored_iteration < 0) {
      throw ConfigError("--resume: the PS shards restored no checkpoint of an iteration (start ember-ps with --restore DIR)");
    }
    first = static_cast<std::uint64_t>(ps_.restored_iteration);
    if (first >= c_.iterations) {
      throw ConfigError("--resume: the PS restored iteration " + std::to_string(first) + ", at or past --iterations " + std::to_string(c_.iterations) +
                        " (a finished job's model: raise --iterations to train on)");
    }
  }
  if (!c_.checkpoint_dir.empty() && !ps_.checkpoints && !c_.resume) {
    spdlog::warn("--checkpoint-dir {}: the PS shards have no --checkpoint-dir, so no dense state is written", c_.checkpoint_dir);
  }
  setup_collective();
  fill_model_shape(*ds_, dim_, c_);
  torch::manual_seed(c_.seed);
  model_ = make_model(c_.model);  // initialized on the CPU: the same weights on every device
  model_->to(device_);
  opt_ = make_dense_optimizer(c_.dense_optimizer, model_->parameters(), c_.dense_lr);
  if (c_.resume) load_dense(first);
  cache_ = make_row_cache(c_.cache_backend, device_, sc.cache_rows, dim_, state_);
  partial_iter_.assign(sc.cache_rows, 0);
  partial_trainers_.assign(sc.cache_rows, 0);
  spdlog::info("worker {}: model {}, policy {}, cache {} rows ({:.1f} MB, {} backend on {})", rank_, c_.model.kind, c_.policy,
               sc.cache_rows, cache_->memory_bytes() / 1e6, cache_->backend(), device_.str());

  if (!sc.hot.empty()) load_hot_rows(sc.hot);
  sc.first_iteration = first;
  // Without a directory for the dense state the PS's checkpoints still get flushed rows.
  Loader loader(*ds_, std::move(sc), c_, rank_, ps_.checkpoint_every, checkpoint_asked_, stop_asked_);
  TrainSummary sum;
  sum.rank = rank_;
  Stopwatch total, window;
  WireCounts at_window;
  const double global_n = static_cast<double>(c_.workers) * c_.batch_per_worker;
  std::uint64_t window_first = first;
  std::uint64_t end = c_.iterations;  // earlier if the job is stopped (stop_asked_)
  // A signal to this worker stops the job at a checkpoint while it trains, if the PS
  // shards checkpoint and the dense state has a place (otherwise it ends the process).
  struct StopPossible {
    StopRequest* stop;
    StopPossible(StopRequest* r, bool can) : stop(can ? r : nullptr) {
      if (stop != nullptr) stop->possible = true;
    }
    ~StopPossible() { end(); }
    void end() {
      if (stop != nullptr) stop->possible = false;
      stop = nullptr;
    }
  } stop_possible(c_.stop, ps_.checkpoints && !c_.checkpoint_dir.empty());
  for (std::uint64_t t = first; t < c_.iterations; ++t) {
    Stopwatch it_clock;
    Step s = loader.next();
    const double wait_ms = it_clock.millis();
    if (auto why = control_->failure()) throw Error("job failed: " + *why);
    WireCounts before = wire_;
    const PhaseTimes phases_before = phases_;
    execute(s);
    if (const std::uint64_t stop = stop_asked_.load(); stop > 0 && t + 1 >= stop && !s.last) {
      // Cannot happen within kCheckpointLead; the other workers stop, so say why this one cannot.
      throw Error("the job was asked to stop at iteration " + std::to_string(stop) + ", which this worker learned after planning past it");
    }
    if (s.flush) {
      sync_pushes(s.flush_plan, true);
      if (rank_ == 0) push_hot_rows();  // the replicas agree: one copy goes back to the PS
      // The last flush commits the iteration after, flagged: shards with a checkpoint
      // directory write the finished model, from which a longer run can resume.
      commit_barrier(2 * t + 1, s.last ? t + 1 : t, s.last);
      if (rank_ == 0 && s.evaluate) evaluate(t);
      if (s.checkpoint || s.last) {
        checkpoint_commit_ = s.checkpoint;
        if (!c_.checkpoint_dir.empty() && ps_.checkpoints) save_dense(t + 1);
      }
    }
    const double ms = it_clock.millis();
    log_json({{"iteration", t},
              {"loss", last_loss_},
              {"iter_ms", ms},
              {"wait_ms", wait_ms},
              {"sched_ms", s.sched_ms},
              {"samples_s", global_n / (ms / 1e3)},
              {"pulls", wire_.pulls - before.pulls},
              {"push_grad", wire_.push_grad - before.push_grad},
              {"push_value", wire_.push_value - before.push_value},
              {"push_evict", wire_.push_evict - before.push_evict},
              {"hits", wire_.hits - before.hits},
              {"bytes_out", wire_.bytes_out - before.bytes_out},
              {"bytes_in", wire_.bytes_in - before.bytes_in},
              {"phase_ms", phase_json(phases_, phases_before, 1e3)}});
    if (rank_ == 0 && c_.progress_every > 0 && ((t + 1) % c_.progress_every == 0 || s.last)) {
      const double secs = window.seconds();
      const std::uint64_t iters = t + 1 - window_first;
      window_first = t + 1;
      const double hits = static_cast<double>(wire_.hits - at_window.hits), pulls = static_cast<double>(wire_.pulls - at_window.pulls);
      spdlog::info("iteration {}/{} | {:.0f} samples/s | loss {:.4f} | hit {:.1f}% | worker 0 rows: {} pulled, {} pushed", t + 1, c_.iterations,
                   global_n * static_cast<double>(iters) / secs, last_loss_, hits + pulls > 0 ? 100 * hits / (hits + pulls) : 0.0,
                   wire_.pulls - at_window.pulls, wire_.pushes() - at_window.pushes());
      window.reset();
      at_window = wire_;
    }
    if (s.last) {
      end = t + 1;
      break;
    }
  }
  stop_possible.end();  // training is over: a signal now ends the process
  sum.seconds = total.seconds();
  sum.iterations = end - first;
  sum.samples_per_s = global_n * static_cast<double>(sum.iterations) / sum.seconds;
  if (end < c_.iterations) {
    sum.stopped_at = end;
    if (rank_ == 0) {
      spdlog::info("the job stopped at iteration {} of {}, as asked (a signal to a PS shard or a worker): its checkpoint holds the model "
                   "(resume with --resume)",
                   end, c_.iterations);
    }
  }
  if (rank_ == 0 && !c_.dump_dir.empty()) dump(end - 1);
  // Everyone waits for worker 0's evaluation and dump before leaving.
  control_->barrier(transport::BarrierGroup::kWorkers, 2 * end + 2);
  sum.wire = wire_;
  sum.phases = phases_;
  sum.final_loss = last_loss_;
  sum.auc = auc_;
  sum.logloss = logloss_;
  log_json({{"summary", true},
            {"rank", rank_},
            {"iterations", sum.iterations},
            {"stopped_at", sum.stopped_at},
            {"seconds", sum.seconds},
            {"samples_s", sum.samples_per_s},
            {"loss", sum.final_loss},
            {"auc", sum.auc},
            {"logloss", sum.logloss},
            {"pulls", wire_.pulls},
            {"push_grad", wire_.push_grad},
            {"push_value", wire_.push_value},
            {"push_evict", wire_.push_evict},
            {"hits", wire_.hits},
            {"flush_grad", wire_.flush_grad},
            {"flush_value", wire_.flush_value},
            {"hot_load", wire_.hot_load},
            {"hot_sync", wire_.hot_sync},
            {"bytes_out", wire_.bytes_out},
            {"bytes_in", wire_.bytes_in},
            {"phase_s", phase_json(phases_, PhaseTimes{}, 1)}});
  {
    const PhaseTimes& f = phases_;
    const double all = std::max(1e-9, f.total());
    auto pct = [all](double x) { return 100 * x / all; };
    spdlog::info("worker {}: time per phase: PS sync {:.0f}%, barrier + commit {:.0f}%, pulls {:.0f}%, model {:.0f}%, all-reduce {:.0f}%, "
                 "pushes {:.0f}%, updates {:.0f}% (of {:.1f} s)",
                 rank_, pct(f.sync), pct(f.commit), pct(f.pull), pct(f.compute), pct(f.allreduce), pct(f.push), pct(f.update), f.total());
  }
  control_->leave();
  return sum;
}

}  // namespace

TrainSummary run_worker(const TrainConfig& config) { return Worker(config).run(); }

ReferenceResult train_reference(const TrainConfig& config, const ps::OptimizerConfig& sparse, std::uint32_t dim) {
  TrainConfig c = config;
  auto ds = data::Dataset::open(c.dataset);
  fill_model_shape(ds, dim, c);
  const std::uint64_t N = ds.manifest().total_table_rows();
  const auto offsets = ds.manifest().table_offsets();
  const std::uint32_t state = ps::state_floats(sparse.kind, dim), T = c.model.num_tables, D = c.model.num_dense;
  ReferenceResult r;
  std::vector<float> states(N * state);
  r.rows.resize(N * dim);
  for (Key k = 0; k < N; ++k) {
    ps::initial_row(config.seed, k, dim, &r.rows[k * dim]);
    ps::init_state(sparse, dim, &states[k * state]);
  }
  at::set_num_threads(c.torch_threads);
  torch::manual_seed(c.seed);
  auto model = make_model(c.model);
  auto opt = make_dense_optimizer(c.dense_optimizer, model->parameters(), c.dense_lr);
  data::BatchOptions bo;
  bo.batch_size = static_cast<std::size_t>(c.workers) * c.batch_per_worker;
  bo.shuffle = c.shuffle;
  bo.seed = c.seed;
  data::BatchReader reader(ds.split(data::Split::kTrain), bo);
  data::Batch b;
  std::uint64_t epoch = 0;
  const std::int64_t n = static_cast<std::int64_t>(bo.batch_size);
  std::vector<Key> keys(bo.batch_size * T);
  std::vector<float> dense(bo.batch_size * D), labels(bo.batch_size);
  Stopwatch clock;
  for (std::uint64_t t = 0; t < c.iterations; ++t) {
    if (!reader.next(b)) {
      reader.start_epoch(++epoch);
      reader.next(b);
    }
    for (std::size_t i = 0; i < bo.batch_size; ++i) {
      for (std::uint32_t tb = 0; tb < T; ++tb) keys[i * T + tb] = offsets[tb] + b.id(static_cast<int>(tb), i);
      std::memcpy(&dense[i * D], b.dense(i), D * sizeof(float));
      labels[i] = static_cast<float>(b.label(i));
    }
    auto emb = torch::empty({n, static_cast<std::int64_t>(T), dim});
    float* e = emb.data_ptr<float>();
    for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(e + i * dim, &r.rows[keys[i] * dim], dim * sizeof(float));
    emb.set_requires_grad(true);
    opt->zero_grad();
    auto logits = model->forward(torch::from_blob(dense.data(), {n, static_cast<std::int64_t>(D)}), emb);
    auto loss = torch::binary_cross_entropy_with_logits(logits, torch::from_blob(labels.data(), {n}), {}, {}, at::Reduction::Sum) /
                static_cast<double>(n);
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<double>());
    // Sum each row's gradient over the batch, then one optimizer step per row.
    auto g = emb.grad().contiguous();
    const float* gp = g.data_ptr<float>();
    U64Map<std::uint32_t> index;
    std::vector<Key> order;
    std::vector<float> sums;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto [p, fresh] = index.try_emplace(keys[i], static_cast<std::uint32_t>(order.size()));
      if (fresh) {
        order.push_back(keys[i]);
        sums.resize(sums.size() + dim, 0.0f);
      }
      float* s = &sums[static_cast<std::size_t>(*p) * dim];
      for (std::uint32_t d = 0; d < dim; ++d) s[d] += gp[i * dim + d];
    }
    for (std::size_t j = 0; j < order.size(); ++j) {
      ps::apply(sparse, sparse.lr, dim, &r.rows[order[j] * dim], &states[order[j] * state], &sums[j * dim]);
    }
  }
  r.seconds = clock.seconds();
  r.dense = flatten_params(*model);
  return r;
}

ModelDump read_dump(const std::string& dir) {
  ModelDump m;
  auto meta = json::parse(read_file(fs::path(dir) / "model.json"));
  m.dim = meta.at("dim");
  auto load = [&](const char* name, std::vector<float>& out) {
    std::string bytes = read_file(fs::path(dir) / name);
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
  };
  load("dense.bin", m.dense);
  load("rows.bin", m.rows);
  return m;
}

}  // namespace ember::worker
