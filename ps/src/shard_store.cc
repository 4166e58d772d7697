// The store's serving side: rows, pushes and their aggregation, commits and the applies
// that follow them. Checkpoint files are written and read in shard_store_io.cc.
#include "ember/ps/shard_store.h"

#include <tbb/spin_mutex.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/huge_pages.h"
#include "ember/common/process.h"
#include "ember/ps/initial_rows.h"

namespace ember::ps {
namespace {

// Blocks of dim floats an aggregation of `trainers` contributions holds while it waits:
// two contributions are summed as they come (a + b and b + a round alike); three or
// more are kept apart and summed once all are in, in an order their bits fix
// (sum_in_canonical_order), so that a row's update never depends on which push came
// first. That holds one block per contribution until the last arrives.
std::uint32_t blocks_for(std::uint32_t trainers) { return trainers <= 2 ? 1 : trainers; }

// Sums the n contributions of dim floats at c, c + dim, ... into c[0, dim), in the order
// of their bytes: the same contributions give the same bits whatever order they came in.
void sum_in_canonical_order(float* c, std::uint32_t n, std::uint32_t dim) {
  std::array<std::uint32_t, ShardStore::kMaxTrainers> order;
  for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
  const std::size_t bytes = dim * sizeof(float);
  std::sort(order.begin(), order.begin() + n,
            [&](std::uint32_t a, std::uint32_t b) { return std::memcmp(c + std::size_t{a} * dim, c + std::size_t{b} * dim, bytes) < 0; });
  thread_local std::vector<float> sum;
  sum.assign(c + std::size_t{order[0]} * dim, c + std::size_t{order[0]} * dim + dim);
  for (std::uint32_t j = 1; j < n; ++j) {
    const float* __restrict x = c + std::size_t{order[j]} * dim;
    for (std::uint32_t d = 0; d < dim; ++d) sum[d] += x[d];
  }
  std::memcpy(c, sum.data(), bytes);
}

}  // namespace

struct ShardStore::Stripe {
  mutable tbb::spin_mutex mu;
  // Aggregations still waiting for contributions, their blocks in `partial_grads` (see
  // blocks_for), and the blocks free for reuse, by count.
  U64Map<Pending> partial;
  std::vector<float> partial_grads;
  std::array<std::vector<std::uint32_t>, kMaxTrainers + 1> free_blocks;
  std::uint32_t take_blocks(std::uint32_t n, std::uint32_t dim) {
    std::vector<std::uint32_t>& free = free_blocks[n];
    if (!free.empty()) {
      const std::uint32_t offset = free.back();
      free.pop_back();
      return offset;
    }
    const auto offset = static_cast<std::uint32_t>(partial_grads.size());
    partial_grads.resize(partial_grads.size() + std::size_t{n} * dim);
    return offset;
  }
  void give_blocks(std::uint32_t offset, std::uint32_t n) { free_blocks[n].push_back(offset); }
  // Complete aggregations, taken by the next commit: appended in arrival order, so the
  // common case (one trainer) is one sequential pass out, its gradients read where the
  // push left them (lent) or copied once.
  std::vector<Ready> ready;
  std::vector<float> ready_grads;                         // the copied gradients of `ready`, in order
  std::vector<std::shared_ptr<const void>> ready_owners;  // the pushes' payloads the lent ones point into
  // Buffers of an applied batch of this stripe, for its next one: they stay with the
  // stripe's thread (a pool shared by every thread moved them between cores).
  std::vector<Ready> spare_rows;
  std::vector<float> spare_grads;
  // Batches a commit_deferred() took from this stripe, not applied yet.
  std::vector<Batch> parked;
  std::atomic<std::size_t> parked_count{0};  // parked.size(), read without the lock
};

// The threads that apply committed batches, and what waiters watch: `in_flight` counts
// batches taken by commits and not applied yet; `applied` changes (and wakes waiters)
// each time one is, or batches are parked. Apart from the store so that a store can be
// moved while idle. Each job is one batch (one receiving thread's rows), so with several
// threads the rows of several connections are applied at once.
struct ShardStore::Applier {
  std::atomic<std::uint32_t> in_flight{0};
  std::atomic<std::uint32_t> applied{0};
  // Held shared while a batch is applied; save() holds it exclusively.
  std::shared_mutex gate;
  std::mutex mu;  // guards the rest
  std::condition_variable cv;
  struct Job {
    ShardStore* store;
    Batch batch;
  };
  std::deque<Job> jobs;
  bool stop = false;
  std::vector<std::thread> threads;

