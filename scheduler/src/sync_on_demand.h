// Step 1 of on-demand sync, shared by OnDemandSync and PeerSync (sync_on_demand.cc,
// sync_peer.cc): they differ only in what a row's latest holder does.
#pragma once

#include "sync_mode.h"

namespace ember::scheduler {

template <typename OwnerStep>
void OnDemandSync::sync_rows(Iteration& it, OwnerStep&& owner_step) {
  BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  const bool prefetch = it.config.prefetch;
  const std::uint32_t D = s.size();
  // Two-stage prefetch: the partial holders' list 16 rows ahead, the holders' index
  // entries 8 ahead (unless the caches' updates are deferred); these rows miss the cache
  // otherwise.
  constexpr std::uint32_t kFar = 16, kNear = 8;
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + kFar < D && s.partial_d[d + kFar]) loc.prefetch_partial(s.keys[d + kFar]);
    if (d + kNear < D && !s.defer_cache) {
      const Key kn = s.keys[d + kNear];
      if (s.partial_d[d + kNear]) loc.for_each_partial(kn, [&](std::uint32_t w) { it.cache(w).prefetch(kn); });
      // An owner that may have to push its value to another trainer.
      const std::uint16_t on = s.owner_d[d + kNear];
      if (on != cache::LocationMap::kNoOwner && it.models(on) && s.others(d + kNear, on)) it.cache(on).prefetch(kn);
    }
    const Key k = s.keys[d];
    if (s.partial_d[d]) {
      // A flushed aggregate is at the PS already: the copies just leave. (The holders
      // this scheduler does not model are their own hosts' to plan.)
      const bool flushed = loc.flushed(k);
      loc.for_each_partial(k, [&](std::uint32_t w) {
        if (s.defer_cache) {
          s.work[w].erase.push_back(k);
          s.work[w].pushes.push_back(!flushed);
        } else {
          const std::uint32_t slot = it.cache(w).erase(k);
          if (!flushed) it.plans[w].push_grads.push_back({k, slot});
        }
        s.per_worker[w].push_grad += !flushed;
      });
      loc.clear_partials(k);
      if (prefetch && !flushed) it.pushed.note(k);
    }
    const std::uint16_t o = s.owner_d[d];
    if (o == cache::LocationMap::kNoOwner || !s.others(d, o)) continue;
    owner_step(d, o);
  }
}

}  // namespace ember::scheduler
