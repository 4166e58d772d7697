#include "stages/replicas.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"

namespace ember::worker {
namespace {
// Rows per request when loading or writing back a replica (1 MiB of floats): a large
// replicated table would otherwise make one reply larger than an RDMA slot (4 MiB).
std::size_t rows_per_request(std::size_t floats_per_row) { return std::max<std::size_t>(1, (std::size_t{1} << 18) / floats_per_row); }
}  // namespace

void Replicas::load(ps::PsClient& client, const std::vector<std::uint8_t>& replicated, WireCounts& wire, std::uint32_t rank) {
  for (Key k = 0; k < replicated.size(); ++k) {
    if (replicated[k]) {
      index_.try_emplace(k, static_cast<std::uint32_t>(keys_.size()));
      keys_.push_back(k);
    }
  }
  const std::size_t per = dim_ + state_;
  rows_.resize(keys_.size() * per);
  std::vector<float> part;
  const std::size_t chunk = rows_per_request(per);
  for (std::size_t i = 0; i < keys_.size(); i += chunk) {
    const std::size_t n = std::min(chunk, keys_.size() - i);
    client.read(std::vector<Key>(keys_.begin() + static_cast<std::ptrdiff_t>(i), keys_.begin() + static_cast<std::ptrdiff_t>(i + n)), part,
                true, 0);
    std::copy(part.begin(), part.end(), rows_.begin() + static_cast<std::ptrdiff_t>(i * per));
  }
  wire.hot_load += keys_.size();
  grad_ = torch::zeros({static_cast<std::int64_t>(keys_.size()), static_cast<std::int64_t>(dim_)});
  spdlog::info("worker {}: {} rows replicated ({:.1f} MB)", rank, keys_.size(), rows_.size() * 4 / 1e6);
}

torch::Tensor Replicas::values(const std::vector<std::uint32_t>& h) const {
  auto out = torch::empty({static_cast<std::int64_t>(h.size()), static_cast<std::int64_t>(dim_)});
  for (std::size_t j = 0; j < h.size(); ++j) {
    std::memcpy(out.data_ptr<float>() + j * dim_, &rows_[static_cast<std::size_t>(h[j]) * (dim_ + state_)], dim_ * sizeof(float));
  }
  return out;
}

void Replicas::add_grads(const std::vector<std::uint32_t>& h, const torch::Tensor& g) {
  grad_.index_add_(0, torch::tensor(std::vector<std::int64_t>(h.begin(), h.end())), g);
}

void Replicas::append_to(std::vector<torch::Tensor>& parts, torch::Device device, const std::vector<Key>& keys) {
  std::vector<std::int64_t> h(keys.size());
  for (std::size_t j = 0; j < keys.size(); ++j) {
    const std::uint32_t* i = find(keys[j]);
    if (i == nullptr) throw Error("the plan lists row " + std::to_string(keys[j]) + " as replicated; this worker holds no replica of it");
    h[j] = *i;
  }
  reducing_ = torch::tensor(h, torch::kInt64);
  parts.push_back(grad_.index_select(0, reducing_).reshape(-1).to(device));
}

std::uint64_t Replicas::apply(const torch::Tensor& reduced, std::int64_t offset, const ps::OptimizerConfig& optimizer) {
  const std::int64_t n = reducing_.numel();
  auto sums = reduced.narrow(0, offset, n * dim_).to(torch::kCPU).contiguous();
  const float* g = sums.data_ptr<float>();
  const std::int64_t* h = reducing_.data_ptr<std::int64_t>();
  const std::uint32_t per = dim_ + state_;
  for (std::int64_t j = 0; j < n; ++j) {
    float* row = &rows_[static_cast<std::size_t>(h[j]) * per];
    ps::apply(optimizer, optimizer.lr, dim_, row, row + dim_, g + j * dim_);
  }
  grad_.index_fill_(0, reducing_, 0.0f);
  reducing_ = torch::Tensor();
  return static_cast<std::uint64_t>(n);
}

void Replicas::push(ps::PsClient& client, const std::vector<Key>& keys, WireCounts& wire) const {
  const std::size_t per = dim_ + state_;
  std::vector<float> part;
  const std::size_t chunk = rows_per_request(per);
  for (std::size_t i = 0; i < keys.size(); i += chunk) {
    const std::size_t n = std::min(chunk, keys.size() - i);
    std::vector<Key> chunk(keys.begin() + static_cast<std::ptrdiff_t>(i), keys.begin() + static_cast<std::ptrdiff_t>(i + n));
    part.resize(n * per);
    for (std::size_t j = 0; j < n; ++j) {
      const std::uint32_t* h = find(chunk[j]);
      if (h == nullptr) throw Error("a flush lists row " + std::to_string(chunk[j]) + " as replicated; this worker holds no replica of it");
      std::memcpy(&part[j * per], &rows_[*h * per], per * sizeof(float));
    }
    client.push_value(chunk, part);
  }
  wire.rows.hot_flush += keys.size();
}

}  // namespace ember::worker
