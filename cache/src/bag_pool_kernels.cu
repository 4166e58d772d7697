#include <cuda_runtime.h>

#include "bag_pool_kernels.h"

namespace ember::cache::kernels {
namespace {

__device__ inline std::uint32_t bag_begin(const std::uint32_t* offsets, std::size_t b) {
  return offsets ? offsets[b] : static_cast<std::uint32_t>(b);
}
__device__ inline std::uint32_t bag_end(const std::uint32_t* offsets, std::size_t b) {
  return offsets ? offsets[b + 1] : static_cast<std::uint32_t>(b + 1);
}

// __fmul_rn / __fadd_rn: rounded apart, never fused, as the CPU kernels round.
__global__ void forward_kernel(const std::uint32_t* __restrict__ ids, const std::uint32_t* __restrict__ offsets, std::size_t bags,
                               bool mean, const float* const* __restrict__ rows, std::uint32_t dim, float* __restrict__ out) {
  std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  for (; e < bags * dim; e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t b = e / dim, k = e - b * dim;
    const std::uint32_t begin = bag_begin(offsets, b), end = bag_end(offsets, b);
    const float w = mean && end > begin ? __fdiv_rn(1.0f, static_cast<float>(end - begin)) : 1.0f;
    float acc = 0.0f;
    for (std::uint32_t i = begin; i < end; ++i) {
      const float v = rows[ids[i]][k];
      acc = __fadd_rn(acc, mean ? __fmul_rn(v, w) : v);
    }
    out[e] = acc;
  }
}

__global__ void backward_kernel(const std::uint32_t* __restrict__ start, const std::uint32_t* __restrict__ bag, std::size_t distinct,
                                const std::uint32_t* __restrict__ offsets, bool mean, const float* __restrict__ grad_out,
                                float* const* __restrict__ grads, std::uint32_t dim) {
  std::size_t e = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  for (; e < distinct * dim; e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = e / dim, k = e - r * dim;
    float acc = grads[r][k];
    for (std::uint32_t j = start[r]; j < start[r + 1]; ++j) {
      const std::uint32_t b = bag[j];
      const float g = grad_out[static_cast<std::size_t>(b) * dim + k];
      if (mean) {
        const float w = __fdiv_rn(1.0f, static_cast<float>(bag_end(offsets, b) - bag_begin(offsets, b)));
        acc = __fadd_rn(acc, __fmul_rn(g, w));
      } else {
        acc = __fadd_rn(acc, g);
      }
    }
    grads[r][k] = acc;
  }
}

unsigned blocks_for(std::size_t elems) {
  std::size_t b = (elems + 255) / 256;
  return static_cast<unsigned>(b > 65535 ? 65535 : (b == 0 ? 1 : b));
}

}  // namespace

int pool_forward(const std::uint32_t* ids, const std::uint32_t* offsets, std::size_t bags, bool mean, const float* const* rows,
                 std::uint32_t dim, float* out, void* stream) {
  forward_kernel<<<blocks_for(bags * dim), 256, 0, static_cast<cudaStream_t>(stream)>>>(ids, offsets, bags, mean, rows, dim, out);
  return static_cast<int>(cudaGetLastError());
}

int pool_backward(const std::uint32_t* start, const std::uint32_t* bag, std::size_t distinct, const std::uint32_t* offsets, bool mean,
                  const float* grad_out, float* const* grads, std::uint32_t dim, void* stream) {
  backward_kernel<<<blocks_for(distinct * dim), 256, 0, static_cast<cudaStream_t>(stream)>>>(start, bag, distinct, offsets, mean, grad_out,
                                                                                             grads, dim);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ember::cache::kernels
