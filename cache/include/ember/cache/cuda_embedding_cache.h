// CudaEmbeddingCache: EmbeddingCache's layout in CUDA device memory, with the two kernels
// the worker's step needs: gather the batch's rows into a dense tensor, and scatter-add
// row gradients back (duplicates summed with atomics). Built when nvcc is available;
// constructing one on a machine without a GPU throws Error with the CUDA message.
#pragma once

#include <cstdint>
#include <string>

namespace ember::cache {

class CudaEmbeddingCache {
 public:
  CudaEmbeddingCache(std::uint32_t capacity, std::uint32_t dim);
  ~CudaEmbeddingCache();
  CudaEmbeddingCache(const CudaEmbeddingCache&) = delete;
  CudaEmbeddingCache& operator=(const CudaEmbeddingCache&) = delete;

  // "" when a CUDA device can be used, else why not.
  static std::string unavailable_reason();

  std::uint32_t capacity() const { return capacity_; }
  std::uint32_t dim() const { return dim_; }
  float* device_values() { return values_; }
  float* device_grads() { return grads_; }

  // Host-side helpers (synchronous): write rows into slots, read them back.
  void write_rows(const std::uint32_t* slots, std::size_t n, const float* rows);
  void read_rows(const std::uint32_t* slots, std::size_t n, float* rows, bool grads = false) const;
  void zero_grads();

  // Device-side: d_out[i] = value(d_slots[i]); grad(d_slots[i]) += d_grads[i].
  // `stream` is a cudaStream_t (nullptr = default stream).
  void gather(const std::uint32_t* d_slots, std::size_t n, float* d_out, void* stream = nullptr) const;
  void scatter_add_grad(const std::uint32_t* d_slots, std::size_t n, const float* d_grads, void* stream = nullptr);

 private:
  std::uint32_t capacity_, dim_;
  float* values_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace ember::cache
