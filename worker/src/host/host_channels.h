// The host tier's channels, each a Gloo group of its own (apart from the all-reduce's,
// whose sums run on other threads), rendezvous over the control plane.
#pragma once

#include <cstdint>
#include <memory>

#include "ember/transport/control.h"
#include "ember/worker/train_config.h"
#include "host/eviction_exchange.h"
#include "host/host_plans.h"
#include "job/hosts.h"

namespace ember::worker {

// The channel per-host aggregation hands rows over (host_exchange.h): a Gloo group of this
// worker's host of its own (apart from the all-reduce's, whose sums run on other
// threads), rendezvous over the control plane. Null where the host has one worker.
std::unique_ptr<HostChannel> make_host_channel(const ConnectOptions& c, transport::ControlMember& control, std::uint32_t rank,
                                               const HostMap& hosts);

// The channel the hosts' schedulers exchange their evictions over
// (eviction_exchange.h): a Gloo group of every worker of its own, used by the loader's
// thread.
std::unique_ptr<EvictionChannel> make_eviction_channel(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control,
                                                       std::uint32_t rank);

}  // namespace ember::worker
