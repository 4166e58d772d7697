// RowCache: the worker's cached embedding rows (value, optimizer state, gradient sum per
// slot) as the trainer uses them, in batches. Two backends:
//   - host: cache::EmbeddingCache in CPU memory, rows updated with the PS's own optimizer
//     code (ps::apply), so one worker and the PS compute bit for bit the same;
//   - tensor: three LibTorch tensors on a device. On CUDA the cache lives in GPU memory:
//     the batch's rows are gathered into the model's input without leaving the GPU, and
//     only rows that cross the network are copied to or from the host. The same code runs
//     on CPU, which is how it is tested on machines without a GPU.
// Slots, keys and row states are decided by the scheduler's plan (StepPlan); this class
// makes no caching decisions.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/cache/embedding_cache.h"
#include "ember/common/types.h"
#include "ember/ps/sparse_optimizer.h"

namespace ember::worker {

class RowCache {
 public:
  virtual ~RowCache() = default;

  virtual Key key(std::uint32_t slot) const = 0;

  // Pulled rows into their slots, gradients zeroed: value then state (dim + state floats
  // each), or `with_state` false: the value only (dim floats each), the state zeroed (a
  // row whose gradient goes to the PS never uses its state here).
  virtual void fill(std::span<const std::uint32_t> slots, std::span<const Key> keys, const float* rows, bool with_state) = 0;
  // Appends each slot's value then state (rows leaving for the PS).
  virtual void read_rows(std::span<const std::uint32_t> slots, std::vector<float>& out) = 0;
  // Appends each slot's gradient sum.
  virtual void read_grads(std::span<const std::uint32_t> slots, std::vector<float>& out) = 0;
  // grad(slots[i]) += grads[i] ([n, dim] on device()).
  virtual void scatter_add_grad(const std::vector<std::uint32_t>& slots, const torch::Tensor& grads) = 0;
  // Where each slot's value and gradient sum live on device() (dim floats each), for the
  // fused embedding path (embedding_path.h): appended to `values` and `grads`.
  virtual void row_pointers(std::span<const std::uint32_t> slots, std::vector<const float*>& values, std::vector<float*>& grads) = 0;
  // One optimizer step with each slot's gradient sum, then zero gradients.
  virtual void apply(std::span<const std::uint32_t> slots, const ps::OptimizerConfig& opt, float lr) = 0;
  virtual void zero_grad(std::span<const std::uint32_t> slots) = 0;

  virtual torch::Device device() const = 0;
  virtual std::size_t memory_bytes() const = 0;
  virtual const char* backend() const = 0;
};

// The backend `backend` names on `device` ("auto": host on CPU, tensor elsewhere);
// ConfigError for an unknown name or host memory with a GPU.
std::string resolve_cache_backend(const std::string& backend, torch::Device device);

// `backend`: "host" or "tensor" ("auto": host on CPU, tensor elsewhere).
std::unique_ptr<RowCache> make_row_cache(const std::string& backend, torch::Device device, std::uint32_t capacity, std::uint32_t dim,
                                         std::uint32_t state_dim);

}  // namespace ember::worker
