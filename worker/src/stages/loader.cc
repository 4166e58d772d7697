#include "stages/loader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/process.h"
#include "ember/common/signals.h"

namespace ember::worker {

namespace {

bool replays(const scheduler::SchedulerConfig& sc) {
  return sc.first_iteration > 0 && sc.policy.sync() != scheduler::Sync::kBoundedStaleness;
}

// A replayed scheduler starts where the checkpoint's job started: at iteration 0.
scheduler::SchedulerConfig from_start(scheduler::SchedulerConfig sc, bool replay) {
  if (replay) sc.first_iteration = 0;
  return sc;
}

// A stream waiting for records holds the job's commits back, so the stop at a checkpoint
// a signal asks for (it needs commits) cannot come: a signal while it waits stops this
// worker now, as a second signal would; the job resumes from its last checkpoint.
void stop_now_if_signalled(StopRequest* stop, std::uint32_t rank) {
  const int sig = stop == nullptr ? 0 : stop->signal.load();
  if (sig == 0) return;
  spdlog::warn("worker {}: signal {} while the stream waits for records: stopping now (the job resumes from its last checkpoint)", rank,
               sig);
  stop->ending(fmt::format("stopped by signal {} while waiting for the stream's records", sig));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // for the message to leave
  die_by_signal(sig);
}

}  // namespace

bool AskedCheckpoints::add(std::uint64_t at) {
  std::lock_guard lock(mutex_);
  return at_.insert(at).second;
}

bool AskedCheckpoints::contains(std::uint64_t at) const {
  std::lock_guard lock(mutex_);
  return at_.count(at) > 0;
}

Loader::Loader(const data::Dataset& ds, scheduler::SchedulerConfig sc, const TrainConfig& c, std::uint32_t rank,
               ps::CheckpointSchedule schedule, const AskedCheckpoints& asked, const std::atomic<std::uint64_t>& stop_at,
               std::optional<HostGroup> host, EvictionChannel* evictions, bool hint_rows, std::optional<StartDirectory> directory)
    : ds_(ds),
      first_(sc.first_iteration),
      replay_(replays(sc) && !(directory && directory->restored)),
      sched_(from_start(std::move(sc), replay_)),
      c_(c),
      rank_(rank),
      flushes_{c.iterations, c.eval_every, schedule},
      asked_(asked),
      stop_at_(stop_at),
      host_(std::move(host)),
      evictions_(evictions),
      hint_rows_(hint_rows && sched_.config().lookahead > 0),
      dir_(directory ? std::optional(std::move(directory->directory)) : std::nullopt),
      stream_start_(directory ? directory->stream_position : std::string()) {
  queue_.set_capacity(2);
  thread_ = std::thread([this] {
    name_this_thread("loader");
    run();
  });
}

Loader::~Loader() {
  stop_ = true;
  queue_.abort();  // wakes a push under way
  Handoff dropped;
  while (queue_.try_pop(dropped)) {
  }  // room for a push that started after the abort; the loader then sees stop_
  thread_.join();
}

Step Loader::next() {
  Handoff h;
  queue_.pop(h);
  if (h.error) std::rethrow_exception(h.error);
  return std::move(h.step);
}

double Loader::schedule(const scheduler::GlobalBatch& g, std::vector<scheduler::StepPlan>& plans) {
  Stopwatch sw;
  sched_.schedule(g, plans);
  if (evictions_ != nullptr) exchanged_ += exchange_evictions(sched_, *evictions_, rank_);
  return sw.millis();
}

std::vector<scheduler::SlotAssignment> Loader::admit(std::uint64_t t, scheduler::GlobalBatch& g) {
  std::vector<scheduler::SlotAssignment> made;
  dir_->admit(t, g, &made);
  // A slot dropped after t - 1 and made again now is reset once, for its new id: the
  // shards apply the workers' resets in no set order.
  U64Map<std::uint8_t> remade;
  for (const auto& m : made) remade.try_emplace(m.slot, 1);
  std::vector<scheduler::SlotAssignment> all;
  for (const auto& d : dropped_)
    if (remade.find(d.slot) == nullptr) all.push_back(d);
  dropped_.clear();
  all.insert(all.end(), made.begin(), made.end());
  return share_of(all);
}

std::vector<scheduler::SlotAssignment> Loader::share_of(const std::vector<scheduler::SlotAssignment>& all) const {
  // The workers share the resets out by their place in the list.
  std::vector<scheduler::SlotAssignment> share;
  const std::uint32_t workers = sched_.config().workers;
  for (std::size_t i = rank_; i < all.size(); i += workers) share.push_back(all[i]);
  return share;
}

void Loader::drop_after(std::uint64_t t) {
  std::vector<Key> dropped;
  dir_->end_iteration(t, &dropped);
  sched_.drop_rows(dropped);
  for (Key k : dropped) dropped_.push_back({k, scheduler::KeyDirectory::kNoId});
}

Step Loader::make_step(std::uint64_t t, data::Batch& b, scheduler::GlobalBatch& g, std::vector<scheduler::StepPlan>& plans,
                       std::vector<scheduler::KeySlot>& restore) {
  const auto T = static_cast<std::uint32_t>(ds_.num_tables()), D = static_cast<std::uint32_t>(ds_.num_dense());
  Step s;
  s.iteration = t;
  if (dir_) s.resets = admit(t, g);
  s.sched_ms = schedule(g, plans);
  s.exchanged = std::exchange(exchanged_, ExchangeBytes{});
  if (t == first_ && replay_) {
    // Nothing was pulled ahead for the first step this job trains (on any worker: the
    // hand-offs below read the others' plans).
    for (auto& p : plans)
      for (auto& e : p.pulls) e.prefetch = false;
    s.restore = std::move(restore);
  }
  if (host_) s.host = host_plans(*host_, plans, host_parts_);
  s.plan = std::move(plans[rank_]);
  for (std::uint32_t i : s.plan.samples) {
    if (g.multi_hot()) {
      const std::uint32_t first = g.sample_begin(i);
      for (std::uint32_t t = 0; t < T; ++t) s.bags.push_back(static_cast<std::uint32_t>(s.keys.size()) + g.bag_begin(i, t) - first);
    }
    s.keys.insert(s.keys.end(), g.keys.begin() + g.sample_begin(i), g.keys.begin() + g.sample_begin(i + 1));
    const float* d = b.dense(i);
    s.dense.insert(s.dense.end(), d, d + D);
    s.labels.push_back(static_cast<float>(b.label(i)));
  }
  if (g.multi_hot()) s.bags.push_back(static_cast<std::uint32_t>(s.keys.size()));
  // A stopped job skips the final evaluation (it takes long, and the stop may have a
  // deadline); the resumed job evaluates at its end.
  s.last = flushes_.last(t) || stop_at_.load() == t + 1;
  s.evaluate = flushes_.evaluates_after(t);
  s.checkpoint = !s.last && (flushes_.checkpoints_after(t) || asked_.contains(t + 1));
  s.flush = s.evaluate || s.checkpoint || s.last;
  if (s.flush && sched_.config().policy.sync() != scheduler::Sync::kBoundedStaleness) {
    // An evaluation's flush pushes only the rows it reads (the others wait for a
    // checkpoint's flush, or their own push): it costs herald what it costs vanilla.
    sched_.flush(plans, s.evaluate && !s.checkpoint && !s.last);
    if (host_) s.flush_host = host_flush(*host_, plans, host_parts_);
    if (s.evaluate && rank_ == 0) {
      for (const auto& p : plans) {
        auto& keys = s.eval_hands_of.emplace_back();
        for (const auto& r : p.eval_hands) keys.push_back(r.key);
      }
    }
    s.flush_plan = std::move(plans[rank_]);
  }
  if (dir_) {
    drop_after(t);
    if (s.evaluate || s.last) s.directory = std::make_shared<const scheduler::KeyDirectory>(*dir_);
    if ((s.checkpoint || s.last) && !c_.checkpoint_dir.empty()) s.directory_state = dir_->save();
    // The rows dropped after the last step are cleared at the final commit, so that its
    // checkpoint holds the rows of the directory it keeps.
    if (s.last) s.final_resets = share_of(std::exchange(dropped_, {}));
    for (std::uint32_t shard = 0; shard < dir_->options().shards; ++shard) s.dynamic_rows.push_back(dir_->shard_counts(shard));
  }
  return s;
}

void Loader::run() {
  try {
    // The order ember-sim and the reference read; a stream's wait ends when the loader stops.
    scheduler::BatchStream batches = scheduler::job_batches(ds_, c_, sched_.config().table_offsets, sched_.config().lookahead, [this] {
      stop_now_if_signalled(c_.stop, rank_);
      return stop_.load();
    });
    data::Batch b;
    scheduler::GlobalBatch g;
    std::vector<scheduler::StepPlan> plans;
    if (hint_rows_) {
      const std::uint32_t workers = sched_.config().workers;
      batches.on_ahead([this, workers](std::uint64_t it, const scheduler::GlobalBatch& next) {
        for (Key k : next.keys)
          if (k % workers == rank_) hints_.push_back(k);
        hints_for_ = it;
      });
    }
    const std::uint64_t first = first_;
    std::vector<scheduler::KeySlot> restore;
    if (replay_) {
      Stopwatch clock;
      for (std::uint64_t t = 0; t < first && !stop_; ++t) {
        batches.look_ahead(sched_, t, c_.iterations);
        if (!batches.next(b, g)) return;  // stopped
        if (dir_) admit(t, g);
        schedule(g, plans);
        if (dir_) drop_after(t);
      }
      sched_.flush(plans);  // the checkpoint's flush: every row held is on the PS
      restore = sched_.latest_rows(rank_);
      if (rank_ == 0) {
        spdlog::info("resume: replayed the scheduler over iterations 0-{} in {:.1f} s; worker 0 restores {} cached rows", first - 1,
                     clock.seconds(), restore.size());
      }
    } else {
      if (!stream_start_.empty()) {
        batches.seek(stream_start_, "--resume: the dense checkpoint's stream position");
      } else if (!batches.skip(first)) {  // the batches trained before the checkpoint (false: stopped)
        return;
      }
    }
    for (std::uint64_t t = first; t < c_.iterations && !stop_; ++t) {
      hints_.clear();
      batches.look_ahead(sched_, t, c_.iterations);
      if (!batches.next(b, g)) return;  // stopped
      Handoff h;
      h.step = make_step(t, b, g, plans, restore);
      if ((h.step.checkpoint || h.step.last) && !c_.checkpoint_dir.empty()) h.step.stream_position = batches.stream_position();
      if (!hints_.empty()) {
        std::sort(hints_.begin(), hints_.end());
        hints_.erase(std::unique(hints_.begin(), hints_.end()), hints_.end());
        h.step.hint_keys.swap(hints_);
        h.step.hint_iteration = hints_for_;
      }
      const bool last = h.step.last;
      queue_.push(std::move(h));
      if (last) return;
    }
  } catch (const tbb::user_abort&) {
    // The trainer is gone.
  } catch (...) {
    Handoff h;
    h.error = std::current_exception();
    try {
      queue_.push(std::move(h));
    } catch (const tbb::user_abort&) {
    }
  }
}

}  // namespace ember::worker
