// Which workers of a job share a host, and where each PS shard runs. Each worker states
// its host at the join (`--host`, default the machine's name) on the control plane's
// board, as each shard does (`ember-ps --host`); every worker reads all of them, so every
// worker builds the same map: hosts numbered in order of their lowest worker rank, the
// workers of a host in rank order (the first is the host's leader).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/ps/ps_client.h"
#include "ember/worker/summary.h"
#include "host/host_plans.h"

namespace ember::worker {

struct HostMap {
  std::vector<std::string> names;                   // per host
  std::vector<std::uint32_t> host_of;               // per worker rank
  std::vector<std::vector<std::uint32_t>> workers;  // per host: its ranks, ascending
  std::vector<std::string> shard_hosts;             // per PS shard: its host's name

  std::uint32_t hosts() const { return static_cast<std::uint32_t>(names.size()); }
  // Rank `r`'s place among its host's workers (0: the leader).
  std::uint32_t local_rank(std::uint32_t r) const;
  bool leader(std::uint32_t r) const { return workers[host_of[r]].front() == r; }
  // "2 hosts: a (workers 0-3), b (workers 4-7); PS shards on c".
  std::string describe() const;
};

// The map from every worker's and shard's stated host (`lookup(worker_host_key(r))` for
// each rank, `lookup(shard_host_key(s))` for each shard: common/host.h).
HostMap host_map(std::uint32_t workers, std::uint32_t shards, const std::function<std::string(const std::string&)>& lookup);

// All-reduce payload one worker sends and receives within its host and across hosts, for
// `bytes` summed (per worker). A flat ring over every rank sends 2(W-1)/W of it to the
// next rank and receives as much from the previous one, across hosts where that rank is
// on another host. The hierarchical one: within the host a reduce to the leader and a
// broadcast back (each other worker sends and receives `bytes`, the leader that much per
// other worker), and across hosts only the leaders' ring, 2(H-1)/H of it per leader.
struct PeerBytes {
  std::uint64_t intra_out = 0, intra_in = 0, cross_out = 0, cross_in = 0;
};
PeerBytes allreduce_link_bytes(const HostMap& m, std::uint32_t rank, bool hierarchical, std::uint64_t bytes);

// Worker `rank`'s traffic by link class: each shard's tally (PsClient::tally_by_shard)
// and socket bytes (PsClient::socket_bytes_by_shard) within the host where the shard's
// host is the worker's, across hosts otherwise; the rows handed within the host
// (`handed`, WireCounts::handed) within it.
Links link_traffic(const HostMap& m, std::uint32_t rank, const std::vector<ps::WireTally>& by_shard,
                   const std::vector<ps::PsClient::SocketBytes>& socket, bool hierarchical, std::uint64_t allreduce_bytes,
                   const ps::WireTally& handed = {});
// What worker `rank` needs of the map to plan per-host aggregation (host/host_plans.h).
HostGroup host_group(const HostMap& m, std::uint32_t rank);

}  // namespace ember::worker
