#include "job/hosts.h"

#include <algorithm>
#include <map>

#include "ember/common/error.h"
#include "ember/common/host.h"
#include "ember/ps/shard_store.h"

namespace ember::worker {

std::uint32_t HostMap::local_rank(std::uint32_t r) const {
  const auto& w = workers[host_of[r]];
  return static_cast<std::uint32_t>(std::find(w.begin(), w.end(), r) - w.begin());
}

std::string HostMap::describe() const {
  std::string s = std::to_string(hosts()) + (hosts() == 1 ? " host: " : " hosts: ");
  for (std::uint32_t h = 0; h < hosts(); ++h) {
    const auto& w = workers[h];
    s += (h ? ", " : "") + names[h] + " (worker" + (w.size() > 1 ? "s " : " ");
    // Ranges of consecutive ranks: "0-3", "0, 2".
    for (std::size_t i = 0; i < w.size();) {
      std::size_t j = i;
      while (j + 1 < w.size() && w[j + 1] == w[j] + 1) ++j;
      s += (i ? ", " : "") + std::to_string(w[i]) + (j > i ? "-" + std::to_string(w[j]) : "");
      i = j + 1;
    }
    s += ")";
  }
  // The shards' hosts, each once, in shard order.
  std::vector<std::string> shard_on;
  for (const std::string& h : shard_hosts)
    if (std::find(shard_on.begin(), shard_on.end(), h) == shard_on.end()) shard_on.push_back(h);
  for (std::size_t i = 0; i < shard_on.size(); ++i)
    s += (i ? ", " : (shard_hosts.size() == 1 ? "; PS shard on " : "; PS shards on ")) + shard_on[i];
  return s;
}

HostMap host_map(std::uint32_t workers, std::uint32_t shards, const std::function<std::string(const std::string&)>& lookup) {
  HostMap m;
  std::map<std::string, std::uint32_t> id;
  // A stated host is one machine: the first member to state it names the machine, and
  // one that states it from another machine is refused (a hostfile or launcher that put
  // one host's name on two machines would count traffic between them as within a host).
  std::map<std::string, std::pair<std::string, std::string>> machine_of;  // host -> (machine, who)
  const auto same_machine = [&](const std::string& host, const std::string& who, const std::string& machine) {
    auto [it, fresh] = machine_of.try_emplace(host, machine, who);
    if (!fresh && it->second.first != machine) {
      throw ConfigError("the host map disagrees: " + who + " states host '" + host + "' from machine '" + machine + "', " +
                        it->second.second + " from machine '" + it->second.first + "' (give each machine's members its own --host)");
    }
  };
  for (std::uint32_t r = 0; r < workers; ++r) {
    const std::string name = lookup(worker_host_key(r));
    if (name.empty()) throw ConfigError("worker " + std::to_string(r) + " stated no host (--host must not be empty)");
    same_machine(name, "worker " + std::to_string(r), lookup(worker_machine_key(r)));
    auto [it, fresh] = id.try_emplace(name, m.hosts());
    if (fresh) {
      m.names.push_back(name);
      m.workers.emplace_back();
    }
    m.host_of.push_back(it->second);
    m.workers[it->second].push_back(r);
  }
  for (std::uint32_t sh = 0; sh < shards; ++sh) {
    m.shard_hosts.push_back(lookup(shard_host_key(sh)));
    if (m.shard_hosts.back().empty()) throw ConfigError("PS shard " + std::to_string(sh) + " stated no host (--host must not be empty)");
    same_machine(m.shard_hosts.back(), "PS shard " + std::to_string(sh), lookup(shard_machine_key(sh)));
  }
  return m;
}

PeerBytes allreduce_link_bytes(const HostMap& m, std::uint32_t rank, bool hierarchical, std::uint64_t bytes) {
  PeerBytes p;
  const std::uint64_t W = m.host_of.size(), H = m.hosts();
  if (W < 2) return p;
  if (hierarchical) {
    const std::uint64_t local = m.workers[m.host_of[rank]].size();
    const std::uint64_t within = m.leader(rank) ? (local - 1) * bytes : bytes;
    if (local > 1) p.intra_out = p.intra_in = within;
    if (m.leader(rank) && H > 1) p.cross_out = p.cross_in = 2 * (H - 1) * bytes / H;
    return p;
  }
  const std::uint64_t ring = 2 * (W - 1) * bytes / W;
  const auto next = static_cast<std::uint32_t>((rank + 1) % W), prev = static_cast<std::uint32_t>((rank + W - 1) % W);
  (m.host_of[next] != m.host_of[rank] ? p.cross_out : p.intra_out) = ring;
  (m.host_of[prev] != m.host_of[rank] ? p.cross_in : p.intra_in) = ring;
  return p;
}

Links link_traffic(const HostMap& m, std::uint32_t rank, const std::vector<ps::WireTally>& by_shard,
                   const std::vector<ps::PsClient::SocketBytes>& socket, bool hierarchical, std::uint64_t allreduce_bytes,
                   const ps::WireTally& handed) {
  Links l;
  l.intra_host.handed = handed;
  const std::string& mine = m.names[m.host_of[rank]];
  for (std::size_t s = 0; s < by_shard.size(); ++s) {
    const bool local = s < m.shard_hosts.size() && m.shard_hosts[s] == mine;
    LinkTraffic& link = local ? l.intra_host : l.cross_host;
    link.ps += by_shard[s];
    if (s < socket.size()) {
      link.ps_out += socket[s].out;
      link.ps_in += socket[s].in;
    }
  }
  const PeerBytes p = allreduce_link_bytes(m, rank, hierarchical, allreduce_bytes);
  l.intra_host.peer_out = p.intra_out;
  l.intra_host.peer_in = p.intra_in;
  l.cross_host.peer_out = p.cross_out;
  l.cross_host.peer_in = p.cross_in;
  return l;
}

HostGroup host_group(const HostMap& m, std::uint32_t rank) {
  HostGroup g;
  const std::uint32_t h = m.host_of[rank];
  g.ranks = m.workers[h];
  g.me = m.local_rank(rank);
  // A shard on another host: by the key's shard (ps::owner_shard) and that shard's host.
  std::vector<bool> away;
  for (const std::string& s : m.shard_hosts) away.push_back(s != m.names[h]);
  g.across = [away, shards = static_cast<std::uint32_t>(away.size())](Key k) { return away[ps::owner_shard(k, shards)]; };
  return g;
}

}  // namespace ember::worker
