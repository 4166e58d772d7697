// A Gloo process group of some of the job's workers, rendezvous over the control plane:
// the dense collective's (collective.cc) and the host tier's channels
// (host/host_channels.cc) each make their own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "ember/worker/train_config.h"

namespace ember::worker {

using GlooGroup = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

// How long a Gloo group's operation may wait for a peer: longer than the heartbeat
// timeout (the control plane names a lost peer first), at least a minute.
inline std::chrono::milliseconds group_timeout(const ConnectOptions& c) {
  return std::max(std::chrono::milliseconds(60000), c.heartbeat_timeout * 3);
}

inline GlooGroup gloo_group(c10::intrusive_ptr<c10d::Store> store, std::uint32_t rank, std::uint32_t size, const ConnectOptions& c,
                            std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(c.gloo_host));
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), opts);
}

}  // namespace ember::worker
