// Replicated rows: fae:F's hottest rows and a placement's replicated tables, held whole
// on every worker (value and optimizer state, in key order). Each iteration the rows the
// global batch trains (StepPlan::replicated: every worker knows them from the same plan)
// have their gradients summed over the workers with the dense ones, only those rows, and
// every replica applies the PS's optimizer code to them, so the replicas stay identical.
// A flush writes the rows trained since the last one back to the PS (worker 0's plan
// lists them: StepPlan::replicated_flush).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/worker/summary.h"

namespace ember::worker {

class Replicas {
 public:
  Replicas(std::uint32_t dim, std::uint32_t state_floats) : dim_(dim), state_(state_floats) {}

  // Pulls the rows marked in `replicated` (indexed by key) from the PS.
  void load(ps::PsClient& client, const std::vector<std::uint8_t>& replicated, WireCounts& wire, std::uint32_t rank);
  bool empty() const { return keys_.empty(); }
  // The replica's index of `key`, or null when it is not replicated.
  const std::uint32_t* find(Key key) const { return keys_.empty() ? nullptr : index_.find(key); }
  // The values of replica rows `h` as a [h.size(), dim] host tensor.
  torch::Tensor values(const std::vector<std::uint32_t>& h) const;
  // This worker's gradients `g` ([h.size(), dim], host) of replica rows `h`, for the
  // next all-reduce.
  void add_grads(const std::vector<std::uint32_t>& h, const torch::Tensor& g);
  // Appends this worker's gradients of the global batch's replicated rows `keys` (zero
  // where it trained none) to the all-reduce's parts: keys.size() x dim floats.
  void append_to(std::vector<torch::Tensor>& parts, torch::Device device, const std::vector<Key>& keys);
  // After the all-reduce: `reduced` holds, from `offset`, what append_to added, summed
  // over the workers. Applies the optimizer to those rows; returns how many.
  std::uint64_t apply(const torch::Tensor& reduced, std::int64_t offset, const ps::OptimizerConfig& optimizer);
  // Writes the replica rows `keys` (a flush's replicated_flush) back to the PS.
  void push(ps::PsClient& client, const std::vector<Key>& keys, WireCounts& wire) const;

 private:
  std::uint32_t dim_, state_;
  std::vector<Key> keys_;
  U64Map<std::uint32_t> index_;
  std::vector<float> rows_;  // value then state, per row
  torch::Tensor grad_;       // host, [H, dim]
  torch::Tensor reducing_;   // the replica rows of the all-reduce in flight (int64)
};

}  // namespace ember::worker
