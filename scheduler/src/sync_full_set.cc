// Full-set sync (vanilla, laia, fae:F): no sync phase; the pull of the latest-copy modes;
// at the end of the iteration every trainer pushes the gradient of every row it trained
// and the PS applies them. A sole trainer keeps a latest-clean copy, several trainers'
// copies are dropped.
#include <bit>

#include "sync_mode.h"

namespace ember::scheduler {

void FullSetSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void FullSetSync::train(Iteration& it) {
  BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  const std::uint32_t W = it.config.workers, D = s.size();
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + 8 < D) {
      // The holder of a copy the next rows' trainers make stale: its index entry.
      const std::uint64_t Un = s.umask[d + 8];
      const std::uint8_t on = s.owner_d[d + 8];
      if (on != cache::LocationMap::kNoOwner && (Un & bit(on)) == 0) it.lru[on].prefetch(s.keys[d + 8]);
    }
    if (s.replicated_d[d]) continue;  // replicated: all-reduced among the workers
    if (s.uncached_d[d]) {
      train_uncached(it, d);
      continue;
    }
    const Key k = s.keys[d];
    const std::uint64_t U = s.umask[d];
    auto slot_of = [&](std::uint32_t w) { return s.dslot[static_cast<std::size_t>(d) * W + w]; };
    drop_stale_latest(it, d);
    for_each_bit(U, [&](std::uint32_t w) {
      it.plans[w].end_pushes.push_back({k, slot_of(w)});
      ++s.per_worker[w].push_grad;
    });
    if (it.config.prefetch) it.pushed.note(k);
    if (std::popcount(U) == 1) {
      loc.set_owner(k, static_cast<std::uint32_t>(std::countr_zero(U)), false);
    } else {
      loc.clear_owner(k);
      for_each_bit(U, [&](std::uint32_t w) {
        it.lru[w].erase(k);
        it.plans[w].drops.push_back({k, slot_of(w)});
      });
    }
  }
}

}  // namespace ember::scheduler
