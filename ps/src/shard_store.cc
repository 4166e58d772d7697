// The store's facade and its push path: rows (RowArena) are read and written here,
// pushes aggregated in the stripes (store_stripes.h). Commits and applies are in
// shard_store_apply.cc, checkpoint files in shard_store_io.cc.
#include "ember/ps/shard_store.h"

#include <tbb/spin_mutex.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "apply_queue.h"
#include "ember/common/error.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/protocol.h"
#include "store_stripes.h"

namespace ember::ps {

std::size_t ShardStore::stripe_index(Key key) const { return local_of(key) % kStripes; }

ShardStore::~ShardStore() {
  if (applier_) {
    while (help_apply()) {
    }
  }
  applier_.reset();  // applies what was committed, then stops: before the rows go (arena_)
}

ShardStore::ShardStore(ShardStore&& o) noexcept
    : config_(std::move(o.config_)),
      state_(o.state_),
      arena_(std::move(o.arena_)),
      tier_(arena_.tier()),
      changed_(std::move(o.changed_)),
      id_changed_(std::move(o.id_changed_)),
      delta_previous_(o.delta_previous_),
      delta_previous_sum_(o.delta_previous_sum_),
      slot_ids_(std::move(o.slot_ids_)),
      made_iteration_(o.made_iteration_),
      made_(std::move(o.made_)),
      lending_(std::move(o.lending_)),
      stripes_(std::move(o.stripes_)),
      applier_(std::move(o.applier_)) {}  // jobs name their store: moved only while none is in flight

std::uint64_t ShardStore::local_rows(const StoreConfig& c) { return RowArena::local_rows(c); }

std::uint64_t ShardStore::bytes_when_full(const StoreConfig& c) {
  // On a tier: its budget, and per row a state byte and the tier's word (disk_tier.h).
  // Hashed ids: 8 bytes a slot more, its id.
  const std::uint64_t id = c.hashed_ids ? sizeof(std::uint64_t) : 0;
  if (!c.tier.dir.empty()) return c.tier.ram_budget_bytes + local_rows(c) * (1 + 8 + id);
  return local_rows(c) * ((c.dim + state_floats(c.optimizer.kind, c.dim)) * sizeof(float) + 1 + id);
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

StoreConfig ShardStore::checked(StoreConfig config) {
  if (config.shards == 0 || config.shard >= config.shards) throw ConfigError("shard index out of range");
  if (config.dim == 0) throw ConfigError("embedding dimension must be positive");
  if (!config.lr_at) {
    const float lr = config.optimizer.lr;
    config.lr_at = [lr](std::uint64_t) { return lr; };
  }
  return config;
}

ShardStore::ShardStore(StoreConfig config)
    : config_(checked(std::move(config))),
      state_(state_floats(config_.optimizer.kind, config_.dim)),
      arena_(config_, config_.dim + state_),
      tier_(arena_.tier()) {
  stripes_ = std::make_unique<Stripe[]>(kStripes);
  if (config_.serving_deltas) config_.track_changes = true;
  if (config_.track_changes) {
    changed_ = std::make_unique<std::atomic<std::uint64_t>[]>((local_rows() + 63) / 64);
    clear_changes();
  }
  if (config_.serving_deltas && config_.hashed_ids) {
    id_changed_ = std::make_unique<std::atomic<std::uint64_t>[]>((local_rows() + 63) / 64);
    for (std::uint64_t w = 0; w < (local_rows() + 63) / 64; ++w) id_changed_[w].store(0, std::memory_order_relaxed);
  }
  if (config_.hashed_ids) {
    slot_ids_.reset(static_cast<std::uint64_t*>(std::calloc(std::max<std::uint64_t>(local_rows(), 1), sizeof(std::uint64_t))));
    if (!slot_ids_) throw std::bad_alloc();
  }
  if (config_.apply_threads == 0 || config_.apply_threads > 256) {
    throw ConfigError("apply threads: " + std::to_string(config_.apply_threads) + " (1 to 256)");
  }
  applier_ = std::make_unique<Applier>(config_.apply_threads);
  if (config_.allocate_up_front) {
    try {
      for (std::uint64_t local = 0; local < local_rows(); ++local) prepare_row(arena_.key_of(local));
    } catch (const std::bad_alloc&) {
      throw ConfigError("cannot allocate the " + std::to_string(bytes_when_full() >> 20) + " MiB of shard " +
                        std::to_string(config_.shard) + "'s rows up front: add shards, or allocate on first use");
    }
  }
}

void ShardStore::check_tier() const {
  if (tier_->failed()) [[unlikely]]
    throw IoError("shard " + std::to_string(config_.shard) + "'s disk tier failed: " + tier_->error());
}

ShardStore::RowRef ShardStore::pin_tiered(Key key, bool write, bool no_read) {
  check_tier();
  return {arena_.pin(key, write, no_read), tier_, local_of(key)};
}

void ShardStore::prepare_row(Key key) {
  const std::uint64_t local = local_of(key);
  if (tier_ == nullptr) {
    row_ptr(key);
  } else {
    check_tier();
    if (arena_.state(local).load(std::memory_order_acquire) < kIdle) pin_tiered(key, true, true);  // initialized in memory, unpinned again
  }
  wait_applied(local);
}

void ShardStore::hint(std::span<const Key> keys, std::uint64_t iteration) {
  for (Key k : keys) check_key(k);
  if (tier_ == nullptr) return;
  std::vector<std::uint64_t> locals;  // handed to the tier's loader thread
  locals.reserve(keys.size());
  for (Key k : keys) {
    // A row never used is not on disk: its first use initializes it, no read.
    const std::uint64_t local = local_of(k);
    if (arena_.state(local).load(std::memory_order_relaxed) >= kIdle) locals.push_back(local);
  }
  tier_->hint(std::move(locals), iteration);
}

std::optional<TierStats> ShardStore::tier_stats() const {
  if (tier_ == nullptr) return std::nullopt;
  return tier_->stats();
}

const float* ShardStore::row(Key key) {
  check_key(key);
  if (tier_ != nullptr) throw Error("ShardStore::row: a tiered store's rows move (pull them)");
  return read_row(key).get();
}

void ShardStore::pull(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);  // all first: a refused pull touches nothing
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * config_.dim, read_row(keys[i]).get(), sizeof(float) * config_.dim);
}

