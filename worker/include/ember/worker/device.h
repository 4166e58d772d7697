// Where a worker trains: the LibTorch device it will use and what it offers. Free of
// LibTorch's headers (they are slow to compile): parse_device's callers include them.
#pragma once

#include <string>

namespace c10 {
struct Device;
}

namespace ember::worker {

struct DeviceInfo {
  std::string device;  // "cpu" or "cuda:0"
  bool cuda_available = false;
  int cuda_devices = 0;
  int intra_op_threads = 1;  // at::get_num_threads()
  std::string torch_version;
};

// The device a worker uses: CUDA when `prefer_cuda` and a device is visible, else CPU.
DeviceInfo select_device(bool prefer_cuda);

// "cpu", "cuda" or "cuda:N" as a device; ConfigError for another text, or for CUDA
// without a device visible to LibTorch.
c10::Device parse_device(const std::string& text);

// One-line description for logs.
std::string describe(const DeviceInfo& info);

}  // namespace ember::worker
