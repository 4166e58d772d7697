// Which workers of a job share a host. Each worker states its host at the join (`--host`,
// default the machine's name) on the control plane's board; every worker reads all of
// them, so every worker builds the same map: hosts numbered in order of their lowest
// worker rank, the workers of a host in rank order (the first is the host's leader).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::worker {

struct HostMap {
  std::vector<std::string> names;                   // per host
  std::vector<std::uint32_t> host_of;               // per worker rank
  std::vector<std::vector<std::uint32_t>> workers;  // per host: its ranks, ascending

  std::uint32_t hosts() const { return static_cast<std::uint32_t>(names.size()); }
  // Rank `r`'s place among its host's workers (0: the leader).
  std::uint32_t local_rank(std::uint32_t r) const;
  bool leader(std::uint32_t r) const { return workers[host_of[r]].front() == r; }
  // "2 hosts: a (workers 0-3), b (workers 4-7)".
  std::string describe() const;
};

// The board key under which worker `rank` states its host.
std::string worker_host_key(std::uint32_t rank);
// The map from every worker's stated host (`lookup(worker_host_key(r))` for each rank).
HostMap host_map(std::uint32_t workers, const std::function<std::string(const std::string&)>& lookup);

// Payload bytes one worker sends across hosts in one all-reduce of `bytes` (per worker),
// by the algorithm: a flat ring over every rank sends 2(W-1)/W of it to the next rank,
// which is on another host at each host boundary; the hierarchical one (a reduce to the
// host's leader, a ring over the leaders, a broadcast back) crosses hosts only in the
// leaders' ring, 2(H-1)/H of it per leader.
std::uint64_t allreduce_cross_host_bytes(const HostMap& m, std::uint32_t rank, bool hierarchical, std::uint64_t bytes);

}  // namespace ember::worker