  explicit Applier(std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) {
      threads.emplace_back([this, i] {
        name_this_thread("ps-apply-" + std::to_string(i));
        std::unique_lock<std::mutex> lock(mu);
        while (true) {
          cv.wait(lock, [&] { return stop || !jobs.empty(); });
          if (jobs.empty()) return;  // stopping, nothing left
          Job job = std::move(jobs.front());
          jobs.pop_front();
          lock.unlock();
          job.store->finish_batch(job.batch);
          lock.lock();
        }
      });
    }
  }
  // Queues a commit's batches, a job each.
  void submit(ShardStore* store, std::vector<Batch> batches) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (Batch& b : batches) jobs.push_back(Job{store, std::move(b)});
    }
    if (batches.size() == 1) {
      cv.notify_one();
    } else {
      cv.notify_all();
    }
  }
  ~Applier() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
  // Something changed for waiters: a batch was applied (or a commit took none), or
  // batches were parked (that a waiter may apply).
  void done() {
    in_flight.fetch_sub(1, std::memory_order_acq_rel);
    applied.fetch_add(1, std::memory_order_release);
    applied.notify_all();
  }
};

std::size_t ShardStore::stripe_index(Key key) const { return local_of(key) % kStripes; }

std::size_t ShardStore::home_stripe() {
  // Threads numbered in turn never share a stripe (up to kStripes threads).
  static std::atomic<std::size_t> threads_seen{0};
  thread_local const std::size_t home = threads_seen.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return home;
}

ShardStore::~ShardStore() {
  if (applier_) {
    while (help_apply()) {
    }
  }
  applier_.reset();  // applies what was committed, then stops: before the rows go
  for (std::uint64_t c = 0; chunks_ && c < chunk_count_; ++c) huge_free(chunks_[c].load(), chunk_bytes());
}

ShardStore::ShardStore(ShardStore&& o) noexcept
    : config_(std::move(o.config_)),
      shards_div_(o.shards_div_),
      state_(o.state_),
      local_rows_(o.local_rows_),
      chunks_(std::move(o.chunks_)),
      chunk_count_(o.chunk_count_),
      initialized_(std::move(o.initialized_)),
      initialized_count_(o.initialized_count_.load()),
      lent_(std::move(o.lent_)),
      lending_(o.lending_.load()),
      lent_rows_(std::move(o.lent_rows_)),
      stripes_(std::move(o.stripes_)),
      applier_(std::move(o.applier_)) {  // jobs name their store: moved only while none is in flight
  o.chunk_count_ = 0;
}

std::uint64_t ShardStore::local_rows(const StoreConfig& c) { return c.num_keys > c.shard ? (c.num_keys - 1 - c.shard) / c.shards + 1 : 0; }

std::uint64_t ShardStore::bytes_when_full(const StoreConfig& c) {
  return local_rows(c) * ((c.dim + state_floats(c.optimizer.kind, c.dim)) * sizeof(float) + 1);
}

std::size_t ShardStore::pending() {
  wait_all_applied();
  return unapplied();
}

std::size_t ShardStore::unapplied() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kStripes; ++i) {
    tbb::spin_mutex::scoped_lock lock(stripes_[i].mu);
    n += stripes_[i].partial.size() + stripes_[i].ready.size();
  }
  return n;
}

void ShardStore::help_until_applied(const std::atomic<std::uint8_t>* row) {
  Applier& a = *applier_;
  while (true) {
    // Read the counter before the checks: a commit finishing (or parking) after them
    // changes it, so the wait below returns at once instead of missing that wake-up.
    const std::uint32_t seen = a.applied.load(std::memory_order_acquire);
    // Nothing in flight: a row still aggregating waits for contributions or a commit,
    // not for an apply.
    if (a.in_flight.load(std::memory_order_acquire) == 0) return;
    if (row != nullptr && row->load(std::memory_order_acquire) != kAggregating) return;
    if (help_apply()) continue;  // parked rows (maybe this one): no thread is on them
    a.applied.wait(seen, std::memory_order_acquire);
  }
}

