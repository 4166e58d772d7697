// Runs the CUDA gather/scatter kernels against the host cache; skips without a GPU. Dims
// of 4k floats take the float4 kernels, other dims (and buffers off a 16-byte boundary)
// the scalar ones: both are checked.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "ember/cache/bag_pool.h"
#include "ember/cache/bag_pool_cuda.h"
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

// The fused path's CUDA kernels give the CPU kernels' bits: bags of 0-9 ids, sum and
// mean, a row in many bags (no atomics: each row adds its bags in id order).
void bag_pool_matches_the_cpu(std::uint32_t dim, bool mean) {
  SCOPED_TRACE("dim " + std::to_string(dim) + (mean ? ", mean" : ", sum"));
  std::mt19937 rng(dim + mean);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::size_t distinct = 500, bags = 4000;
  std::vector<std::uint32_t> ids, offsets{0};
  for (std::size_t b = 0; b < bags; ++b) {
    for (std::size_t i = 0, n = rng() % 10; i < n; ++i) ids.push_back(rng() % 2 ? rng() % 20 : rng() % distinct);
    offsets.push_back(static_cast<std::uint32_t>(ids.size()));
  }
  std::vector<float> table(distinct * dim), grad_out(bags * dim), grads(distinct * dim, 0.5f);
  for (auto& x : table) x = u(rng);
  for (auto& x : grad_out) x = u(rng);
  const BagBatch batch{ids, offsets, mean};
  float *d_table, *d_out, *d_gout, *d_grads;
  ASSERT_EQ(cudaMalloc(&d_table, table.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, bags * dim * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_gout, grad_out.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_grads, grads.size() * 4), cudaSuccess);
  cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_gout, grad_out.data(), grad_out.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_grads, grads.data(), grads.size() * 4, cudaMemcpyHostToDevice);
  std::vector<const float*> rows(distinct), d_rows(distinct);
  std::vector<float*> grad_rows(distinct), d_grad_rows(distinct);
  for (std::size_t r = 0; r < distinct; ++r) {
    rows[r] = &table[r * dim];
    d_rows[r] = d_table + r * dim;
    grad_rows[r] = &grads[r * dim];
    d_grad_rows[r] = d_grads + r * dim;
  }
  CudaBagPool pool;
  RowBags scratch;
  pool.forward(batch, d_rows, dim, d_out, nullptr);
  pool.backward(batch, d_gout, d_grad_rows, dim, scratch, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> want(bags * dim), got(bags * dim), got_grads(grads.size());
  pool_forward(batch, rows, dim, want.data());
  pool_backward(batch, grad_out.data(), grad_rows, dim, scratch);
  cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_grads.data(), d_grads, got_grads.size() * 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_grads, grads);
  for (float* p : {d_table, d_out, d_gout, d_grads}) cudaFree(p);
}

TEST(CudaBagPool, MatchesTheCpuKernelsBitForBit) {
  std::string why = CudaEmbeddingCache::unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  for (std::uint32_t dim : {3u, 16u, 128u})
    for (bool mean : {false, true}) bag_pool_matches_the_cpu(dim, mean);
}

}  // namespace
}  // namespace ember::cache
