#include "stages/ps_exchange.h"

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"

namespace ember::worker {

using scheduler::EvictKind;
using scheduler::StepPlan;

namespace {

// Each distinct row of a plan (StepPlan::rows) by key: its index there.
U64Map<std::uint32_t> index_rows(const StepPlan& p) {
  U64Map<std::uint32_t> row_of;
  for (std::uint32_t j = 0; j < p.rows.size(); ++j) row_of.try_emplace(p.rows[j].key, j);
  return row_of;
}

}  // namespace

std::vector<std::uint32_t> slots_of(const std::vector<scheduler::KeySlot>& list) {
  std::vector<std::uint32_t> slots;
  slots.reserve(list.size());
  for (const auto& e : list) slots.push_back(e.slot);
  return slots;
}

std::vector<std::uint32_t> evicted_partials(const StepPlan& p) {
  std::vector<std::uint32_t> slots;
  for (const auto& e : p.pulls)
    if (e.kind == EvictKind::kPartial) slots.push_back(e.slot);
  return slots;
}

PsExchange::PsExchange(ps::PsClient& client, RowCache& cache, WireCounts& wire, scheduler::RowFormat row, std::uint32_t cache_rows)
    : client_(client), cache_(cache), wire_(wire), row_(row), partial_iter_(cache_rows, 0), partial_trainers_(cache_rows, 0) {
  wire_.format = row_;
}

void PsExchange::keep_partial(std::uint32_t slot, std::uint64_t t, std::uint32_t trainers) {
  partial_iter_[slot] = t;
  partial_trainers_[slot] = trainers;
}

std::pair<std::uint64_t, std::uint32_t> PsExchange::take_grad(std::uint32_t slot, GradsByIteration& by_iter, std::uint32_t share) {
  const std::uint64_t it = partial_iter_[slot];
  GradBatch& b = by_iter[it];
  b.keys.push_back(cache_.key(slot));
  b.trainers.push_back(partial_trainers_[slot]);
  b.shares.push_back(share);
  b.slots.push_back(slot);
  return {it, static_cast<std::uint32_t>(b.keys.size() - 1)};
}

namespace {

// Adds the parts other workers of this host handed over (`added`, by row) to this
// worker's, in the order of their bytes, left to right: the order in which a shard sums
// a host's parts that came one by one (sum_in_canonical_order, ps/src/store_stripes.h).
// The host sums only all of a row's parts (scheduler/host_parts.h), so the shard's sum
// has the same bits whichever phases the parts left in.
void sum_host_parts(std::vector<std::pair<std::uint32_t, const float*>>& added, float* grads, std::uint32_t dim) {
  if (added.empty()) return;  // (most pushes: nothing handed over)
  std::stable_sort(added.begin(), added.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::size_t bytes = std::size_t{dim} * sizeof(float);
  std::vector<const float*> parts;
  std::vector<float> own, sum(dim);
  for (std::size_t i = 0; i < added.size();) {
    const std::uint32_t r = added[i].first;
    float* row = grads + std::size_t{r} * dim;
    own.assign(row, row + dim);
    parts.assign(1, own.data());
    for (; i < added.size() && added[i].first == r; ++i) parts.push_back(added[i].second);
    std::sort(parts.begin(), parts.end(), [&](const float* a, const float* b) { return std::memcmp(a, b, bytes) < 0; });
    std::copy(parts[0], parts[0] + dim, sum.begin());
    for (std::size_t p = 1; p < parts.size(); ++p) {
      const float* __restrict x = parts[p];
      for (std::uint32_t d = 0; d < dim; ++d) sum[d] += x[d];
    }
    std::copy(sum.begin(), sum.end(), row);
  }
}

}  // namespace

void PsExchange::push_partials(GradsByIteration& by_iter, std::vector<ps::PsFuture>& sent) {
  for (auto& [iter, b] : by_iter) {
    b.grads.clear();
    cache_.read_grads(b.slots, b.grads);
    sum_host_parts(b.added, b.grads.data(), row_.dim);
    const bool summed = std::any_of(b.shares.begin(), b.shares.end(), [](std::uint32_t s) { return s > 1; });
    sent.push_back(client_.start_push_grad(iter, b.keys, b.trainers, b.grads, summed ? b.shares : std::vector<std::uint32_t>{}, group_));
  }
}

void PsExchange::take_grads(const HandOffs& h, const std::vector<std::uint32_t>& slots, GradsByIteration& by_iter,
                            const std::vector<std::vector<float>>& received) {
  std::vector<std::pair<std::uint64_t, std::uint32_t>> at(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (!h.handed(i)) at[i] = take_grad(slots[i], by_iter, h.share_of(i));
  for (std::size_t j = 0; j < received.size(); ++j) {
    for (std::size_t r = 0; r < h.recv[j].size(); ++r) {
      const auto [it, row] = at[h.recv[j][r]];
      by_iter[it].added.emplace_back(row, received[j].data() + r * row_.dim);
    }
  }
}

void PsExchange::sync_pushes(const StepPlan& p, bool flush, const HandOffs& h, const HandedGrads& handed) {
  GradsByIteration grads;
  take_grads(h, slots_of(p.push_grads), grads, handed);
  // The gradients and the write-backs in flight together.
  std::vector<ps::PsFuture> sent;
  push_partials(grads, sent);
  if (!p.push_values.empty()) {
    std::vector<Key> keys;
    std::vector<std::uint32_t> slots;
    std::vector<float> rows;
    rows.reserve(p.push_values.size() * (row_.dim + row_.state));
    for (const auto& v : p.push_values) {
      keys.push_back(v.key);
      slots.push_back(v.slot);
    }
    cache_.read_rows(slots, rows);
    sent.push_back(client_.start_push_value(keys, rows));
  }
  for (auto& f : sent) f.wait();
  (flush ? wire_.rows.flush_grad : wire_.rows.push_grad) += p.push_grads.size();
  (flush ? wire_.rows.flush_value : wire_.rows.push_value) += p.push_values.size();
}

CommitNews PsExchange::commit(std::uint64_t iteration, std::uint32_t flags) {
  ps::PsFuture f = client_.start_commit(iteration, flags);
  f.wait();
  return {f.checkpoints_at(), f.stop_at()};
}

void PsExchange::Pulled::start(ps::PsClient& client, bool with_state, std::uint64_t t, ps::PsClient::Pull when) {
  if (!keys.empty()) sent = client.start_pull(keys, rows, with_state, t, ps::PsClient::Dedup::kNo, when);
}

void PsExchange::Pulled::fill(RowCache& cache, bool with_state) {
  if (sent.valid()) sent.wait();
  sent = ps::PsFuture();
  cache.fill(slots, keys, rows.data(), with_state);
}

void PsExchange::prefetch(const StepPlan& next, std::uint64_t t, const HostPlans& next_h) {
  ahead_state_.clear();
  ahead_plain_.clear();
  for (std::size_t i = 0; i < next.pulls.size(); ++i) {
    const auto& e = next.pulls[i];
    if (!e.prefetch || next_h.pull.handed(i)) continue;
    Pulled& into = next_h.pull.with_state(i, e.with_state) ? ahead_state_ : ahead_plain_;
    into.keys.push_back(e.key);
    into.slots.push_back(e.slot);
  }
  ahead_for_ = t + 1;
  ahead_state_.start(client_, true, t + 1, ps::PsClient::Pull::kAhead);
  ahead_plain_.start(client_, false, t + 1, ps::PsClient::Pull::kAhead);
}

void PsExchange::hint(const std::vector<Key>& keys, std::uint64_t iteration) {
  if (hint_sent_.valid()) hint_sent_.wait();
  hint_sent_ = client_.start_pull(keys, no_rows_, false, iteration, ps::PsClient::Dedup::kNo, ps::PsClient::Pull::kHint);
}

void PsExchange::restore(const std::vector<scheduler::KeySlot>& rows, std::uint64_t t) {
  Pulled r;
  for (const auto& e : rows) {
    r.keys.push_back(e.key);
    r.slots.push_back(e.slot);
  }
  r.start(client_, true, t, ps::PsClient::Pull::kRead);  // outside the contract's pulls
  r.fill(cache_, true);
  wire_.restored += rows.size();
}

void PsExchange::pull(const StepPlan& p, std::uint64_t t, const HostPlans& h, const HandedGrads& evicted) {
  if (!p.pulls.empty()) {
    // Evicted rows' data is copied out first: the pull overwrites their slots.
    GradsByIteration evicted_grads;
    std::vector<Key> evicted_keys;
    std::vector<std::uint32_t> evicted_slots;
    std::vector<float> evicted_rows;
    // Rows the worker applies the optimizer to itself come with their state; the rest
    // (shared rows: their gradients go to the PS) without it. Rows another worker of
    // this host pulls are handed over after the pulls.
    Pulled with_state, without_state;
    std::uint64_t prefetched = 0, ahead = 0, state = 0, peer = 0;
    for (std::size_t i = 0; i < p.pulls.size(); ++i) {
      const auto& e = p.pulls[i];
      state += e.with_state && !e.peer;
      prefetched += e.prefetch;
      peer += e.peer;
      // Pulled here from the PS unless a worker of this host hands it over.
      const bool from_ps = !e.peer && !h.pull.handed(i);
      if (from_ps && e.prefetch) {
        ++ahead;
      } else if (from_ps) {
        Pulled& into = h.pull.with_state(i, e.with_state) ? with_state : without_state;
        into.keys.push_back(e.key);
        into.slots.push_back(e.slot);
      }
      if (e.kind == EvictKind::kDirty) {
        evicted_keys.push_back(e.evicted);
        evicted_slots.push_back(e.slot);
        ++wire_.rows.push_evict;
      } else if (e.kind == EvictKind::kPartial) {
        ++wire_.rows.push_evict;
        ++wire_.rows.evict_partial;
      }
    }
    take_grads(h.evict, evicted_partials(p), evicted_grads, evicted);
    // Write-backs, evicted gradients and the pulls in flight together: one round trip.
    std::vector<ps::PsFuture> sent;
    if (!evicted_keys.empty()) {
      cache_.read_rows(evicted_slots, evicted_rows);
      sent.push_back(client_.start_push_value(evicted_keys, evicted_rows));
    }
    push_partials(evicted_grads, sent);
    // A slot per key: the keys are distinct.
    with_state.start(client_, true, t);
    without_state.start(client_, false, t);
    for (auto& f : sent) f.wait();
    with_state.fill(cache_, true);
    without_state.fill(cache_, false);
    if (prefetched > 0) {
      // The plan marks what the worker pulled ahead (the same scheduler planned both).
      const std::uint64_t pulled = ahead_for_ == t ? ahead_state_.keys.size() + ahead_plain_.keys.size() : 0;
      if (pulled != ahead) {
        throw Error("iteration " + std::to_string(t) + " marks " + std::to_string(ahead) + " rows prefetched here; " +
                    std::to_string(pulled) + " were pulled ahead for it");
      }
      ahead_state_.fill(cache_, true);
      ahead_plain_.fill(cache_, false);
      wire_.rows.prefetched += prefetched;
    }
    wire_.rows.peer_value += peer;
    wire_.rows.pulls += p.pulls.size() - peer;
    wire_.rows.pull_state += state;
  }
  wire_.rows.hits += p.rows.size() - p.pulls.size();
}

void PsExchange::end_pushes(const StepPlan& p, std::uint64_t t, const HandOffs& h, const HandedGrads& received) {
  if (p.end_pushes.empty() && !h.any) return;
  const U64Map<std::uint32_t> row_of = index_rows(p);  // the pushed rows' trainer counts
  GradBatch b;
  std::vector<std::uint32_t> row(p.end_pushes.size());
  for (std::size_t i = 0; i < p.end_pushes.size(); ++i) {
    if (h.handed(i)) continue;
    const auto& e = p.end_pushes[i];
    row[i] = static_cast<std::uint32_t>(b.keys.size());
    b.keys.push_back(e.key);
    b.trainers.push_back(p.rows[*row_of.find(e.key)].trainers);
    b.shares.push_back(h.share_of(i));
    b.slots.push_back(e.slot);
  }
  for (std::size_t j = 0; j < received.size(); ++j)
    for (std::size_t r = 0; r < h.recv[j].size(); ++r) b.added.emplace_back(row[h.recv[j][r]], received[j].data() + r * row_.dim);
  wire_.rows.push_grad += p.end_pushes.size();
  if (b.keys.empty()) return;
  GradsByIteration batch;
  batch.emplace(t, std::move(b));
  std::vector<ps::PsFuture> sent;
  push_partials(batch, sent);
  for (auto& f : sent) f.wait();
}

void PsExchange::reset_rows(const std::vector<scheduler::SlotAssignment>& resets, std::uint64_t t) {
  std::vector<Key> slots;
  std::vector<std::uint64_t> ids;
  slots.reserve(resets.size());
  ids.reserve(resets.size());
  for (const auto& r : resets) {
    slots.push_back(r.slot);
    ids.push_back(r.id);
  }
  client_.start_reset_rows(t, slots, ids).wait();
  wire_.reset_rows += resets.size();
}

}  // namespace ember::worker
