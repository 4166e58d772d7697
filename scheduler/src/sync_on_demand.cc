// On-demand sync (plan, herald, brute; Herald's Algorithm 2): before the pulls, the
// partial holders of a row someone trains push their gradients and a dirty owner pushes
// its value if another worker trains the row; the pull of the latest-copy modes; after
// training, a sole trainer holds the latest (dirty) copy and several trainers a partial
// gradient each, pushed only when the row is next needed (or evicted, or flushed).
#include <bit>

#include "sync_mode.h"

namespace ember::scheduler {

void OnDemandSync::sync(Iteration& it) {
  BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  const bool prefetch = it.config.prefetch;
  const std::uint32_t D = s.size();
  const bool peer = it.config.peer_sync;
  if (peer) s.peer_d.assign(D, cache::LocationMap::kNoOwner);
  // Two-stage prefetch: the partial mask 16 rows ahead, the holders' index entries 8
  // ahead; these rows miss the cache otherwise.
  constexpr std::uint32_t kFar = 16, kNear = 8;
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + kFar < D && s.partial_d[d + kFar]) loc.prefetch_partial(s.keys[d + kFar]);
    if (d + kNear < D) {
      const Key kn = s.keys[d + kNear];
      if (s.partial_d[d + kNear]) for_each_bit(loc.partial(kn), [&](std::uint32_t w) { it.lru[w].prefetch(kn); });
      // An owner that may have to push its value to another trainer.
      const std::uint8_t on = s.owner_d[d + kNear];
      if (on != cache::LocationMap::kNoOwner && (s.umask[d + kNear] & ~bit(on)) != 0) it.lru[on].prefetch(kn);
    }
    const Key k = s.keys[d];
    const std::uint64_t U = s.umask[d];
    if (s.partial_d[d]) {
      // A flushed aggregate is at the PS already: the copies just leave.
      const bool flushed = loc.flushed(k);
      std::uint64_t P = loc.partial(k);
      for_each_bit(P, [&](std::uint32_t w) {
        std::uint32_t slot = it.lru[w].erase(k);
        if (flushed) return;
        it.plans[w].push_grads.push_back({k, slot});
        ++s.per_worker[w].push_grad;
      });
      loc.set_partial(k, 0);
      if (prefetch && !flushed) it.pushed.note(k);
    }
    std::uint8_t o = s.owner_d[d];
    if (peer && o != cache::LocationMap::kNoOwner && (U & ~bit(o)) != 0) {
      peer_sync(it, d, o);
      continue;
    }
    if (o != cache::LocationMap::kNoOwner && (U & ~bit(o)) != 0 && loc.dirty(k)) {
      if (!loc.flushed(k)) {
        it.plans[o].push_values.push_back({k, it.lru[o].find(k)});
        ++s.per_worker[o].push_value;
        if (prefetch) it.pushed.note(k);
      }
      loc.set_clean(k);
    }
  }
}

void OnDemandSync::peer_sync(Iteration& it, std::uint32_t d, std::uint32_t o) {
  // The trainers on o's host take the row from o (value and state) instead of pulling
  // it; o pushes its value (if dirty) only when a trainer is on another host, and lets
  // its copy go at once if it does not train the row. (A row all of whose trainers are
  // on o's host thus never reaches the PS: its new state comes at step 3.)
  BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  const Key k = s.keys[d];
  const std::uint64_t U = s.umask[d];
  const std::uint32_t h = it.config.host_of[o];
  std::uint64_t same = 0;
  for_each_bit(U & ~bit(o), [&](std::uint32_t w) { same |= it.config.host_of[w] == h ? bit(w) : 0; });
  const bool across = (U & ~bit(o) & ~same) != 0;
  const std::uint32_t slot = it.lru[o].find(k);
  if (across && loc.dirty(k)) {
    if (!loc.flushed(k)) {
      it.plans[o].push_values.push_back({k, slot});
      ++s.per_worker[o].push_value;
      if (it.config.prefetch) it.pushed.note(k);
    }
    loc.set_clean(k);
  }
  if (same == 0) return;
  for_each_bit(same, [&](std::uint32_t w) { it.plans[o].hand_values.push_back({k, slot, w}); });
  s.peer_d[d] = static_cast<std::uint8_t>(o);
  if ((U & bit(o)) == 0) it.lru[o].erase(k);
}

void OnDemandSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void OnDemandSync::train(Iteration& it) {
  const BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  train_cached_rows(it, true, [&](std::uint32_t d) {
    const Key k = s.keys[d];
    const std::uint64_t U = s.umask[d];
    if (std::popcount(U) == 1) {
      loc.set_owner(k, static_cast<std::uint32_t>(std::countr_zero(U)), true);
    } else if (host_applied(it, d)) {
      // Peer sync: the host's first trainer applies the sum and holds the row dirty; the
      // others hand it their gradients and let their copies go.
      const auto first = static_cast<std::uint32_t>(std::countr_zero(U));
      loc.set_owner(k, first, true);
      const std::uint32_t W = it.config.workers;
      for_each_bit(U & ~bit(first), [&](std::uint32_t w) {
        const std::uint32_t slot = s.dslot[static_cast<std::size_t>(d) * W + w];
        it.lru[w].erase(k);
        it.plans[w].hand_grads.push_back({k, slot, first});
        it.plans[w].drops.push_back({k, slot});
        ++it.rows.per_worker[w].peer_grad;
      });
    } else {
      loc.clear_owner(k);
      loc.set_partial(k, U);
    }
  });
}

}  // namespace ember::scheduler
