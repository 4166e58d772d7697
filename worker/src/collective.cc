#include "collective.h"

#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "control_store.h"
#include "ember/common/error.h"
#include "ember/common/process.h"

namespace ember::worker {

namespace {

// Starts an all-reduce on `pg` (Gloo or NCCL) and returns what waits for it; the
// function holds the group and its store.
template <typename Group>
std::function<std::function<void()>(std::vector<torch::Tensor>&)> starter(c10::intrusive_ptr<Group> pg,
                                                                          c10::intrusive_ptr<c10d::Store> store) {
  return [pg, store](std::vector<torch::Tensor>& t) -> std::function<void()> { return [work = pg->allreduce(t)] { work->wait(); }; };
}

using GlooGroup = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

// How long a Gloo group's operation may wait for a peer: longer than the heartbeat
// timeout (the control plane names a lost peer first), at least a minute.
std::chrono::milliseconds group_timeout(const TrainConfig& c) {
  return std::max(std::chrono::milliseconds(60000), c.heartbeat_timeout * 3);
}

GlooGroup gloo_group(c10::intrusive_ptr<c10d::Store> store, std::uint32_t rank, std::uint32_t size, const TrainConfig& c,
                     std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c.gloo_host));
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), opts);
}

// One thread that runs the hierarchical sums' chains in the order they were started:
// every rank then issues its collectives in the same order, and no thread is made per sum.
class ChainThread {
 public:
  ChainThread() : thread_([this] { run(); }) {}
  ~ChainThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  ChainThread(const ChainThread&) = delete;
  ChainThread& operator=(const ChainThread&) = delete;

  std::future<void> submit(std::function<void()> chain) {
    std::packaged_task<void()> task(std::move(chain));
    std::future<void> done = task.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    ready_.notify_one();
    return done;
  }

 private:
  void run() {
    name_this_thread("allreduce-chain");
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception goes to the sum's future
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

// Reduce to the host's leader, all-reduce over the leaders, broadcast from the leader:
// one chain on the chain thread per sum, so that it overlaps as one all-reduce does.
std::function<std::function<void()>(std::vector<torch::Tensor>&)> hierarchical(GlooGroup host, GlooGroup leaders) {
  auto chains = std::make_shared<ChainThread>();
  return [host, leaders, chains](std::vector<torch::Tensor>& t) -> std::function<void()> {
    auto done = std::make_shared<std::future<void>>(chains->submit([host, leaders, &t] {
      c10d::ReduceOptions to_leader;  // a sum, to local rank 0
      to_leader.rootRank = 0;
      c10d::BroadcastOptions from_leader;
      from_leader.rootRank = 0;
      if (host->getSize() > 1) host->reduce(t, to_leader)->wait();
      if (leaders && leaders->getSize() > 1) leaders->allreduce(t)->wait();
      if (host->getSize() > 1) host->broadcast(t, from_leader)->wait();
    }));
    return [done] { done->get(); };
  };
}

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

std::unique_ptr<EvictionChannel> make_eviction_channel(const TrainConfig& c, transport::ControlMember& control, std::uint32_t rank) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "sched/", c.join_timeout);
  const auto timeout = group_timeout(c);
  return std::make_unique<GlooEvictionChannel>(gloo_group(store, rank, c.workers, c, timeout), c.workers);
}

std::unique_ptr<HostChannel> make_host_channel(const TrainConfig& c, transport::ControlMember& control, std::uint32_t rank,
                                               const HostMap& hosts) {
  const std::uint32_t h = hosts.host_of[rank];
  if (hosts.workers[h].size() < 2) return nullptr;
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<ControlStore>(control, "relay/host" + std::to_string(h) + "/", c.join_timeout);
  const auto timeout = group_timeout(c);
  return std::make_unique<GlooHostChannel>(
      gloo_group(store, hosts.local_rank(rank), static_cast<std::uint32_t>(hosts.workers[h].size()), c, timeout));
}

Collective::Collective(const TrainConfig& c, transport::ControlMember& control, std::uint32_t rank, torch::Device device,
                       const HostMap& hosts) {
  // The rendezvous goes over the control plane (authenticated by the job token), not a
  // c10d TCPStore on an open port.
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "c10d/", c.join_timeout);
  const auto timeout = group_timeout(c);
  if (c.allreduce == "hierarchical" && device.is_cuda()) {
    throw ConfigError("--allreduce hierarchical runs on Gloo (host tensors): use --allreduce flat with --device cuda");
  }
#ifdef USE_C10D_NCCL
  if (device.is_cuda()) {
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(c.workers), nccl);
    start_ = starter(pg, store);
    on_device_ = true;
    return;
  }
#endif
  if (c.allreduce == "hierarchical") {
    // Every worker makes its host's group, then the leaders theirs (each rendezvous
    // under a prefix of its own).
    const std::uint32_t h = hosts.host_of[rank];
    auto host_store = c10::make_intrusive<c10d::PrefixStore>("host" + std::to_string(h) + "/", store);
    GlooGroup host = gloo_group(host_store, hosts.local_rank(rank), static_cast<std::uint32_t>(hosts.workers[h].size()), c, timeout);
    GlooGroup leaders;
    if (hosts.leader(rank)) leaders = gloo_group(c10::make_intrusive<c10d::PrefixStore>("leaders/", store), h, hosts.hosts(), c, timeout);
    start_ = hierarchical(host, leaders);
    return;
  }
  start_ = starter(gloo_group(store, rank, c.workers, c, timeout), store);
}

}  // namespace ember::worker
