#include "collective.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "control_store.h"

namespace ember::worker {

namespace {

// Starts an all-reduce on `pg` (Gloo or NCCL) and returns what waits for it; the
// function holds the group and its store.
template <typename Group>
std::function<std::function<void()>(std::vector<torch::Tensor>&)> starter(c10::intrusive_ptr<Group> pg,
                                                                          c10::intrusive_ptr<c10d::Store> store) {
  return [pg, store](std::vector<torch::Tensor>& t) -> std::function<void()> { return [work = pg->allreduce(t)] { work->wait(); }; };
}

}  // namespace

Collective::Collective(const TrainConfig& c, transport::ControlMember& control, std::uint32_t rank, torch::Device device) {
  // The rendezvous goes over the control plane (authenticated by the job token), not a
  // c10d TCPStore on an open port.
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "c10d/", c.join_timeout);
  const auto timeout = std::max(std::chrono::milliseconds(60000), c.heartbeat_timeout * 3);
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
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c.gloo_host));
  opts->timeout = timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(c.workers), opts);
  start_ = starter(pg, store);
}

}  // namespace ember::worker