std::unique_lock<std::shared_mutex> ShardStore::hold_off_applies() {
  std::unique_lock<std::shared_mutex> no_applies;
  while (true) {
    wait_all_applied();
    no_applies = std::unique_lock<std::shared_mutex>(applier_->gate);
    if (applier_->in_flight.load(std::memory_order_acquire) == 0) return no_applies;
    no_applies.unlock();  // a commit came in meanwhile: its rows first
  }
}

bool ShardStore::take_parked(Stripe& st, Batch& b) {
  if (st.parked_count.load(std::memory_order_acquire) == 0) return false;
  tbb::spin_mutex::scoped_lock lock(st.mu);
  if (st.parked.empty()) return false;  // another thread took it
  b = std::move(st.parked.back());
  st.parked.pop_back();
  st.parked_count.store(st.parked.size(), std::memory_order_release);
  return true;
}

bool ShardStore::help_apply() {
  const std::size_t home = home_stripe();
  Batch b;
  for (std::size_t r = 0; r < kStripes; ++r) {
    if (take_parked(stripes_[(home + r) % kStripes], b)) {
      finish_batch(b);
      return true;
    }
  }
  return false;
}

ShardStore::ShardStore(StoreConfig config) : config_(std::move(config)) {
  if (config_.shards == 0 || config_.shard >= config_.shards) throw ConfigError("shard index out of range");
  shards_div_ = FastDiv(config_.shards);
  if (config_.dim == 0) throw ConfigError("embedding dimension must be positive");
  if (!config_.lr_at) {
    const float lr = config_.optimizer.lr;
    config_.lr_at = [lr](std::uint64_t) { return lr; };
  }
  state_ = state_floats(config_.optimizer.kind, config_.dim);
  local_rows_ = local_rows(config_);
  chunk_count_ = (local_rows_ + kChunkRows - 1) / kChunkRows;
  try {
    chunks_ = std::make_unique<std::atomic<float*>[]>(chunk_count_);
    initialized_ = decltype(initialized_)(local_rows_);  // all kNew
  } catch (const std::bad_alloc&) {
    throw ConfigError("cannot allocate the row index of shard " + std::to_string(config_.shard) + " (" + std::to_string(local_rows_) +
                      " rows): add shards");
  }
  for (std::uint64_t c = 0; c < chunk_count_; ++c) chunks_[c].store(nullptr);
  stripes_ = std::make_unique<Stripe[]>(kStripes);
  if (config_.apply_threads == 0 || config_.apply_threads > 256) {
    throw ConfigError("apply threads: " + std::to_string(config_.apply_threads) + " (1 to 256)");
  }
  applier_ = std::make_unique<Applier>(config_.apply_threads);
  if (config_.allocate_up_front) {
    try {
      for (std::uint64_t local = 0; local < local_rows_; ++local) row_ptr(local * config_.shards + config_.shard);
    } catch (const std::bad_alloc&) {
      throw ConfigError("cannot allocate the " + std::to_string(bytes_when_full() >> 20) + " MiB of shard " +
                        std::to_string(config_.shard) + "'s rows up front: add shards, or allocate on first use");
    }
  }
}

void ShardStore::refuse_key(Key key) const {
  if (key >= config_.num_keys) {
    throw ProtocolError("key " + std::to_string(key) + " is beyond the " + std::to_string(config_.num_keys) + " rows of the tables");
  }
  throw ProtocolError("key " + std::to_string(key) + " belongs to shard " + std::to_string(owner_shard(key, config_.shards)) + ", not " +
                      std::to_string(config_.shard));
}

float* ShardStore::first_touch(Key key) {
  const std::uint64_t local = local_of(key);
  const std::uint32_t rf = row_floats();
  std::atomic<float*>& slot = chunks_[local / kChunkRows];
  float* chunk = slot.load(std::memory_order_acquire);
  if (chunk == nullptr) {
    // First touch of this chunk: whoever installs it first wins; the others free theirs.
    // On huge pages where the host allows: rows are read at random, and on 4 KiB pages
    // nearly every row would also miss the TLB.
    float* fresh = static_cast<float*>(huge_alloc(chunk_bytes()));
    if (slot.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      chunk = fresh;
      if (config_.on_chunk) config_.on_chunk(chunk, chunk_bytes());
    } else {
      huge_free(fresh, chunk_bytes());
    }
  }
  float* p = chunk + (local % kChunkRows) * rf;
  std::atomic<std::uint8_t>& state = initialized_[local];
  if (state.load(std::memory_order_acquire) < kIdle) {
    std::uint8_t expected = kNew;
    if (state.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
      initial_row(config_.seed, key, config_.dim, p);
      init_state(config_.optimizer, config_.dim, p + config_.dim);
      state.store(kIdle, std::memory_order_release);
      initialized_count_.fetch_add(1, std::memory_order_relaxed);
    } else {
      while (state.load(std::memory_order_acquire) < kIdle) std::this_thread::yield();  // another thread is initializing it
    }
  }
  return p;
}

