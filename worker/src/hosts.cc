#include "hosts.h"

#include <algorithm>
#include <map>

#include "ember/common/error.h"

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
  return s;
}

std::string worker_host_key(std::uint32_t rank) { return "host/worker/" + std::to_string(rank); }

HostMap host_map(std::uint32_t workers, const std::function<std::string(const std::string&)>& lookup) {
  HostMap m;
  std::map<std::string, std::uint32_t> id;
  for (std::uint32_t r = 0; r < workers; ++r) {
    const std::string name = lookup(worker_host_key(r));
    if (name.empty()) throw ConfigError("worker " + std::to_string(r) + " stated no host (--host must not be empty)");
    auto [it, fresh] = id.try_emplace(name, m.hosts());
    if (fresh) {
      m.names.push_back(name);
      m.workers.emplace_back();
    }
    m.host_of.push_back(it->second);
    m.workers[it->second].push_back(r);
  }
  return m;
}

std::uint64_t allreduce_cross_host_bytes(const HostMap& m, std::uint32_t rank, bool hierarchical, std::uint64_t bytes) {
  const std::uint64_t W = m.host_of.size(), H = m.hosts();
  if (hierarchical) return m.leader(rank) && H > 1 ? 2 * (H - 1) * bytes / H : 0;
  const std::uint32_t next = static_cast<std::uint32_t>((rank + 1) % W);
  return W > 1 && m.host_of[next] != m.host_of[rank] ? 2 * (W - 1) * bytes / W : 0;
}

}  // namespace ember::worker
