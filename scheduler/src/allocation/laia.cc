// LAIA (Herald's Algorithm 1): each sample to the worker holding the most of its rows as
// latest, among those with room; partitions allocated independently.
#include <tbb/parallel_for.h>

#include "../allocation.h"
#include "ember/common/hash.h"
#include "laia_pick.h"

namespace ember::scheduler {

using laia::pick;
using laia::Room;
using laia::score_samples;

LaiaStats allocate_laia(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                        const std::vector<std::uint32_t>& tables, LaiaScratch& x, std::vector<std::uint32_t>& worker_of) {
  const std::uint32_t n = batch.samples, W = c.workers;
  LaiaStats st{score_samples(
                   c, batch, rows, tables, [](std::uint32_t o) { return o; }, x),
               static_cast<std::uint32_t>(tables.size())};
  // Algorithm 1: each sample, in batch order, to the highest-scoring worker with room;
  // seeded random ties. Partitions (if any) are allocated independently and in parallel.
  const std::uint32_t P = c.partitions, per = n / P, cap0 = c.batch_per_worker / P;
  auto allocate_part = [&](std::uint32_t p) {
    data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration * 131 + p + 0x1a1a)));
    Room room(std::vector<std::uint32_t>(W, cap0));
    std::vector<std::uint32_t> ties;
    const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t w = pick(x, batch, i, room, rng, ties);
      worker_of[i] = w;
      room.take(w);
    }
  };
  if (P > 1 && c.threads > 1) {
    tbb::parallel_for(0u, P, allocate_part);
  } else {
    for (std::uint32_t p = 0; p < P; ++p) allocate_part(p);
  }
  return st;
}

}  // namespace ember::scheduler
