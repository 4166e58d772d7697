// The fused embedding path (cache/bag_pool.h's kernels, on the CPU or a CUDA device): a
// batch's rows pooled bag by bag straight into the model's input, and the input's
// gradient added straight into the rows' accumulators. The worker's step, the
// evaluation, the one-process reference and ember-predict all pool through it, so they
// add the same numbers in the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/cache/bag_pool.h"

namespace ember::worker {

class EmbeddingPath {
 public:
  // `pooling`: sum or mean (multi-hot bags); ConfigError otherwise.
  EmbeddingPath(torch::Device device, const std::string& pooling);
  ~EmbeddingPath();
  EmbeddingPath(const EmbeddingPath&) = delete;
  EmbeddingPath& operator=(const EmbeddingPath&) = delete;

  // Bag b of `offsets` (empty: one id a bag) pooled from rows[ids[i]] (pointers into
  // device memory, dim floats each): a [bags, dim] tensor on the device.
  torch::Tensor forward(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets, std::span<const float* const> rows,
                        std::uint32_t dim);
  // grads[ids[i]] += bag i's gradient (times 1 / its size when averaged), in id order
  // per row: `grad_out` [bags, dim] on the device, `grads` as forward's rows.
  void backward(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets, const torch::Tensor& grad_out,
                std::span<float* const> grads, std::uint32_t dim);

 private:
  cache::BagBatch batch(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets) const;
  struct Cuda;
  torch::Device device_;
  bool mean_;
  cache::RowBags scratch_;
  std::unique_ptr<Cuda> cuda_;  // on a CUDA device
};

// rows [ids, dim] (host memory) pooled over `offsets` (bags + 1 entries) by the fused
// path's kernel, each id its own row: [bags, dim] on the CPU. Not differentiable.
torch::Tensor pool_bags(const torch::Tensor& rows, const std::vector<std::uint32_t>& offsets, const std::string& pooling);

}  // namespace ember::worker
