// RDMA (ibverbs) availability. The RDMA data plane itself is not built yet; this probe
// lets `--transport rdma` fail with one clear line on machines without a device.
#pragma once

#include <string>

namespace ember::transport {

// Empty when ibverbs lists at least one device; otherwise why not, ending in
// "; use --transport tcp" (no device, ibverbs unsupported by the kernel, or Ember built
// without libibverbs).
std::string rdma_unavailable_reason();

}  // namespace ember::transport