const float* ShardStore::row(Key key) {
  check_key(key);
  return read_row(key);
}

void ShardStore::pull(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);  // all first: a refused pull touches nothing
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * config_.dim, read_row(keys[i]), sizeof(float) * config_.dim);
}

void ShardStore::pull_with_state(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);
  const std::uint32_t rf = row_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * rf, read_row(keys[i]), sizeof(float) * rf);
}

void ShardStore::row_pointers(std::span<const Key> keys, const float** out) {
  for (Key k : keys) check_key(k);
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = read_row(keys[i]);
}

void ShardStore::lend_ahead(std::span<const Key> keys, std::uint64_t iteration) {
  for (Key k : keys) check_key(k);
  std::lock_guard<std::mutex> lock(lent_mu_);
  if (!lent_) {
    lent_ = std::make_unique<std::atomic<std::uint8_t>[]>(local_rows_);
    lending_.store(true, std::memory_order_release);
  }
  for (Key k : keys) {
    read_row(k);  // an update in flight is applied first
    const std::uint64_t local = local_of(k);
    if (initialized_[local].load(std::memory_order_acquire) == kAggregating) {
      throw ProtocolError("prefetch of key " + std::to_string(k) + " for iteration " + std::to_string(iteration) +
                          ": an update of it is not applied yet, so its row is not final");
    }
  }
  for (Key k : keys) {
    const std::uint64_t local = local_of(k);
    if (lent_[local].exchange(1, std::memory_order_acq_rel) == 0) lent_rows_.emplace_back(local, iteration);
  }
}