void ShardStore::pull_with_state(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);
  const std::uint32_t rf = row_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * rf, read_row(keys[i]).get(), sizeof(float) * rf);
}

void ShardStore::row_pointers(std::span<const Key> keys, const float** out) {
  for (Key k : keys) check_key(k);
  if (tier_ != nullptr) throw Error("ShardStore::row_pointers: a tiered store's rows move (pull them)");
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = read_row(keys[i]).get();
}

void ShardStore::lend_ahead(std::span<const Key> keys, std::uint64_t iteration) {
  for (Key k : keys) check_key(k);
  lending_.lend(arena_, keys, iteration, local_rows(), [&] {
    for (Key k : keys) {
      wait_applied(local_of(k));  // an update in flight is applied first
      if (aggregating(local_of(k))) {
        throw ProtocolError("prefetch of key " + std::to_string(k) + " for iteration " + std::to_string(iteration) +
                            ": an update of it is not applied yet, so its row is not final");
      }
    }
  });
}

void ShardStore::end_lending(std::uint64_t iteration) { lending_.end(iteration); }

void ShardStore::push_grad(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers, const float* grads,
                           std::shared_ptr<const void> grads_owner, std::span<const std::uint32_t> shares, std::uint32_t group) {
  if (trainers.size() != keys.size()) throw ProtocolError("push-grad: one trainer count per key is required");
  if (!shares.empty() && shares.size() != keys.size()) throw ProtocolError("push-grad: one share per key, or none");
  lending_.check_not_lent(arena_, keys, "push-grad");
  if (tier_ != nullptr) {
    check_tier();
    tier_->advance(iteration);
  }
  // Shares (rows summed by a host) take the general path, which validates them.
  if (shares.empty() && claim_single_trainer_rows(iteration, keys, trainers)) {
    append_ready(iteration, keys, grads, std::move(grads_owner));
    return;
  }
  push_grad_general(iteration, keys, trainers, group, grads, shares);
}

