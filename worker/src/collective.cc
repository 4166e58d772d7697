#include "collective.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ember/ps/ps_client.h"

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
  // Worker 0 hosts the c10d store on any free port and publishes where it is.
  c10d::TCPStoreOptions so;
  so.timeout = c.join_timeout;
  c10::intrusive_ptr<c10d::Store> store;
  if (rank == 0) {
    so.port = 0;
    so.isServer = true;
    so.numWorkers = c.workers;
    so.waitWorkers = false;
    auto server = c10::make_intrusive<c10d::TCPStore>(c.gloo_host, so);
    control.publish("gloo_store", c.gloo_host + ":" + std::to_string(server->getPort()));
    store = server;
  } else {
    auto addr = ps::parse_address(control.lookup("gloo_store", c.join_timeout));
    so.port = addr.port;
    store = c10::make_intrusive<c10d::TCPStore>(addr.host, so);
  }
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
