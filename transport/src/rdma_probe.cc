#include <cerrno>
#include <cstring>

#include "ember/transport/rdma.h"

#ifdef EMBER_HAVE_RDMA
#include <infiniband/verbs.h>
#endif

namespace ember::transport {

std::string rdma_unavailable_reason() {
#ifdef EMBER_HAVE_RDMA
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list != nullptr) {
    ibv_free_device_list(list);
    if (count > 0) return "";
    return "no RDMA device found (ibverbs lists none); use --transport tcp";
  }
  const int err = errno;
  return std::string("no RDMA device found (ibv_get_device_list: ") + std::strerror(err) + "); use --transport tcp";
#else
  return "no RDMA support in this build (libibverbs-dev was not found); use --transport tcp";
#endif
}

}  // namespace ember::transport