bool ShardStore::claim_single_trainer_rows(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers) {
  // The common case, in one pass: every row idle and complete with this push (one
  // trainer). Claim each row (idle to aggregating by compare-and-swap: of two claims one
  // wins). A one-trainer row that is aggregating already (once an apply in flight is
  // done) is a repeated push: the claims are undone and the request refused. A bad key
  // or a shared row undoes the claims and takes the general path, which validates the
  // request in full first. A refused request changes nothing (unless another races it on
  // the same keys, which BSP rules out).
  std::size_t claimed = 0;
  auto undo_claims = [&] {
    for (std::size_t j = 0; j < claimed; ++j) arena_.state(local_of(keys[j])).store(kIdle, std::memory_order_release);
  };
  for (; claimed < keys.size(); ++claimed) {
    const Key k = keys[claimed];
    if (k >= config_.num_keys || !owns(k) || trainers[claimed] != 1) break;
    const std::uint64_t local = local_of(k);
    if (claim(local)) continue;  // idle: initialized, and now aggregating
    prepare_row(k);              // a row never touched is initialized first, so that its state can say "aggregating"
    if (!claim(local) && (wait_applied(local), !claim(local))) {
      // A row with one trainer has one contribution: if it is aggregating already, this
      // push repeats one.
      undo_claims();
      throw ProtocolError("push-grad: key " + std::to_string(k) + " of iteration " + std::to_string(iteration) +
                          " pushed twice (in this request, or by another before a commit)");
    }
  }
  if (claimed == keys.size()) return true;
  undo_claims();
  return false;
}

void ShardStore::append_ready(std::uint64_t iteration, std::span<const Key> keys, const float* grads, std::shared_ptr<const void> owner) {
  // Ready rows need no lookup by key, so any stripe does: each handler thread keeps to
  // its own, whose ready buffer stays warm in cache, and applies those rows itself after
  // a deferred commit (see shard_store.h). Gradients lent by the transport stay in its
  // buffer until applied: copying a large row in and reading it back out costs about as
  // much as the rest of its push.
  Stripe& st = stripes_[home_stripe()];
  tbb::spin_mutex::scoped_lock lock(st.mu);
  if (owner) {
    const std::uint32_t dim = config_.dim;
    for (std::size_t i = 0; i < keys.size(); ++i) st.ready.push_back({local_of(keys[i]), iteration, grads + i * dim});
    st.ready_owners.push_back(std::move(owner));
  } else {
    for (Key k : keys) st.ready.push_back({local_of(k), iteration, nullptr});
    st.ready_grads.insert(st.ready_grads.end(), grads, grads + keys.size() * config_.dim);
  }
}

// The general path's state for one request, kept per thread (no allocation per request):
// the request's keys grouped by stripe (order[start[s], start[s + 1]) are stripe s's), so
// each stripe's lock is taken once per pass (a lock per key makes handler threads fight
// over the same cache lines), and the rows it completes, appended to this thread's ready
// list after the pass (also when it throws), so that no two stripe locks are held.
struct ShardStore::PushPlan {
  std::array<std::uint32_t, kStripes + 1> start{};
  std::vector<std::uint32_t> order;
  std::vector<Ready> done_rows;
  std::vector<float> done_grads;
};

void ShardStore::push_grad_general(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers,
                                   std::uint32_t group, const float* grads, std::span<const std::uint32_t> shares) {
  const bool some_aggregating = validate_push(keys, trainers, shares);
  const auto share_of = [&](std::size_t i) { return shares.empty() ? 1u : shares[i]; };
  thread_local PushPlan plan;
  group_by_stripe(keys, plan);
  if (some_aggregating) {
    for (std::size_t s = 0; s < kStripes; ++s) {
      if (plan.start[s] == plan.start[s + 1]) continue;
      Stripe& st = stripes_[s];
      tbb::spin_mutex::scoped_lock lock(st.mu);
      for (std::uint32_t j = plan.start[s]; j < plan.start[s + 1]; ++j) {
        const Key k = keys[plan.order[j]];
        if (arena_.state(local_of(k)).load(std::memory_order_relaxed) == kAggregating)
          check_partial(st, k, iteration, share_of(plan.order[j]));
      }
    }
  }
  plan.done_rows.clear();
  plan.done_grads.clear();
  // Requests handled at once start at different stripes, so their threads do not queue
  // behind each other stripe after stripe.
  const std::size_t rotate = next_rotation_.fetch_add(17, std::memory_order_relaxed);
  try {
    for (std::size_t r = 0; r < kStripes; ++r) {
      const std::size_t s = (r + rotate) % kStripes;
      if (plan.start[s] == plan.start[s + 1]) continue;
      Stripe& st = stripes_[s];
      tbb::spin_mutex::scoped_lock lock(st.mu);
      for (std::uint32_t j = plan.start[s]; j < plan.start[s + 1]; ++j) {
        const std::uint32_t i = plan.order[j];
        add_contribution(st, iteration, keys[i], trainers[i], share_of(i), group, grads + static_cast<std::size_t>(i) * config_.dim, plan);
      }
    }
  } catch (...) {
    flush_done(plan);  // rows completed before the refusal stay complete
    throw;
  }
  flush_done(plan);
}

