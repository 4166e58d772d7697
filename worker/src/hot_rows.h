// fae:F's hot rows: the hottest rows, replicated on every worker (value and optimizer
// state, in key order). Their gradients are summed over the workers with the dense ones,
// and every replica applies the PS's optimizer code to the hot rows any worker trained,
// so the replicas stay identical; one copy goes back to the PS at every flush.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/worker/trainer.h"

namespace ember::worker {

class HotRows {
 public:
  HotRows(std::uint32_t dim, std::uint32_t state_floats) : dim_(dim), state_(state_floats) {}

  // Pulls the rows marked in `hot` (indexed by key) from the PS.
  void load(ps::PsClient& client, const std::vector<std::uint8_t>& hot, WireCounts& wire, std::uint32_t rank);
  bool empty() const { return keys_.empty(); }
  // The replica's index of `key`, or null when it is not hot.
  const std::uint32_t* find(Key key) const { return keys_.empty() ? nullptr : index_.find(key); }
  // The values of replica rows `h` as a [h.size(), dim] host tensor.
  torch::Tensor values(const std::vector<std::uint32_t>& h) const;
  // This worker's gradients `g` ([h.size(), dim], host) of replica rows `h`, for the
  // next all-reduce.
  void add_grads(const std::vector<std::uint32_t>& h, const torch::Tensor& g);
  // Appends the summed gradients and the rows' trained marks to the all-reduce's parts.
  void append_to(std::vector<torch::Tensor>& parts, torch::Device device) const;
  // After the all-reduce: `reduced` holds, from `offset`, what append_to added, summed
  // over the workers. Applies the optimizer to every row some worker trained; returns
  // how many.
  std::uint64_t apply(const torch::Tensor& reduced, std::int64_t offset, const ps::OptimizerConfig& optimizer);
  // Writes the replica back to the PS (one worker does, the replicas agree).
  void push(ps::PsClient& client, WireCounts& wire) const;

 private:
  std::uint32_t dim_, state_;
  std::vector<Key> keys_;
  U64Map<std::uint32_t> index_;
  std::vector<float> rows_;       // value then state, per row
  torch::Tensor grad_, touched_;  // host, [H, dim] and [H]
};

}  // namespace ember::worker
