// Runs the CUDA gather/scatter kernels against the host cache; skips without a GPU. Dims
// of 4k floats take the float4 kernels, other dims (and buffers off a 16-byte boundary)
// the scalar ones: both are checked.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "ember/cache/cuda_embedding_cache.h"
#include "ember/cache/embedding_cache.h"

namespace ember::cache {
namespace {

void gather_and_scatter_match_the_host_cache(std::uint32_t dim, std::size_t offset) {
  SCOPED_TRACE("dim " + std::to_string(dim) + ", buffers offset by " + std::to_string(offset) + " floats");
  const std::uint32_t cap = 1000, n = 4096;
  CudaEmbeddingCache dev(cap, dim);
  EmbeddingCache host(cap, dim, 0);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<std::uint32_t> all(cap);
  std::vector<float> rows(static_cast<std::size_t>(cap) * dim);
  for (std::uint32_t s = 0; s < cap; ++s) {
    all[s] = s;
    for (std::uint32_t j = 0; j < dim; ++j) rows[static_cast<std::size_t>(s) * dim + j] = u(rng);
    host.fill(s, s, &rows[static_cast<std::size_t>(s) * dim], nullptr);
  }
  dev.write_rows(all.data(), cap, rows.data());
  std::vector<std::uint32_t> slots(n);
  for (auto& s : slots) s = rng() % 50;  // many duplicates: atomics must sum them
  std::vector<float> grads(static_cast<std::size_t>(n) * dim);
  for (auto& g : grads) g = u(rng);
  std::uint32_t* d_slots;
  float *d_out, *d_grads;
  ASSERT_EQ(cudaMalloc(&d_slots, n * sizeof(std::uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, (grads.size() + offset) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_grads, (grads.size() + offset) * sizeof(float)), cudaSuccess);
  cudaMemcpy(d_slots, slots.data(), n * sizeof(std::uint32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d_grads + offset, grads.data(), grads.size() * sizeof(float), cudaMemcpyHostToDevice);
  dev.gather(d_slots, n, d_out + offset);
  dev.scatter_add_grad(d_slots, n, d_grads + offset);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(grads.size()), want(grads.size());
  cudaMemcpy(got.data(), d_out + offset, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
  host.gather(slots.data(), n, want.data());
  EXPECT_EQ(got, want);
  host.scatter_add_grad(slots.data(), n, grads.data());
  std::vector<float> dgrad(static_cast<std::size_t>(cap) * dim);
  dev.read_rows(all.data(), cap, dgrad.data(), true);
  for (std::uint32_t s = 0; s < cap; ++s) {
    for (std::uint32_t j = 0; j < dim; ++j) ASSERT_NEAR(dgrad[static_cast<std::size_t>(s) * dim + j], host.grad(s)[j], 1e-3);
  }
  cudaFree(d_slots);
  cudaFree(d_out);
  cudaFree(d_grads);
}

TEST(CudaEmbeddingCache, GatherAndScatterMatchTheHostCache) {
  std::string why = CudaEmbeddingCache::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  for (std::uint32_t dim : {3u, 16u, 64u, 128u}) gather_and_scatter_match_the_host_cache(dim, 0);
  gather_and_scatter_match_the_host_cache(64, 1);  // not 16-byte aligned: the scalar kernels
}

}  // namespace
}  // namespace ember::cache
