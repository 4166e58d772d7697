// The fused embedding path's CUDA kernels, launched on raw device pointers (nvcc builds
// C++17 here; the class around them, bag_pool_cuda.cc, is host C++20).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::cache::kernels {

// bag_pool_cuda.h's forward: `offsets` null for one id a bag. Returns cudaGetLastError().
int pool_forward(const std::uint32_t* ids, const std::uint32_t* offsets, std::size_t bags, bool mean, const float* const* rows,
                 std::uint32_t dim, float* out, void* stream);
// Its backward, over the row lists (start, bag) of `distinct` rows.
int pool_backward(const std::uint32_t* start, const std::uint32_t* bag, std::size_t distinct, const std::uint32_t* offsets, bool mean,
                  const float* grad_out, float* const* grads, std::uint32_t dim, void* stream);

}  // namespace ember::cache::kernels
