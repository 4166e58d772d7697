// The fused embedding path's kernels on a CUDA device (bag_pool.h's, same arithmetic
// and order, so a CUDA worker pools and adds as a CPU one does, bit for bit): one thread
// per (bag, column) sums a bag's rows in id order; one thread per (row, column) adds the
// row's bags' gradients in id order, from the row lists built on the host. No atomics,
// so the sums do not depend on the schedule. Built when nvcc works; using one on a
// machine without a GPU throws Error with the CUDA message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ember/cache/bag_pool.h"

namespace ember::cache {

class CudaBagPool {
 public:
  CudaBagPool() = default;
  ~CudaBagPool();
  CudaBagPool(const CudaBagPool&) = delete;
  CudaBagPool& operator=(const CudaBagPool&) = delete;

  // As pool_forward: `rows` are device pointers (a host array of them), `out` device
  // memory of bags x dim floats. Queued on `stream` (a cudaStream_t; null: the default).
  void forward(const BagBatch& batch, std::span<const float* const> rows, std::uint32_t dim, float* out, void* stream);
  // As pool_backward: `grad_out` and `grads` on the device. The row lists are built on
  // the host in `scratch`.
  void backward(const BagBatch& batch, const float* grad_out, std::span<float* const> grads, std::uint32_t dim, RowBags& scratch,
                void* stream);

 private:
  // Device buffers, grown as batches need and reused.
  struct Buffer {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  void* upload(Buffer& b, const void* host, std::size_t bytes, void* stream);
  Buffer ids_, offsets_, pointers_, start_, bag_;
};

}  // namespace ember::cache
