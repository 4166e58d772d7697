// Hosts: a job member's host name, and the control-plane board keys under which the
// members state theirs at the join (docs/cluster.md#hosts-known-to-the-job).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ember {

// This machine's name (gethostname: the UTS namespace's); "localhost" if unknown.
std::string this_host_name();

// The first IPv4 address of `name` (a host name, or an address) as text, as a client that
// connects by the name reaches it; none if it does not resolve (`why` says why).
std::optional<std::string> ipv4_address(const std::string& name, std::string* why = nullptr);

// The board key under which worker `rank` states its host (ember-worker --host).
std::string worker_host_key(std::uint32_t rank);
// The same for PS shard `shard` (ember-ps --host).
std::string shard_host_key(std::uint32_t shard);
// Where each states the machine it runs on (this_host_name()): members that state one
// host must run on one machine.
std::string worker_machine_key(std::uint32_t rank);
std::string shard_machine_key(std::uint32_t shard);

}  // namespace ember