void ShardStore::end_lending(std::uint64_t iteration) {
  if (!lending_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(lent_mu_);
  std::erase_if(lent_rows_, [&](const std::pair<std::uint64_t, std::uint64_t>& r) {
    if (r.second > iteration) return false;
    lent_[r.first].store(0, std::memory_order_release);
    return true;
  });
}

void ShardStore::check_not_lent_slow(std::span<const Key> keys, const char* what) const {
  for (Key k : keys) {
    if (k < config_.num_keys && owns(k) && lent_[local_of(k)].load(std::memory_order_acquire) != 0) {
      throw ProtocolError(std::string(what) + ": key " + std::to_string(k) +
                          " was prefetched for an iteration not yet committed (the copy served would miss this update)");
    }
  }
}

void ShardStore::push_grad(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers, const float* grads,
                           std::shared_ptr<const void> grads_owner) {
  if (trainers.size() != keys.size()) throw ProtocolError("push-grad: one trainer count per key is required");
  check_not_lent(keys, "push-grad");
  // The common case first, in one pass: every row idle and complete with this push (one
  // trainer). Claim each row (idle to aggregating by compare-and-swap: of two claims one
  // wins), then append the whole request to one stripe's ready list: ready rows need no
  // lookup by key, so any stripe does. A one-trainer row that is aggregating already
  // (once an apply in flight is done) is a repeated push: the claims are undone and the
  // request refused. A bad key or a shared row undoes the claims and takes the general
  // path, which validates the request in full first. A refused request changes nothing
  // (unless another races it on the same keys, which BSP rules out).
  std::size_t claimed = 0;
  auto undo_claims = [&] {
    for (std::size_t j = 0; j < claimed; ++j) initialized_[local_of(keys[j])].store(kIdle, std::memory_order_release);
  };
  for (; claimed < keys.size(); ++claimed) {
    const Key k = keys[claimed];
    if (k >= config_.num_keys || !owns(k) || trainers[claimed] != 1) break;
    const std::uint64_t local = local_of(k);
    if (claim(local)) continue;  // idle: initialized, and now aggregating
    row_ptr(k);                  // a row never touched is initialized first, so that its state can say "aggregating"
    if (!claim(local) && (wait_applied(local), !claim(local))) {
      // A row with one trainer has one contribution: if it is aggregating already, this
      // push repeats one.
      undo_claims();
      throw ProtocolError("push-grad: key " + std::to_string(k) + " of iteration " + std::to_string(iteration) +
                          " pushed twice (in this request, or by another before a commit)");
    }
  }
  if (claimed == keys.size()) {
    // Each handler thread keeps to one stripe: its ready buffer stays warm in cache, and
    // it applies those rows itself after a deferred commit (see shard_store.h).
    // Gradients lent by the transport stay in its buffer until applied: copying a large
    // row in and reading it back out costs about as much as the rest of its push.
    Stripe& st = stripes_[home_stripe()];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    if (grads_owner) {
      const std::uint32_t dim = config_.dim;
      for (std::size_t i = 0; i < keys.size(); ++i) st.ready.push_back({local_of(keys[i]), iteration, grads + i * dim});
      st.ready_owners.push_back(std::move(grads_owner));
    } else {
      for (Key k : keys) st.ready.push_back({local_of(k), iteration, nullptr});
      st.ready_grads.insert(st.ready_grads.end(), grads, grads + keys.size() * config_.dim);
    }
    return;
  }
  undo_claims();
  bool aggregating = false;  // some row already has an aggregation: check it under its lock
  for (std::size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    if (trainers[i] == 0 || trainers[i] > kMaxTrainers) {
      throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " with " + std::to_string(trainers[i]) + " trainers (1 to " +
                          std::to_string(kMaxTrainers) + ")");
    }
    read_row(keys[i]);
    aggregating |= initialized_[local_of(keys[i])].load(std::memory_order_acquire) == kAggregating;
  }
  {
    // A key twice in one request would be half-applied when its second copy is refused.
    thread_local std::vector<Key> sorted;
    sorted.assign(keys.begin(), keys.end());
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
      throw ProtocolError("push-grad: key " + std::to_string(*d) + " twice in one request");
    }
  }
  // The request's keys grouped by stripe, so each stripe's lock is taken once per pass
  // (a lock per key makes handler threads fight over the same cache lines).
  std::array<std::uint32_t, kStripes + 1> start{};
  for (Key k : keys) ++start[stripe_index(k) + 1];
  for (std::size_t s = 0; s < kStripes; ++s) start[s + 1] += start[s];
  thread_local std::vector<std::uint32_t> order;
  order.resize(keys.size());
  {
    std::array<std::uint32_t, kStripes> fill{};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::size_t s = stripe_index(keys[i]);
      order[start[s] + fill[s]++] = static_cast<std::uint32_t>(i);
    }
  }
  // A contribution to an existing aggregation must be of its iteration and not one too many.
  auto check_partial = [&](const Stripe& st, Key k) {
    const Pending* p = st.partial.find(k);
    if (p == nullptr) throw ProtocolError("push-grad: key " + std::to_string(k) + " has all its contributions (awaiting commit)");
    if (p->iteration != iteration) {
      throw ProtocolError("push-grad: key " + std::to_string(k) + " from iteration " + std::to_string(iteration) +
                          " while the aggregation of iteration " + std::to_string(p->iteration) + " is incomplete");
    }
  };
  if (aggregating) {
    for (std::size_t s = 0; s < kStripes; ++s) {
      if (start[s] == start[s + 1]) continue;
      Stripe& st = stripes_[s];
      tbb::spin_mutex::scoped_lock lock(st.mu);
      for (std::uint32_t j = start[s]; j < start[s + 1]; ++j) {
        const Key k = keys[order[j]];
        if (initialized_[local_of(k)].load(std::memory_order_relaxed) == kAggregating) check_partial(st, k);
      }
    }
  }
  const std::uint32_t dim = config_.dim;
  auto append = [dim](std::vector<float>& to, const float* g) { to.insert(to.end(), g, g + dim); };
  // Rows this request completes go to this thread's own ready list, as in the common case
  // above; after the pass (also when it throws), so that no two stripe locks are held.
  thread_local std::vector<Ready> done_rows;
  thread_local std::vector<float> done_grads;
  done_rows.clear();
  done_grads.clear();
  auto complete = [&](Key k, std::uint64_t it, const float* g) {
    done_rows.push_back({local_of(k), it, nullptr});
    append(done_grads, g);
  };
  auto flush = [&] {
    if (done_rows.empty()) return;
    Stripe& home = stripes_[home_stripe()];
    tbb::spin_mutex::scoped_lock lock(home.mu);
    home.ready.insert(home.ready.end(), done_rows.begin(), done_rows.end());
    home.ready_grads.insert(home.ready_grads.end(), done_grads.begin(), done_grads.end());
  };
  // Requests handled at once start at different stripes, so their threads do not queue
  // behind each other stripe after stripe.
  const std::size_t rotate = next_rotation_.fetch_add(17, std::memory_order_relaxed);
  try {
    for (std::size_t r = 0; r < kStripes; ++r) {
      const std::size_t s = (r + rotate) % kStripes;
      if (start[s] == start[s + 1]) continue;
      Stripe& st = stripes_[s];
      tbb::spin_mutex::scoped_lock lock(st.mu);
      for (std::uint32_t j = start[s]; j < start[s + 1]; ++j) {
        const std::uint32_t i = order[j];
        const Key k = keys[i];
        const float* g = grads + static_cast<std::size_t>(i) * dim;
        if (claim(local_of(k))) {
          if (trainers[i] == 1) {
            complete(k, iteration, g);
          } else {
            const std::uint32_t offset = st.take_blocks(blocks_for(trainers[i]), dim);
            std::memcpy(st.partial_grads.data() + offset, g, dim * sizeof(float));
            st.partial.try_emplace(k, Pending{iteration, trainers[i], 1, offset});
          }
          continue;
        }
        check_partial(st, k);  // again: another request may have raced this one
        Pending* p = st.partial.find(k);
        float* __restrict acc = st.partial_grads.data() + p->offset;
        if (blocks_for(p->expected) == 1) {
          for (std::uint32_t d = 0; d < dim; ++d) acc[d] += g[d];
        } else {
          std::memcpy(acc + static_cast<std::size_t>(p->received) * dim, g, dim * sizeof(float));
        }
        if (++p->received == p->expected) {
          if (blocks_for(p->expected) > 1) sum_in_canonical_order(acc, p->expected, dim);
          complete(k, p->iteration, acc);  // copied: its blocks may be reused below
          st.give_blocks(p->offset, blocks_for(p->expected));
          st.partial.erase(k);
        }
      }
    }
  } catch (...) {
    flush();  // rows completed before the refusal stay complete
    throw;
  }
  flush();
}

