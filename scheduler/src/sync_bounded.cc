// Bounded staleness (het:S, HET-style): no sync phase; every trainer pushes its gradient
// at the end of the iteration and the row's version at the PS moves on; a cached copy
// serves while at most S versions behind it, a staler one is refreshed in place when
// needed and dropped at the end of an iteration that leaves it too far behind. Cached
// copies are tracked as holders (a mask per row, so at most 64 workers), never as latest or
// partial.
#include <atomic>

#include "bits.h"
#include "sync_mode.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kNoSlot = cache::LruIndex::kNone;

}  // namespace

BoundedSync::BoundedSync(const SchedulerConfig& c, std::uint32_t capacity)
    : staleness_(c.policy.staleness()), ps_version_(c.num_keys, 0), holders_(c.num_keys, 0), copy_version_(c.workers) {
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    if (c.models(w)) copy_version_[w].assign(capacity, 0);
  }
}

std::size_t BoundedSync::memory_bytes() const {
  std::size_t b = ps_version_.capacity() * sizeof(std::uint32_t) + holders_.capacity() * sizeof(std::uint64_t);
  for (const auto& v : copy_version_) b += v.capacity() * sizeof(std::uint32_t);
  return b;
}

// No placement (uncached rows), lookahead or prefetch applies here: the rows are all
// cached, recency is plain LRU, no pull is marked.
void BoundedSync::pull(Iteration& it, std::uint32_t w) {
  WorkerCache& lru = it.cache(w);
  StepPlan& plan = it.plans[w];
  const BatchRows& s = it.rows;
  TrafficCounts& c = it.rows.per_worker[w];
  const auto& kw = s.kw[w];
  const std::uint32_t S = staleness_;
  plan.rows.resize(kw.size());
  // Index entries 16 rows ahead.
  constexpr std::size_t kFar = 16;
  const std::size_t nk = kw.size();
  for (std::size_t j = 0; j < nk; ++j) {
    if (j + kFar < nk) lru.prefetch(s.keys[kw[j + kFar]]);
    const std::uint32_t d = kw[j];
    const Key k = s.keys[d];
    std::uint32_t slot = kNoSlot;
    std::uint32_t cs = lru.find(k);
    if (cs != kNoSlot && ps_version_[k] - copy_version_[w][cs] <= S) slot = cs;
    plan.rows[j] = {k, slot, s.count(d), false};
    if (slot != kNoSlot) {
      lru.touch(slot);
      ++c.hits;
    }
  }
  for (std::size_t j = 0; j < nk; ++j) {
    RowRef& row = plan.rows[j];
    if (row.slot != kNoSlot) continue;
    const Key k = row.key;
    PullEntry pull{k, kNoSlot, 0, EvictKind::kNone};
    std::uint32_t stale = lru.find(k);
    if (stale != kNoSlot) {
      // A copy too many versions behind is refreshed in place.
      lru.touch(stale);
      pull.slot = stale;
    } else {
      if (lru.full(k)) {
        Key e;
        lru.evict(k, e);
        pull.evicted = e;
        pull.kind = EvictKind::kClean;  // gradients were pushed when computed
        std::atomic_ref<std::uint64_t>(holders_[e]).fetch_and(~bit(w), std::memory_order_relaxed);
      }
      pull.slot = lru.insert(k);
    }
    copy_version_[w][pull.slot] = ps_version_[k];
    std::atomic_ref<std::uint64_t>(holders_[k]).fetch_or(bit(w), std::memory_order_relaxed);
    row.slot = pull.slot;
    pull.with_state = true;  // every trainer applies the optimizer to its copy
    plan.pulls.push_back(pull);
    ++c.pulls;
    c.pull_state += pull.with_state;
    c.cold_pulls += s.cold_d[kw[j]];
  }
  it.rows.set_slots(w, plan.rows);
}

void BoundedSync::train(Iteration& it) {
  BatchRows& s = it.rows;
  const std::uint32_t D = s.size(), S = staleness_;
  for (std::uint32_t d = 0; d < D; ++d) {
    if (s.replicated_d[d]) continue;  // replicated: all-reduced among the workers
    const Key k = s.keys[d];
    ++ps_version_[k];
    s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
      if (!it.models(w)) return;
      it.plans[w].end_pushes.push_back({k, slot});
      ++s.per_worker[w].push_grad;
      // The sole trainer applied its own update: its copy is as new as the PS's.
      if (s.count(d) == 1) copy_version_[w][slot] = ps_version_[k];
    });
    std::uint64_t holders = holders_[k];
    for_each_bit(holders, [&](std::uint32_t h) {
      std::uint32_t slot = it.cache(h).find(k);
      if (ps_version_[k] - copy_version_[h][slot] > S) {
        it.cache(h).erase(k);
        it.plans[h].drops.push_back({k, slot});
        holders &= ~bit(h);
      }
    });
    holders_[k] = holders;
  }
}

}  // namespace ember::scheduler
