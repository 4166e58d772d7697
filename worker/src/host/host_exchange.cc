#include "host/host_exchange.h"

#include <torch/torch.h>

#include <string>

#include "ember/common/error.h"

namespace ember::worker {

using scheduler::StepPlan;

HostExchange::HostExchange(RowCache& cache, WireCounts& wire, scheduler::RowFormat row, std::unique_ptr<HostChannel> channel)
    : cache_(cache), wire_(wire), row_(row), channel_(std::move(channel)) {}

HostChannel& HostExchange::channel(const char* what) {
  if (channel_ == nullptr) throw Error(std::string(what) + " planned, but this worker has no channel to its host");
  return *channel_;
}

template <typename SlotOf>
void HostExchange::gradient_buffers(const HandOffs& h, SlotOf&& slot_of, std::vector<std::vector<float>>& send,
                                    std::vector<std::vector<float>>& recv) {
  send.assign(h.send.size(), {});
  recv.assign(h.recv.size(), {});
  for (std::size_t j = 0; j < h.send.size(); ++j) {
    std::vector<std::uint32_t> slots;
    for (std::uint32_t pos : h.send[j]) slots.push_back(slot_of(pos));
    cache_.read_grads(slots, send[j]);
    recv[j].resize(h.recv[j].size() * row_.dim);
    wire_.handed.push_grad.out += send[j].size() * sizeof(float);
    wire_.handed.push_grad.in += recv[j].size() * sizeof(float);
  }
  wire_.handed.push_grad.rows += h.sent();
}

HandedGrads HostExchange::hand_grads(const HandOffs& h, const std::vector<std::uint32_t>& slots) {
  HandedGrads received;
  if (!h.any) return received;
  HostChannel& ch = channel("per-host aggregation");
  std::vector<std::vector<float>> send;
  gradient_buffers(
      h, [&](std::uint32_t pos) { return slots[pos]; }, send, received);
  ch.exchange(send, received);
  return received;
}

void HostExchange::hand_values(const StepPlan& p, const HandOffs& h) {
  peer_rows_.clear();
  peer_at_.clear();
  if (!h.any) return;
  HostChannel& ch = channel("peer sync");
  const std::uint32_t full = row_.dim + row_.state;
  std::vector<std::vector<float>> send(h.send.size());
  peer_rows_.resize(h.recv.size());
  for (std::size_t j = 0; j < h.send.size(); ++j) {
    std::vector<std::uint32_t> slots;
    for (std::uint32_t pos : h.send[j]) slots.push_back(p.hand_values[pos].slot);
    cache_.read_rows(slots, send[j]);
    peer_rows_[j].resize(h.recv[j].size() * full);
    wire_.handed.push_value.out += send[j].size() * sizeof(float);
    wire_.handed.push_value.in += peer_rows_[j].size() * sizeof(float);
  }
  ch.exchange(send, peer_rows_);
  peer_at_ = h.recv;
  wire_.handed.push_value.rows += h.received();
}

void HostExchange::take_peer_rows(const StepPlan& p, std::uint64_t t) {
  const std::uint32_t full = row_.dim + row_.state;
  std::vector<std::uint32_t> slots;
  std::vector<Key> keys;
  std::vector<float> rows;
  for (std::size_t j = 0; j < peer_at_.size(); ++j) {
    for (std::size_t r = 0; r < peer_at_[j].size(); ++r) {
      const auto& e = p.pulls[peer_at_[j][r]];
      slots.push_back(e.slot);
      keys.push_back(e.key);
      const auto at = peer_rows_[j].begin() + static_cast<std::ptrdiff_t>(r * full);
      rows.insert(rows.end(), at, at + full);
    }
  }
  if (!slots.empty()) cache_.fill(slots, keys, rows.data(), true);
  peer_rows_.clear();
  peer_at_.clear();
  std::uint64_t planned = 0;
  for (const auto& e : p.pulls) planned += e.peer;
  if (slots.size() != planned) {
    throw Error("iteration " + std::to_string(t) + " takes " + std::to_string(planned) + " rows from workers of this host; " +
                std::to_string(slots.size()) + " were handed to it");
  }
}

void HostExchange::hand_pulled_rows(const StepPlan& p, const HandOffs& h) {
  if (!h.any) return;
  HostChannel& ch = channel("per-host aggregation");
  const std::uint32_t full = row_.dim + row_.state;
  const auto per = [&](std::uint32_t pos) { return h.with_state(pos, p.pulls[pos].with_state) ? full : row_.dim; };
  std::vector<std::vector<float>> send(h.send.size()), received(h.recv.size());
  std::uint64_t out = 0, in = 0;
  for (std::size_t j = 0; j < h.send.size(); ++j) {
    std::vector<std::uint32_t> slots;
    for (std::uint32_t pos : h.send[j]) slots.push_back(p.pulls[pos].slot);
    std::vector<float> rows;
    cache_.read_rows(slots, rows);
    for (std::size_t r = 0; r < slots.size(); ++r) {
      const float* row = rows.data() + r * full;
      send[j].insert(send[j].end(), row, row + per(h.send[j][r]));
    }
    std::size_t floats = 0;
    for (std::uint32_t pos : h.recv[j]) floats += per(pos);
    received[j].resize(floats);
    out += send[j].size();
    in += floats;
  }
  ch.exchange(send, received);
  // Into their slots, those with their state and those without apart.
  struct Filled {
    std::vector<Key> keys;
    std::vector<std::uint32_t> slots;
    std::vector<float> rows;
  } with_state, without_state;
  for (std::size_t j = 0; j < received.size(); ++j) {
    const float* at = received[j].data();
    for (std::uint32_t pos : h.recv[j]) {
      const auto& e = p.pulls[pos];
      Filled& into = h.with_state(pos, e.with_state) ? with_state : without_state;
      into.keys.push_back(e.key);
      into.slots.push_back(e.slot);
      into.rows.insert(into.rows.end(), at, at + per(pos));
      at += per(pos);
    }
  }
  cache_.fill(with_state.slots, with_state.keys, with_state.rows.data(), true);
  cache_.fill(without_state.slots, without_state.keys, without_state.rows.data(), false);
  wire_.handed.pull.rows += h.received();
  wire_.handed.pull.out += out * sizeof(float);
  wire_.handed.pull.in += in * sizeof(float);
}

void HostExchange::start_apply(const StepPlan& p, const HandOffs& h) {
  wire_.rows.peer_grad += p.hand_grads.size();
  if (apply_wait_) throw Error("peer sync: the host-applied rows of an earlier iteration were not finished");
  apply_own_.clear();
  for (const auto& r : p.rows)
    if (r.host == scheduler::HostApply::kApplies) apply_own_.push_back(r.slot);
  if (!h.any) return;
  HostChannel& ch = channel("peer sync");
  gradient_buffers(
      h, [&](std::uint32_t pos) { return p.hand_grads[pos].slot; }, apply_send_, apply_recv_);
  apply_into_.assign(h.recv.size(), {});
  for (std::size_t j = 0; j < h.recv.size(); ++j)
    for (std::uint32_t pos : h.recv[j]) apply_into_[j].push_back(p.rows[pos].slot);
  apply_wait_ = ch.start(apply_send_, apply_recv_);
}

void HostExchange::finish_apply(const ps::OptimizerConfig& optimizer) {
  if (apply_wait_) {
    const std::function<void()> wait = std::move(apply_wait_);
    apply_wait_ = nullptr;
    wait();
    // Added after this worker's own gradient, giver by giver in rank order.
    for (std::size_t j = 0; j < apply_recv_.size(); ++j) {
      if (apply_recv_[j].empty()) continue;
      const auto n = static_cast<std::int64_t>(apply_into_[j].size());
      const auto dim = static_cast<std::int64_t>(row_.dim);
      cache_.scatter_add_grad(apply_into_[j], torch::from_blob(apply_recv_[j].data(), {n, dim}, torch::kFloat32).to(cache_.device()));
    }
  }
  if (!apply_own_.empty()) cache_.apply(apply_own_, optimizer, optimizer.lr);
  apply_own_.clear();
}

}  // namespace ember::worker
