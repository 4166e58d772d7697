// ShardStore's apply queue (shard_store.h "Applying after the commit"): commits take the
// ready rows out of the push path, park them or hand them to the appliers, and readers of
// a row not applied yet apply parked rows or wait. The optimizer's pass over a batch runs
// here (compiled as sparse_optimizer.cc is: the PS and the workers agree bit for bit).
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "apply_queue.h"
#include "store_stripes.h"

namespace ember::ps {

std::size_t ShardStore::home_stripe() {
  // Threads numbered in turn never share a stripe (up to kStripes threads).
  static std::atomic<std::size_t> threads_seen{0};
  thread_local const std::size_t home = threads_seen.fetch_add(1, std::memory_order_relaxed) % kStripes;
  return home;
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
    __builtin_prefetch(&arena_.state(local), 1);  // set idle once applied
  };
  // On a tier each row is pinned in turn instead (its slot is known once pinned).
  const bool tiered = tier_ != nullptr;
  if (!tiered)
    for (std::size_t j = 0; j < std::min(ahead, b.rows.size()); ++j) prefetch(b.rows[j].local);
  std::uint64_t lr_iteration = ~std::uint64_t{0};
  float lr = 0;
  const float* copied = b.grads.data();  // the next copied gradient
  for (std::size_t j = 0; j < b.rows.size(); ++j) {
    if (!tiered && j + ahead < b.rows.size()) prefetch(b.rows[j + ahead].local);
    const Ready& r = b.rows[j];
    if (r.iteration != lr_iteration) {
      lr_iteration = r.iteration;
      lr = config_.lr_at(r.iteration);
    }
    const float* grad = r.lent;
    if (grad == nullptr) {
      grad = copied;
      copied += dim;
    }
    float* row = nullptr;  // claimed, so initialized
    if (!tiered) {
      row = row_address(r.local);
    } else {
      try {
        row = tier_->pin(r.local, true);
      } catch (const std::exception&) {
        // The tier failed (it names the file): every request from now on is refused with
        // that error; the row is released so that nothing waits for it forever.
        arena_.state(r.local).store(kIdle, std::memory_order_release);
        continue;
      }
    }
    apply_as<K>(config_.optimizer, lr, dim, row, row + dim, grad);
    if (tiered) tier_->unpin(r.local);
    mark_changed(r.local);
    arena_.state(r.local).store(kIdle, std::memory_order_release);
  }
}

}  // namespace ember::ps
