#include "host/host_channels.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>

#include "ember/common/error.h"
#include "job/control_store.h"
#include "job/gloo_group.h"

namespace ember::worker {

namespace {

// Point-to-point sends and receives within the host's group, every pair in flight at once.
class GlooHostChannel : public HostChannel {
 public:
  explicit GlooHostChannel(GlooGroup group) : group_(std::move(group)) {}
  std::function<void()> start(const std::vector<std::vector<float>>& send, std::vector<std::vector<float>>& recv) override {
    auto tensors = std::make_shared<std::vector<std::vector<torch::Tensor>>>();  // alive until every op is waited for
    std::vector<c10::intrusive_ptr<c10d::Work>> ops;
    tensors->reserve(2 * send.size());
    const auto as_tensor = [](const float* data, std::size_t n) {
      return torch::from_blob(const_cast<float*>(data), {static_cast<std::int64_t>(n)}, torch::kFloat32);
    };
    for (std::size_t j = 0; j < send.size(); ++j) {
      if (!recv[j].empty()) {
        tensors->push_back({as_tensor(recv[j].data(), recv[j].size())});
        ops.push_back(group_->recv(tensors->back(), static_cast<int>(j), kTag));
      }
      if (!send[j].empty()) {
        tensors->push_back({as_tensor(send[j].data(), send[j].size())});
        ops.push_back(group_->send(tensors->back(), static_cast<int>(j), kTag));
      }
    }
    return [ops = std::move(ops), tensors] {
      for (const auto& op : ops) op->wait();
    };
  }

 private:
  static constexpr int kTag = 7;
  GlooGroup group_;
};

// All-gathers of int64 words over a Gloo group: the sizes first, then the words padded
// to the longest.
class GlooEvictionChannel : public EvictionChannel {
 public:
  GlooEvictionChannel(GlooGroup group, std::uint32_t size) : group_(std::move(group)), size_(size) {}
  std::vector<std::vector<std::int64_t>> all_gather(const std::vector<std::int64_t>& mine) override {
    std::vector<torch::Tensor> in{torch::tensor({static_cast<std::int64_t>(mine.size())}, torch::kInt64)};
    std::vector<std::vector<torch::Tensor>> sizes(1);
    for (std::uint32_t r = 0; r < size_; ++r) sizes[0].push_back(torch::zeros({1}, torch::kInt64));
    group_->allgather(sizes, in)->wait();
    std::int64_t longest = 1;
    for (const auto& t : sizes[0]) longest = std::max(longest, t.item<std::int64_t>());
    torch::Tensor padded = torch::zeros({longest}, torch::kInt64);
    std::copy(mine.begin(), mine.end(), padded.data_ptr<std::int64_t>());
    std::vector<torch::Tensor> words_in{padded};
    std::vector<std::vector<torch::Tensor>> words(1);
    for (std::uint32_t r = 0; r < size_; ++r) words[0].push_back(torch::empty({longest}, torch::kInt64));
    group_->allgather(words, words_in)->wait();
    std::vector<std::vector<std::int64_t>> all(size_);
    for (std::uint32_t r = 0; r < size_; ++r) {
      const std::int64_t n = sizes[0][r].item<std::int64_t>();
      if (n < 0 || n > longest) throw ProtocolError("worker " + std::to_string(r) + " sent a bad eviction count");
      const std::int64_t* p = words[0][r].data_ptr<std::int64_t>();
      all[r].assign(p, p + n);
    }
    return all;
  }

 private:
  GlooGroup group_;
  std::uint32_t size_;
};

}  // namespace

std::unique_ptr<EvictionChannel> make_eviction_channel(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control,
                                                       std::uint32_t rank) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "sched/", c.join_timeout);
  const auto timeout = group_timeout(c);
  return std::make_unique<GlooEvictionChannel>(gloo_group(store, rank, workers, c, timeout), workers);
}

std::unique_ptr<HostChannel> make_host_channel(const ConnectOptions& c, transport::ControlMember& control, std::uint32_t rank,
                                               const HostMap& hosts) {
  const std::uint32_t h = hosts.host_of[rank];
  if (hosts.workers[h].size() < 2) return nullptr;
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<ControlStore>(control, "handoff/host" + std::to_string(h) + "/", c.join_timeout);
  const auto timeout = group_timeout(c);
  return std::make_unique<GlooHostChannel>(
      gloo_group(store, hosts.local_rank(rank), static_cast<std::uint32_t>(hosts.workers[h].size()), c, timeout));
}

}  // namespace ember::worker
