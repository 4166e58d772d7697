#include "collective.h"

#include <future>
#include <memory>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "control_store.h"
#include "ember/common/error.h"

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

GlooGroup gloo_group(c10::intrusive_ptr<c10d::Store> store, std::uint32_t rank, std::uint32_t size, const TrainConfig& c,
                     std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c.gloo_host));
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), opts);
}

// Reduce to the host's leader, all-reduce over the leaders, broadcast from the leader:
// one chain on a thread of its own per sum, so that it overlaps as one all-reduce does.
std::function<std::function<void()>(std::vector<torch::Tensor>&)> hierarchical(GlooGroup host, GlooGroup leaders) {
  return [host, leaders](std::vector<torch::Tensor>& t) -> std::function<void()> {
    auto done = std::make_shared<std::future<void>>(std::async(std::launch::async, [host, leaders, &t] {
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

Collective::Collective(const TrainConfig& c, transport::ControlMember& control, std::uint32_t rank, torch::Device device,
                       const HostMap& hosts) {
  // The rendezvous goes over the control plane (authenticated by the job token), not a
  // c10d TCPStore on an open port.
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "c10d/", c.join_timeout);
  const auto timeout = std::max(std::chrono::milliseconds(60000), c.heartbeat_timeout * 3);
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
