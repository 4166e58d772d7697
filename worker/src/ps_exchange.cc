#include "ps_exchange.h"

#include "ember/common/error.h"

namespace ember::worker {

using scheduler::EvictKind;
using scheduler::StepPlan;

U64Map<std::uint32_t> index_rows(const StepPlan& p) {
  U64Map<std::uint32_t> row_of;
  for (std::uint32_t j = 0; j < p.rows.size(); ++j) row_of.try_emplace(p.rows[j].key, j);
  return row_of;
}

PsExchange::PsExchange(ps::PsClient& client, transport::ControlMember& control, RowCache& cache, WireCounts& wire, std::uint32_t dim,
                       std::uint32_t state_floats, std::uint32_t cache_rows)
    : client_(client),
      control_(control),
      cache_(cache),
      wire_(wire),
      row_{dim, state_floats},
      partial_iter_(cache_rows, 0),
      partial_trainers_(cache_rows, 0) {
  wire_.format = row_;
}

void PsExchange::keep_partial(std::uint32_t slot, std::uint64_t t, std::uint32_t trainers) {
  partial_iter_[slot] = t;
  partial_trainers_[slot] = trainers;
}

void PsExchange::take_grad(std::uint32_t slot, GradsByIteration& by_iter) {
  GradBatch& b = by_iter[partial_iter_[slot]];
  b.keys.push_back(cache_.key(slot));
  b.trainers.push_back(partial_trainers_[slot]);
  b.slots.push_back(slot);
}

void PsExchange::push_partials(GradsByIteration& by_iter, std::vector<ps::PsFuture>& sent) {
  for (auto& [iter, b] : by_iter) {
    b.grads.clear();
    cache_.read_grads(b.slots, b.grads);
    sent.push_back(client_.start_push_grad(iter, b.keys, b.trainers, b.grads));
  }
}

void PsExchange::sync_pushes(const StepPlan& p, bool flush) {
  GradsByIteration grads;
  for (const auto& g : p.push_grads) take_grad(g.slot, grads);
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

void PsExchange::barrier(std::uint64_t generation) { control_.barrier(transport::BarrierGroup::kWorkers, generation); }

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

void PsExchange::prefetch(const StepPlan& next, std::uint64_t t) {
  ahead_state_.clear();
  ahead_plain_.clear();
  for (const auto& e : next.pulls) {
    if (!e.prefetch) continue;
    Pulled& into = e.with_state ? ahead_state_ : ahead_plain_;
    into.keys.push_back(e.key);
    into.slots.push_back(e.slot);
  }
  ahead_for_ = t + 1;
  ahead_state_.start(client_, true, t + 1, ps::PsClient::Pull::kAhead);
  ahead_plain_.start(client_, false, t + 1, ps::PsClient::Pull::kAhead);
}

void PsExchange::restore(const std::vector<scheduler::KeySlot>& rows, std::uint64_t t) {
  Pulled r;
  for (const auto& e : rows) {
    r.keys.push_back(e.key);
    r.slots.push_back(e.slot);
  }
  r.start(client_, true, t);
  r.fill(cache_, true);
  wire_.restored += rows.size();
}

void PsExchange::pull(const StepPlan& p, std::uint64_t t) {
  if (!p.pulls.empty()) {
    // Evicted rows' data is copied out first: the pull overwrites their slots.
    GradsByIteration evicted_grads;
    std::vector<Key> evicted_keys;
    std::vector<std::uint32_t> evicted_slots;
    std::vector<float> evicted_rows;
    // Rows the worker applies the optimizer to itself come with their state; the rest
    // (shared rows: their gradients go to the PS) without it.
    Pulled with_state, without_state;
    std::uint64_t prefetched = 0, state = 0;
    for (const auto& e : p.pulls) {
      state += e.with_state;
      if (e.prefetch) {
        ++prefetched;
      } else {
        Pulled& into = e.with_state ? with_state : without_state;
        into.keys.push_back(e.key);
        into.slots.push_back(e.slot);
      }
      if (e.kind == EvictKind::kDirty) {
        evicted_keys.push_back(e.evicted);
        evicted_slots.push_back(e.slot);
        ++wire_.rows.push_evict;
      } else if (e.kind == EvictKind::kPartial) {
        take_grad(e.slot, evicted_grads);
        ++wire_.rows.push_evict;
        ++wire_.rows.evict_partial;
      }
    }
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
      const std::uint64_t ahead = ahead_for_ == t ? ahead_state_.keys.size() + ahead_plain_.keys.size() : 0;
      if (ahead != prefetched) {
        throw Error("iteration " + std::to_string(t) + " marks " + std::to_string(prefetched) + " prefetched rows; " +
                    std::to_string(ahead) + " were pulled ahead for it");
      }
      ahead_state_.fill(cache_, true);
      ahead_plain_.fill(cache_, false);
      wire_.rows.prefetched += prefetched;
    }
    wire_.rows.pulls += p.pulls.size();
    wire_.rows.pull_state += state;
  }
  wire_.rows.hits += p.rows.size() - p.pulls.size();
}

void PsExchange::end_pushes(const StepPlan& p, const U64Map<std::uint32_t>& row_of, std::uint64_t t) {
  if (p.end_pushes.empty()) return;
  GradBatch b;
  for (const auto& e : p.end_pushes) {
    b.keys.push_back(e.key);
    b.trainers.push_back(p.rows[*row_of.find(e.key)].trainers);
    b.slots.push_back(e.slot);
  }
  cache_.read_grads(b.slots, b.grads);
  client_.push_grad(t, b.keys, b.trainers, b.grads);
  wire_.rows.push_grad += b.keys.size();
}

}  // namespace ember::worker
