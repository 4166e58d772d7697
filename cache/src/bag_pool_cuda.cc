#include "ember/cache/bag_pool_cuda.h"

#include <cuda_runtime.h>

#include <string>

#include "bag_pool_kernels.h"
#include "ember/common/error.h"

namespace ember::cache {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

CudaBagPool::~CudaBagPool() {
  for (Buffer* b : {&ids_, &offsets_, &pointers_, &start_, &bag_}) cudaFree(b->ptr);
}

void* CudaBagPool::upload(Buffer& b, const void* host, std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  if (bytes > b.bytes) {
    cudaFree(b.ptr);
    b.ptr = nullptr;
    b.bytes = 0;
    check(cudaMalloc(&b.ptr, bytes + bytes / 2), "cudaMalloc (bag pool)");
    b.bytes = bytes + bytes / 2;
  }
  check(cudaMemcpyAsync(b.ptr, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)), "upload (bag pool)");
  return b.ptr;
}

void CudaBagPool::forward(const BagBatch& batch, std::span<const float* const> rows, std::uint32_t dim, float* out, void* stream) {
  const std::size_t bags = batch.bags();
  if (bags == 0) return;
  auto* ids = static_cast<const std::uint32_t*>(upload(ids_, batch.rows.data(), batch.rows.size_bytes(), stream));
  auto* offsets = static_cast<const std::uint32_t*>(upload(offsets_, batch.offsets.data(), batch.offsets.size_bytes(), stream));
  auto* pointers = static_cast<const float* const*>(upload(pointers_, rows.data(), rows.size_bytes(), stream));
  check(static_cast<cudaError_t>(kernels::pool_forward(ids, offsets, bags, batch.mean, pointers, dim, out, stream)),
        "bag pool forward kernel");
}

void CudaBagPool::backward(const BagBatch& batch, const float* grad_out, std::span<float* const> grads, std::uint32_t dim, RowBags& scratch,
                           void* stream) {
  if (batch.ids() == 0) return;
  scratch.build(batch, grads.size());
  auto* start = static_cast<const std::uint32_t*>(upload(start_, scratch.start.data(), scratch.start.size() * 4, stream));
  auto* bag = static_cast<const std::uint32_t*>(upload(bag_, scratch.bag.data(), scratch.bag.size() * 4, stream));
  auto* offsets = static_cast<const std::uint32_t*>(upload(offsets_, batch.offsets.data(), batch.offsets.size_bytes(), stream));
  auto* pointers = static_cast<float* const*>(upload(pointers_, grads.data(), grads.size_bytes(), stream));
  check(static_cast<cudaError_t>(kernels::pool_backward(start, bag, grads.size(), offsets, batch.mean, grad_out, pointers, dim, stream)),
        "bag pool backward kernel");
}

}  // namespace ember::cache
