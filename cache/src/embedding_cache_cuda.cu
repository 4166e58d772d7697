#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ember/cache/cuda_embedding_cache.h"
#include "ember/common/error.h"

namespace ember::cache {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

// One thread per output element: consecutive threads read consecutive floats of a row.
// The general case (any dim); the float4 kernels below serve rows of 4k floats.
__global__ void gather_kernel(const float* __restrict__ values, const std::uint32_t* __restrict__ slots, std::size_t n, std::uint32_t dim,
                              float* __restrict__ out) {
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  std::size_t total = n * dim;
  for (; i < total; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::size_t row = i / dim, col = i - row * dim;
    out[i] = values[static_cast<std::size_t>(slots[row]) * dim + col];
  }
}

// A batch may use a row several times: per-row sums need atomics.
__global__ void scatter_add_kernel(float* __restrict__ grads, const std::uint32_t* __restrict__ slots, std::size_t n, std::uint32_t dim,
                                   const float* __restrict__ src) {
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  std::size_t total = n * dim;
  for (; i < total; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::size_t row = i / dim, col = i - row * dim;
    atomicAdd(&grads[static_cast<std::size_t>(slots[row]) * dim + col], src[i]);
  }
}

// Rows of 4k floats, one float4 a thread: a quarter of the index arithmetic and
// 16-byte accesses (the memory system's unit is a 32-byte sector).
__global__ void gather_vec4_kernel(const float4* __restrict__ values, const std::uint32_t* __restrict__ slots, std::size_t n,
                                   std::uint32_t quads, float4* __restrict__ out) {
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  std::size_t total = n * quads;
  for (; i < total; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::size_t row = i / quads, col = i - row * quads;
    out[i] = values[static_cast<std::size_t>(slots[row]) * quads + col];
  }
}

__global__ void scatter_add_vec4_kernel(float4* __restrict__ grads, const std::uint32_t* __restrict__ slots, std::size_t n,
                                        std::uint32_t quads, const float4* __restrict__ src) {
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  std::size_t total = n * quads;
  for (; i < total; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::size_t row = i / quads, col = i - row * quads;
    float4 g = src[i];
    float4* to = &grads[static_cast<std::size_t>(slots[row]) * quads + col];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(to, g);  // one 16-byte atomic (Hopper and later)
#else
    float* f = reinterpret_cast<float*>(to);
    atomicAdd(f, g.x);
    atomicAdd(f + 1, g.y);
    atomicAdd(f + 2, g.z);
    atomicAdd(f + 3, g.w);
#endif
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

unsigned blocks_for(std::size_t elems) {
  std::size_t b = (elems + 255) / 256;
  return static_cast<unsigned>(b > 65535 ? 65535 : (b == 0 ? 1 : b));
}

}  // namespace

std::string CudaEmbeddingCache::unavailable_reason() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device found";
  return "";
}

CudaEmbeddingCache::CudaEmbeddingCache(std::uint32_t capacity, std::uint32_t dim) : capacity_(capacity), dim_(dim) {
  std::string why = unavailable_reason();
  if (!why.empty()) throw Error(why);
  std::size_t bytes = static_cast<std::size_t>(capacity) * dim * sizeof(float);
  check(cudaMalloc(&values_, bytes), "cudaMalloc values");
  cudaError_t e = cudaMalloc(&grads_, bytes);
  if (e != cudaSuccess) {
    cudaFree(values_);
    check(e, "cudaMalloc grads");
  }
  check(cudaMemset(values_, 0, bytes), "cudaMemset");
  check(cudaMemset(grads_, 0, bytes), "cudaMemset");
}

CudaEmbeddingCache::~CudaEmbeddingCache() {
  cudaFree(values_);
  cudaFree(grads_);
}

void CudaEmbeddingCache::write_rows(const std::uint32_t* slots, std::size_t n, const float* rows) {
  for (std::size_t i = 0; i < n; ++i) {
    check(cudaMemcpy(values_ + static_cast<std::size_t>(slots[i]) * dim_, rows + i * dim_, dim_ * sizeof(float), cudaMemcpyHostToDevice),
          "write_rows");
  }
}

void CudaEmbeddingCache::read_rows(const std::uint32_t* slots, std::size_t n, float* rows, bool grads) const {
  const float* base = grads ? grads_ : values_;
  for (std::size_t i = 0; i < n; ++i) {
    check(cudaMemcpy(rows + i * dim_, base + static_cast<std::size_t>(slots[i]) * dim_, dim_ * sizeof(float), cudaMemcpyDeviceToHost),
          "read_rows");
  }
}

void CudaEmbeddingCache::zero_grads() {
  check(cudaMemset(grads_, 0, static_cast<std::size_t>(capacity_) * dim_ * sizeof(float)), "zero_grads");
}

void CudaEmbeddingCache::gather(const std::uint32_t* d_slots, std::size_t n, float* d_out, void* stream) const {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (dim_ % 4 == 0 && aligned16(d_out)) {
    gather_vec4_kernel<<<blocks_for(n * (dim_ / 4)), 256, 0, s>>>(reinterpret_cast<const float4*>(values_), d_slots, n, dim_ / 4,
                                                                  reinterpret_cast<float4*>(d_out));
  } else {
    gather_kernel<<<blocks_for(n * dim_), 256, 0, s>>>(values_, d_slots, n, dim_, d_out);
  }
  check(cudaGetLastError(), "gather kernel");
}

void CudaEmbeddingCache::scatter_add_grad(const std::uint32_t* d_slots, std::size_t n, const float* d_grads, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (dim_ % 4 == 0 && aligned16(d_grads)) {
    scatter_add_vec4_kernel<<<blocks_for(n * (dim_ / 4)), 256, 0, s>>>(reinterpret_cast<float4*>(grads_), d_slots, n, dim_ / 4,
                                                                       reinterpret_cast<const float4*>(d_grads));
  } else {
    scatter_add_kernel<<<blocks_for(n * dim_), 256, 0, s>>>(grads_, d_slots, n, dim_, d_grads);
  }
  check(cudaGetLastError(), "scatter kernel");
}

}  // namespace ember::cache
