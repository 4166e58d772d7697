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
  const std::uint32_t W = it.config.workers;
  train_cached_rows(it, false, [&](std::uint32_t d) {
    const Key k = s.keys[d];
    const std::uint64_t U = s.umask[d];
    auto slot_of = [&](std::uint32_t w) { return s.dslot[static_cast<std::size_t>(d) * W + w]; };
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
  });
}

}  // namespace ember::scheduler
