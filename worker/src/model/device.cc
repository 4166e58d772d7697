#include "ember/worker/device.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <optional>

#include "ember/common/error.h"

namespace ember::worker {

DeviceInfo select_device(bool prefer_cuda) {
  DeviceInfo info;
  info.cuda_available = torch::cuda::is_available();
  info.cuda_devices = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  info.device = prefer_cuda && info.cuda_available ? "cuda:0" : "cpu";
  info.intra_op_threads = at::get_num_threads();
  info.torch_version = TORCH_VERSION;
  return info;
}

std::string describe(const DeviceInfo& info) {
  return fmt::format("device {} (LibTorch {}, {} CUDA device(s), {} intra-op thread(s))", info.device, info.torch_version,
                     info.cuda_devices, info.intra_op_threads);
}

torch::Device parse_device(const std::string& text) {
  std::optional<torch::Device> d;
  try {
    d.emplace(text);
  } catch (const c10::Error&) {
    throw ConfigError("--device '" + text + "': choose cpu, cuda or cuda:N");
  }
  if (d->is_cuda() && !torch::cuda::is_available()) {
    throw ConfigError("--device " + text + ": no CUDA device visible to LibTorch (" + std::string(TORCH_VERSION) +
                      (torch::cuda::device_count() == 0 ? ", built without CUDA or no GPU" : "") + "); use --device cpu");
  }
  if (!d->is_cpu() && !d->is_cuda()) throw ConfigError("--device '" + text + "': choose cpu, cuda or cuda:N");
  return *d;
}

}  // namespace ember::worker