void ShardStore::push_value(std::span<const Key> keys, const float* rows) {
  check_not_lent(keys, "push-value");
  for (Key k : keys) {
    check_key(k);
    read_row(k);
    if (initialized_[local_of(k)].load(std::memory_order_acquire) == kAggregating) {
      throw ProtocolError("push-value: key " + std::to_string(k) + " has a gradient aggregation not yet applied");
    }
  }
  const std::uint32_t rf = row_floats();
  // Held off while a checkpoint is written, as applies are: it must not hold half a row.
  std::shared_lock<std::shared_mutex> no_save(applier_->gate);
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(row_ptr(keys[i]), rows + i * rf, sizeof(float) * rf);
}

std::uint64_t ShardStore::commit() {
  const std::uint64_t n = commit_async();
  wait_all_applied();
  return n;
}

std::uint64_t ShardStore::commit_async() {
  std::uint64_t rows = 0;
  std::vector<Batch> batches = take_ready(rows, false);
  if (batches.empty()) return 0;
  if (rows * config_.dim < config_.inline_apply_floats) {
    for (Batch& b : batches) finish_batch(b);  // small: waking an applier would cost more than applying here
    return rows;
  }
  applier_->submit(this, std::move(batches));
  return rows;
}

std::uint64_t ShardStore::commit_deferred() {
  std::uint64_t rows = 0;
  take_ready(rows, true);
  return rows;
}

bool ShardStore::deferred_here() const { return stripes_[home_stripe()].parked_count.load(std::memory_order_acquire) > 0; }

