#include "hot_rows.h"

#include <spdlog/spdlog.h>

#include <cstring>

namespace ember::worker {

void HotRows::load(ps::PsClient& client, const std::vector<std::uint8_t>& hot, WireCounts& wire, std::uint32_t rank) {
  for (Key k = 0; k < hot.size(); ++k) {
    if (hot[k]) {
      index_.try_emplace(k, static_cast<std::uint32_t>(keys_.size()));
      keys_.push_back(k);
    }
  }
  client.pull(keys_, rows_, true, 0);
  wire.hot_load += keys_.size();
  grad_ = torch::zeros({static_cast<std::int64_t>(keys_.size()), static_cast<std::int64_t>(dim_)});
  touched_ = torch::zeros({static_cast<std::int64_t>(keys_.size())});
  spdlog::info("worker {}: fae: {} hot rows replicated ({:.1f} MB)", rank, keys_.size(), rows_.size() * 4 / 1e6);
}

torch::Tensor HotRows::values(const std::vector<std::uint32_t>& h) const {
  auto out = torch::empty({static_cast<std::int64_t>(h.size()), static_cast<std::int64_t>(dim_)});
  for (std::size_t j = 0; j < h.size(); ++j) {
    std::memcpy(out.data_ptr<float>() + j * dim_, &rows_[static_cast<std::size_t>(h[j]) * (dim_ + state_)], dim_ * sizeof(float));
  }
  return out;
}

void HotRows::add_grads(const std::vector<std::uint32_t>& h, const torch::Tensor& g) {
  auto index = torch::tensor(std::vector<std::int64_t>(h.begin(), h.end()));
  grad_.index_add_(0, index, g);
  touched_.index_fill_(0, index, 1.0f);
}

void HotRows::append_to(std::vector<torch::Tensor>& parts, torch::Device device) const {
  parts.push_back(grad_.reshape(-1).to(device));
  parts.push_back(touched_.to(device));
}

std::uint64_t HotRows::apply(const torch::Tensor& reduced, std::int64_t offset, const ps::OptimizerConfig& optimizer) {
  const auto H = static_cast<std::int64_t>(keys_.size());
  auto sums = reduced.narrow(0, offset, H * dim_).to(torch::kCPU).contiguous();
  auto touched = reduced.narrow(0, offset + H * dim_, H).to(torch::kCPU).contiguous();
  const float* g = sums.data_ptr<float>();
  const float* tc = touched.data_ptr<float>();
  const std::uint32_t per = dim_ + state_;
  std::uint64_t trained = 0;
  for (std::int64_t h = 0; h < H; ++h) {
    if (tc[h] == 0) continue;
    float* row = &rows_[static_cast<std::size_t>(h) * per];
    ps::apply(optimizer, optimizer.lr, dim_, row, row + dim_, g + h * dim_);
    ++trained;
  }
  grad_.zero_();
  touched_.zero_();
  return trained;
}

void HotRows::push(ps::PsClient& client, WireCounts& wire) const {
  if (keys_.empty()) return;
  client.push_value(keys_, rows_);
  wire.flush_value += keys_.size();
  wire.bytes_out += keys_.size() * 8 + rows_.size() * 4;
}

}  // namespace ember::worker
