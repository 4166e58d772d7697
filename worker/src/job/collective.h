// The dense collective: sums tensors over the job's workers with c10d, Gloo on host
// tensors, or NCCL on GPUs when LibTorch has it (EMBER_TORCH_NCCL). The workers
// rendezvous through the control plane's board (control_store.h).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "ember/transport/control.h"
#include "ember/worker/train_config.h"
#include "job/hosts.h"

namespace ember::worker {

class Collective {
 public:
  // `--allreduce hierarchical` (Gloo): a group per host and one of the hosts' leaders
  // (`hosts`); each sum is a reduce to the leader, an all-reduce over the leaders and a
  // broadcast back, so only the leaders' ring crosses hosts.
  Collective(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control, std::uint32_t rank, torch::Device device,
             const HostMap& hosts);
  // Starts summing `tensors` over the workers, in place (c10d runs it on its own
  // threads); the sum is there once the returned function, called once, returns.
  // `tensors` must live until then.
  std::function<void()> start_allreduce(std::vector<torch::Tensor>& tensors) { return start_(tensors); }
  // Whether allreduce takes tensors on the device (NCCL) rather than on the host (Gloo).
  bool on_device() const { return on_device_; }

 private:
  // A function holding the process group and its store, not a group pointer: the
  // groups' base classes differ between LibTorch versions.
  std::function<std::function<void()>(std::vector<torch::Tensor>&)> start_;
  bool on_device_ = false;
};

}  // namespace ember::worker
