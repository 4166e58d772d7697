#include "ember/worker/embedding_path.h"

#include <ATen/Parallel.h>

#include <numeric>

#include "ember/common/error.h"
#include "ember/worker/model_config.h"
#ifdef EMBER_HAVE_CUDA
#include "ember/cache/bag_pool_cuda.h"
#endif

namespace ember::worker {
namespace {

// LibTorch's intra-op pool (at::set_num_threads): one pool in the process; none when
// it has one thread, and the kernels then run their one-thread loops.
cache::ParallelFor torch_parallel() {
  if (at::get_num_threads() <= 1) return {};
  return [](std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f) {
    at::parallel_for(0, static_cast<std::int64_t>(n), static_cast<std::int64_t>(grain),
                     [&](std::int64_t b, std::int64_t e) { f(static_cast<std::size_t>(b), static_cast<std::size_t>(e)); });
  };
}

}  // namespace

struct EmbeddingPath::Cuda {
#ifdef EMBER_HAVE_CUDA
  cache::CudaBagPool pool;
#endif
};

EmbeddingPath::EmbeddingPath(torch::Device device, const std::string& pooling) : device_(device), mean_(pooling == "mean") {
  check_pooling(pooling);
  if (device.is_cuda()) {
#ifdef EMBER_HAVE_CUDA
    cuda_ = std::make_unique<Cuda>();
#else
    throw ConfigError("this build has no CUDA kernels (nvcc was not found when it was configured): rebuild with nvcc for --device " +
                      device.str());
#endif
  }
}

EmbeddingPath::~EmbeddingPath() = default;

cache::BagBatch EmbeddingPath::batch(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets) const {
  cache::BagBatch b;
  b.rows = ids;
  b.offsets = offsets;
  b.mean = mean_ && !offsets.empty();
  return b;
}

torch::Tensor EmbeddingPath::forward(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets,
                                     std::span<const float* const> rows, std::uint32_t dim) {
  const cache::BagBatch b = batch(ids, offsets);
  auto out = torch::empty({static_cast<std::int64_t>(b.bags()), static_cast<std::int64_t>(dim)},
                          torch::TensorOptions().dtype(torch::kFloat32).device(device_));
#ifdef EMBER_HAVE_CUDA
  if (cuda_) {
    cuda_->pool.forward(b, rows, dim, out.data_ptr<float>(), nullptr);  // LibTorch's default stream
    return out;
  }
#endif
  cache::pool_forward(b, rows, dim, out.data_ptr<float>(), torch_parallel());
  return out;
}

void EmbeddingPath::backward(std::span<const std::uint32_t> ids, std::span<const std::uint32_t> offsets, const torch::Tensor& grad_out,
                             std::span<float* const> grads, std::uint32_t dim) {
  const cache::BagBatch b = batch(ids, offsets);
  const torch::Tensor g = grad_out.contiguous();
  if (static_cast<std::size_t>(g.numel()) != b.bags() * dim) throw Error("the embedding path's gradient does not match its bags");
#ifdef EMBER_HAVE_CUDA
  if (cuda_) {
    cuda_->pool.backward(b, g.data_ptr<float>(), grads, dim, scratch_, nullptr);
    return;
  }
#endif
  cache::pool_backward(b, g.data_ptr<float>(), grads, dim, scratch_, torch_parallel());
}

torch::Tensor pool_bags(const torch::Tensor& rows, const std::vector<std::uint32_t>& offsets, const std::string& pooling) {
  const torch::Tensor r = rows.contiguous().to(torch::kCPU);
  const auto n = static_cast<std::size_t>(r.size(0));
  const auto dim = static_cast<std::uint32_t>(r.size(1));
  std::vector<std::uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  std::vector<const float*> pointers(n);
  for (std::size_t i = 0; i < n; ++i) pointers[i] = r.data_ptr<float>() + i * dim;
  EmbeddingPath path(torch::kCPU, pooling);
  return path.forward(ids, offsets, pointers, dim);
}

}  // namespace ember::worker
