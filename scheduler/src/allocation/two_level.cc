// Two-level LAIA (--host-allocation): each sample to the best host with room, then to
// the best of that host's workers with room.
#include <algorithm>

#include "../allocation.h"
#include "ember/common/hash.h"
#include "laia_pick.h"

namespace ember::scheduler {

using laia::pick;
using laia::Room;
using laia::score_samples;

LaiaStats allocate_laia_by_host(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                                const std::vector<std::uint32_t>& tables, LaiaScratch& x, std::vector<std::uint32_t>& worker_of) {
  const std::uint32_t n = batch.samples;
  const std::vector<std::uint32_t>& host_of = c.host_of;
  const std::uint32_t H = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<std::vector<std::uint32_t>> members(H);
  std::vector<std::uint32_t> local(c.workers);
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    local[w] = static_cast<std::uint32_t>(members[host_of[w]].size());
    members[host_of[w]].push_back(w);
  }
  // Level 1: a sample's candidates are hosts, each with the rows of it its workers hold
  // as latest.
  LaiaStats st{score_samples(
                   c, batch, rows, tables, [&](std::uint32_t o) { return host_of[o]; }, x),
               static_cast<std::uint32_t>(tables.size())};
  // Algorithm 1 twice, per partition: each sample to the best host with room (room: its
  // workers' micro-batches), then within each host, its samples in batch order to the
  // best of its workers with room. Seeded random ties at both levels.
  const std::uint32_t P = c.partitions, per = n / P, cap0 = c.batch_per_worker / P;
  std::vector<std::uint32_t> ties, host_cap(H), cap(c.workers), host_pick(n);
  std::vector<std::uint16_t> local_score;
  for (std::uint32_t p = 0; p < P; ++p) {
    data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration * 131 + p + 0x2b2b)));
    for (std::uint32_t h = 0; h < H; ++h) host_cap[h] = cap0 * static_cast<std::uint32_t>(members[h].size());
    Room hosts(host_cap);
    std::fill(cap.begin(), cap.end(), cap0);
    const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t h = pick(x, batch, i, hosts, rng, ties);
      host_pick[i] = h;
      hosts.take(h);
    }
    // Level 2: the rows of the sample each of the host's workers holds as latest.
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t h = host_pick[i];
      const auto& ws = members[h];
      local_score.assign(ws.size(), 0);
      laia::for_each_scored_row(batch, rows, tables, i, [&](std::uint32_t d) {
        const std::uint16_t o = rows.owner_d[d];
        if (o != cache::LocationMap::kNoOwner && host_of[o] == h) ++local_score[local[o]];
      });
      int best = -1;
      ties.clear();
      for (std::uint32_t l = 0; l < ws.size(); ++l) {
        if (cap[ws[l]] == 0) continue;
        if (local_score[l] > best) {
          best = local_score[l];
          ties.clear();
        }
        if (local_score[l] == best) ties.push_back(l);
      }
      const std::uint32_t l = ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
      worker_of[i] = ws[l];
      --cap[ws[l]];
    }
  }
  return st;
}

}  // namespace ember::scheduler