bool ShardStore::validate_push(std::span<const Key> keys, std::span<const std::uint32_t> trainers, std::span<const std::uint32_t> shares) {
  bool some_aggregating = false;  // some row already has an aggregation: checked under its lock
  for (std::size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    if (trainers[i] == 0 || trainers[i] > kMaxTrainers) {
      throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " with " + std::to_string(trainers[i]) + " trainers (1 to " +
                          std::to_string(kMaxTrainers) + ")");
    }
    if (!shares.empty() && (shares[i] == 0 || shares[i] > trainers[i])) {
      throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " sums " + std::to_string(shares[i]) + " of its " +
                          std::to_string(trainers[i]) + " trainers' gradients");
    }
    prepare_row(keys[i]);
    some_aggregating |= aggregating(local_of(keys[i]));
  }
  // A key twice in one request would be half-applied when its second copy is refused.
  thread_local std::vector<Key> sorted;
  sorted.assign(keys.begin(), keys.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    throw ProtocolError("push-grad: key " + std::to_string(*d) + " twice in one request");
  }
  return some_aggregating;
}

void ShardStore::group_by_stripe(std::span<const Key> keys, PushPlan& plan) const {
  plan.start.fill(0);
  for (Key k : keys) ++plan.start[stripe_index(k) + 1];
  for (std::size_t s = 0; s < kStripes; ++s) plan.start[s + 1] += plan.start[s];
  plan.order.resize(keys.size());
  std::array<std::uint32_t, kStripes> fill{};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::size_t s = stripe_index(keys[i]);
    plan.order[plan.start[s] + fill[s]++] = static_cast<std::uint32_t>(i);
  }
}

void ShardStore::check_partial(const Stripe& st, Key k, std::uint64_t iteration, std::uint32_t share) const {
  // A contribution to an existing aggregation must be of its iteration and not one too many.
  const Pending* p = st.partial.find(k);
  if (p == nullptr) throw ProtocolError("push-grad: key " + std::to_string(k) + " has all its contributions (awaiting commit)");
  if (p->iteration != iteration) {
    throw ProtocolError("push-grad: key " + std::to_string(k) + " from iteration " + std::to_string(iteration) +
                        " while the aggregation of iteration " + std::to_string(p->iteration) + " is incomplete");
  }
  if (p->received + share > p->expected) {
    throw ProtocolError("push-grad: key " + std::to_string(k) + " would have gradients of " + std::to_string(p->received + share) +
                        " of its " + std::to_string(p->expected) + " trainers");
  }
}

