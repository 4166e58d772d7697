// Full-set sync (vanilla, laia, fae:F): no sync phase; the pull of the latest-copy modes;
// at the end of the iteration every trainer pushes the gradient of every row it trained
// and the PS applies them. A sole trainer keeps a latest-clean copy, several trainers'
// copies are dropped.
#include "sync_mode.h"

namespace ember::scheduler {

void FullSetSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void FullSetSync::train(Iteration& it) {
  BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  train_cached_rows(it, false, [&](std::uint32_t d) {
    const Key k = s.keys[d];
    s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
      if (!it.models(w)) return;
      it.plans[w].end_pushes.push_back({k, slot});
      ++s.per_worker[w].push_grad;
    });
    if (it.config.prefetch) it.pushed.note(k);
    if (s.count(d) == 1) {
      loc.set_owner(k, s.first(d), false);
    } else {
      loc.clear_owner(k);
      s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
        if (!it.models(w)) return;
        it.cache(w).erase(k);
        it.plans[w].drops.push_back({k, slot});
      });
    }
  });
}

}  // namespace ember::scheduler
