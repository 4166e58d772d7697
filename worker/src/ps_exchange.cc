#include "ps_exchange.h"

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
      dim_(dim),
      state_(state_floats),
      partial_iter_(cache_rows, 0),
      partial_trainers_(cache_rows, 0) {}

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
    wire_.bytes_out += b.keys.size() * 16 + b.grads.size() * 4;
  }
}

void PsExchange::sync_pushes(const StepPlan& p, bool flush) {
  GradsByIteration grads;
  for (const auto& g : p.push_grads) {
    take_grad(g.slot, grads);
    cache_.drop(g.slot);
  }
  // The gradients and the write-backs in flight together.
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
      cache_.set_row_state(v.slot, cache::RowState::kLatestClean);
    }
    cache_.read_rows(slots, rows);
    sent.push_back(client_.start_push_value(keys, rows));
    wire_.bytes_out += keys.size() * 8 + rows.size() * 4;
  }
  for (auto& f : sent) f.wait();
  (flush ? wire_.flush_grad : wire_.push_grad) += p.push_grads.size();
  (flush ? wire_.flush_value : wire_.push_value) += p.push_values.size();
}

void PsExchange::barrier(std::uint64_t generation) { control_.barrier(transport::BarrierGroup::kWorkers, generation); }

CommitNews PsExchange::commit(std::uint64_t iteration, std::uint32_t flags) {
  ps::PsFuture f = client_.start_commit(iteration, flags);
  f.wait();
  return {f.checkpoints_at(), f.stop_at()};
}

void PsExchange::pull(const StepPlan& p, std::uint64_t t) {
  if (!p.pulls.empty()) {
    // Evicted rows' data is copied out first: the pull overwrites their slots.
    GradsByIteration evicted_grads;
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
      cache_.read_rows(evicted_slots, evicted_rows);
      sent.push_back(client_.start_push_value(evicted_keys, evicted_rows));
      wire_.bytes_out += evicted_keys.size() * 8 + evicted_rows.size() * 4;
    }
    push_partials(evicted_grads, sent);
    std::vector<float> rows;
    // A slot per key: the keys are distinct.
    ps::PsFuture pulled = client_.start_pull(pull_keys, rows, true, t, ps::PsClient::Dedup::kNo);
    for (auto& f : sent) f.wait();
    pulled.wait();
    cache_.fill(pull_slots, pull_keys, rows.data());
    wire_.pulls += p.pulls.size();
    wire_.bytes_out += pull_keys.size() * 8;
    wire_.bytes_in += rows.size() * 4;
  }
  wire_.hits += p.rows.size() - p.pulls.size();
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
  wire_.push_grad += b.keys.size();
  wire_.bytes_out += b.keys.size() * 16 + b.grads.size() * 4;
}

}  // namespace ember::worker