void ShardStore::add_contribution(Stripe& st, std::uint64_t iteration, Key k, std::uint32_t trainers, std::uint32_t share,
                                  std::uint32_t group, const float* g, PushPlan& plan) {
  const std::uint32_t dim = config_.dim;
  auto complete = [&](std::uint64_t it, const float* sum) {
    plan.done_rows.push_back({local_of(k), it, nullptr});
    plan.done_grads.insert(plan.done_grads.end(), sum, sum + dim);
  };
  if (claim(local_of(k))) {  // the first contribution
    if (share == trainers) return complete(iteration, g);
    const std::uint32_t offset = st.take_blocks(blocks_for(trainers), dim);
    std::memcpy(st.partial_grads.data() + offset, g, dim * sizeof(float));
    st.partial_groups[offset / dim] = static_cast<std::uint16_t>(group);
    st.partial.try_emplace(k, Pending{iteration, trainers, share, 1, offset});
    return;
  }
  check_partial(st, k, iteration, share);  // again: another request may have raced this one
  Pending* p = st.partial.find(k);
  float* __restrict acc = st.partial_grads.data() + p->offset;
  if (blocks_for(p->expected) == 1) {
    for (std::uint32_t d = 0; d < dim; ++d) acc[d] += g[d];
  } else {
    std::memcpy(acc + static_cast<std::size_t>(p->parts) * dim, g, dim * sizeof(float));
    st.partial_groups[p->offset / dim + p->parts] = static_cast<std::uint16_t>(group);
  }
  ++p->parts;
  p->received += share;
  if (p->received == p->expected) {
    if (blocks_for(p->expected) > 1) sum_in_canonical_order(acc, st.partial_groups.data() + p->offset / dim, p->parts, dim);
    complete(p->iteration, acc);  // copied: its blocks may be reused
    st.give_blocks(p->offset, blocks_for(p->expected));
    st.partial.erase(k);
  }
}

void ShardStore::flush_done(PushPlan& plan) {
  if (plan.done_rows.empty()) return;
  Stripe& home = stripes_[home_stripe()];
  tbb::spin_mutex::scoped_lock lock(home.mu);
  home.ready.insert(home.ready.end(), plan.done_rows.begin(), plan.done_rows.end());
  home.ready_grads.insert(home.ready_grads.end(), plan.done_grads.begin(), plan.done_grads.end());
}

void ShardStore::push_value(std::span<const Key> keys, const float* rows) {
  lending_.check_not_lent(arena_, keys, "push-value");
  for (Key k : keys) {
    check_key(k);
    prepare_row(k);
    if (aggregating(local_of(k))) {
      throw ProtocolError("push-value: key " + std::to_string(k) + " has a gradient aggregation not yet applied");
    }
  }
  const std::uint32_t rf = row_floats();
  // Held off while a checkpoint is written, as applies are: it must not hold half a row.
  std::shared_lock<std::shared_mutex> no_save(applier_->gate);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(read_row(keys[i], true, true).get(), rows + i * rf, sizeof(float) * rf);
    mark_changed(local_of(keys[i]));
  }
}

void ShardStore::reset_rows(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint64_t> ids) {
  if (keys.size() != ids.size())
    throw ProtocolError("reset-rows: " + std::to_string(keys.size()) + " slots, " + std::to_string(ids.size()) + " ids");
  lending_.check_not_lent(arena_, keys, "reset-rows");
  for (Key k : keys) {
    check_key(k);
    prepare_row(k);  // initialized, and any update of the old id applied
  }
  // An aggregation of the old id still waiting: its other trainers dropped their
  // partials with the row (Scheduler::drop_rows), so it would never complete.
  for (Key k : keys) {
    const std::uint64_t local = local_of(k);
    if (!aggregating(local)) continue;
    Stripe& st = stripes_[stripe_index(k)];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    if (const Pending* p = st.partial.find(k)) {
      st.give_blocks(p->offset, blocks_for(p->expected));
      st.partial.erase(k);
      arena_.state(local).store(kIdle, std::memory_order_release);
    }
  }
  const std::uint32_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> no_save(applier_->gate);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const RowRef r = read_row(keys[i], true, true);
    if (ids[i] == kFreeSlot)
      std::fill(r.get(), r.get() + dim, 0.0f);
    else
      initial_row(config_.seed, ids[i], dim, r.get());
    init_state(config_.optimizer, dim, r.get() + dim);
    mark_changed(local_of(keys[i]));
  }
  if (!config_.hashed_ids) return;
  if (iteration != made_iteration_) made_.clear(), made_iteration_ = iteration;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::uint64_t local = local_of(keys[i]);
    set_slot_id(local, ids[i]);
    if (id_changed_) id_changed_[local >> 6].fetch_or(std::uint64_t{1} << (local & 63), std::memory_order_relaxed);
    if (ids[i] != kFreeSlot) made_.push_back(local);
  }
}

}  // namespace ember::ps
