#include "job/collective.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ember/common/error.h"
#include "ember/common/process.h"
#include "job/control_store.h"
#include "job/gloo_group.h"

namespace ember::worker {

namespace {

// Starts an all-reduce on `pg` (Gloo or NCCL) and returns what waits for it; the
// function holds the group and its store.
template <typename Group>
std::function<std::function<void()>(std::vector<torch::Tensor>&)> starter(c10::intrusive_ptr<Group> pg,
                                                                          c10::intrusive_ptr<c10d::Store> store) {
  return [pg, store](std::vector<torch::Tensor>& t) -> std::function<void()> { return [work = pg->allreduce(t)] { work->wait(); }; };
}

// NCCL refuses two ranks of one communicator on one GPU, and a job's workers may share
// one (a test, a benchmark, a machine with fewer GPUs than workers). Every worker states
// its machine and device on the store; all read the same list, so all choose alike.
// (Processes with different CUDA_VISIBLE_DEVICES that both say cuda:0 count as sharing:
// Gloo then, slower but right.)
bool gpu_shared(c10d::Store& store, std::uint32_t rank, std::uint32_t workers, const torch::Device& device) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string mine = std::string(host) + "/cuda:" + std::to_string(device.has_index() ? device.index() : 0);
  store.set("gpu/" + std::to_string(rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (std::uint32_t r = 0; r < workers; ++r) keys.push_back("gpu/" + std::to_string(r));
  store.wait(keys);
  std::set<std::string> seen;
  for (const auto& k : keys) {
    const std::vector<std::uint8_t> v = store.get(k);
    if (!seen.insert(std::string(v.begin(), v.end())).second) return true;
  }
  return false;
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

}  // namespace

Collective::Collective(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control, std::uint32_t rank,
                       torch::Device device, const HostMap& hosts) {
  // The rendezvous goes over the control plane (authenticated by the job token), not a
  // c10d TCPStore on an open port.
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "c10d/", c.join_timeout);
  const auto timeout = group_timeout(c);
  if (c.allreduce == "hierarchical" && device.is_cuda()) {
    throw ConfigError("--allreduce hierarchical runs on Gloo (host tensors): use --allreduce flat with --device cuda");
  }
  // LibTorch's CMake config defines USE_C10D_NCCL for its CUDA builds.
  [[maybe_unused]] const bool shared = device.is_cuda() && workers > 1 && gpu_shared(*store, rank, workers, device);
#ifdef USE_C10D_NCCL
  if (shared) spdlog::info("workers share a GPU: the dense all-reduce runs on Gloo (NCCL takes one rank per GPU)");
  if (device.is_cuda() && !shared) {
    auto nccl = c10d::ProcessGroupNCCL::Options::create();
    nccl->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(workers), nccl);
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
  start_ = starter(gloo_group(store, rank, workers, c, timeout), store);
}

}  // namespace ember::worker