std::uint64_t ShardStore::apply_deferred_here() {
  Stripe& st = stripes_[home_stripe()];
  std::uint64_t rows = 0;
  for (Batch b; take_parked(st, b);) {
    rows += b.rows.size();
    finish_batch(b);
  }
  return rows;
}

std::vector<ShardStore::Batch> ShardStore::take_ready(std::uint64_t& rows, bool park) {
  Applier& a = *applier_;
  // In flight before any row leaves a ready list: a reader that finds a row aggregating
  // and nothing in flight knows that row is not being applied. One count for the whole
  // take, then one per batch (before anyone can apply it).
  a.in_flight.fetch_add(1, std::memory_order_acq_rel);
  std::vector<Batch> batches;
  rows = 0;
  for (std::size_t s = 0; s < kStripes; ++s) {
    Stripe& st = stripes_[s];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    if (st.ready.empty()) continue;
    rows += st.ready.size();
    a.in_flight.fetch_add(1, std::memory_order_acq_rel);
    Batch b;
    b.stripe = s;
    std::swap(b.rows, st.ready);
    std::swap(b.grads, st.ready_grads);
    std::swap(b.owners, st.ready_owners);
    std::swap(st.ready, st.spare_rows);  // buffers grown already, if the stripe has them
    std::swap(st.ready_grads, st.spare_grads);
    if (park) {
      st.parked.push_back(std::move(b));
      st.parked_count.store(st.parked.size(), std::memory_order_release);
    } else {
      batches.push_back(std::move(b));
    }
  }
  a.done();  // the take's own count; wakes waiters that may now apply parked rows
  return batches;
}

void ShardStore::finish_batch(Batch& b) {
  Applier& a = *applier_;
  {
    std::shared_lock<std::shared_mutex> g(a.gate);
    apply_batch(b);
  }
  b.rows.clear();
  b.grads.clear();
  b.owners.clear();  // the pushes' payloads go back to their transport
  {
    // Keep the larger buffers for the stripe's next batch.
    Stripe& st = stripes_[b.stripe];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    if (st.spare_rows.capacity() < b.rows.capacity()) std::swap(st.spare_rows, b.rows);
    if (st.spare_grads.capacity() < b.grads.capacity()) std::swap(st.spare_grads, b.grads);
  }
  a.done();
}

void ShardStore::apply_batch(const Batch& b) {
  with_kind(config_.optimizer.kind, [&](auto kind) { apply_batch_as<decltype(kind)::value>(b); });
}

template <OptimizerKind K>
void ShardStore::apply_batch_as(const Batch& b) {
  // Rows are independent: any order gives the same rows. One thread: on a busy host a
  // split over TBB's workers cost more CPU per row (their spinning) than it saved.
  const std::uint32_t dim = config_.dim, rf = row_floats();
  // Rows of a batch are scattered over the table (a worker's rows): each is a cache miss,
  // so the rows some entries ahead, and their state bytes, are fetched while this one is
  // applied (their chunks exist: the push initialized every row).
  const std::size_t ahead = rows_to_fetch_ahead(rf * sizeof(float));
  auto prefetch = [&](std::uint64_t local) {
    const char* p = reinterpret_cast<const char*>(row_address(local));
    for (std::size_t o = 0; o < rf * sizeof(float); o += 64) __builtin_prefetch(p + o, 1);
    __builtin_prefetch(&initialized_[local], 1);  // set idle once applied
  };
  for (std::size_t j = 0; j < std::min(ahead, b.rows.size()); ++j) prefetch(b.rows[j].local);
  std::uint64_t lr_iteration = ~std::uint64_t{0};
  float lr = 0;
  const float* copied = b.grads.data();  // the next copied gradient
  for (std::size_t j = 0; j < b.rows.size(); ++j) {
    if (j + ahead < b.rows.size()) prefetch(b.rows[j + ahead].local);
    const Ready& r = b.rows[j];
    if (r.iteration != lr_iteration) {
      lr_iteration = r.iteration;
      lr = config_.lr_at(r.iteration);
    }
    float* row = row_address(r.local);  // claimed, so initialized
    const float* grad = r.lent;
    if (grad == nullptr) {
      grad = copied;
      copied += dim;
    }
    apply_as<K>(config_.optimizer, lr, dim, row, row + dim, grad);
    initialized_[r.local].store(kIdle, std::memory_order_release);
  }
}

}  // namespace ember::ps
