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
  // Two-stage prefetch: the partial holders' list 16 rows ahead, the holders' index
  // entries 8 ahead; these rows miss the cache otherwise.
  constexpr std::uint32_t kFar = 16, kNear = 8;
  for (std::uint32_t d = 0; d < D; ++d) {
    if (d + kFar < D && s.partial_d[d + kFar]) loc.prefetch_partial(s.keys[d + kFar]);
    if (d + kNear < D) {
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
        std::uint32_t slot = it.cache(w).erase(k);
        if (flushed) return;
        it.plans[w].push_grads.push_back({k, slot});
        ++s.per_worker[w].push_grad;
      });
      loc.clear_partials(k);
      if (prefetch && !flushed) it.pushed.note(k);
    }
    const std::uint16_t o = s.owner_d[d];
    if (o == cache::LocationMap::kNoOwner || !s.others(d, o)) continue;
    if (peer) {
      peer_sync(it, d, o);
      continue;
    }
    if (loc.dirty(k)) push_value(it, d, o);
  }
}

void OnDemandSync::push_value(Iteration& it, std::uint32_t d, std::uint32_t o) {
  const Key k = it.rows.keys[d];
  if (!it.loc.flushed(k)) {
    if (it.models(o)) {
      it.plans[o].push_values.push_back({k, it.cache(o).find(k)});
      ++it.rows.per_worker[o].push_value;
    }
    if (it.config.prefetch) it.pushed.note(k);
  }
  it.loc.set_clean(k);
}

void OnDemandSync::peer_sync(Iteration& it, std::uint32_t d, std::uint32_t o) {
  // The trainers on o's host take the row from o (value and state) instead of pulling
  // it; o pushes its value (if dirty) only when a trainer is on another host, and lets
  // its copy go at once if it does not train the row. (A row all of whose trainers are
  // on o's host thus never reaches the PS: its new state comes at step 3.)
  BatchRows& s = it.rows;
  const Key k = s.keys[d];
  const std::uint32_t h = it.config.host_of[o];
  std::uint32_t same = 0;
  bool across = false;
  for (std::uint16_t w : s.trainers(d)) {
    if (w == o) continue;
    if (it.config.host_of[w] == h) {
      ++same;
    } else {
      across = true;
    }
  }
  if (across && it.loc.dirty(k)) push_value(it, d, o);
  if (same == 0) return;
  s.peer_d[d] = static_cast<std::uint16_t>(o);
  if (!it.models(o)) return;  // o's host (and the trainers it hands to) is another scheduler's
  const std::uint32_t slot = it.cache(o).find(k);
  for (std::uint16_t w : s.trainers(d)) {
    if (w != o && it.config.host_of[w] == h) it.plans[o].hand_values.push_back({k, slot, w});
  }
  if (!s.trains(d, o)) it.cache(o).erase(k);
}

void OnDemandSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void OnDemandSync::train(Iteration& it) {
  const BatchRows& s = it.rows;
  cache::LocationMap& loc = it.loc;
  const bool all = it.config.model_host < 0;
  train_cached_rows(it, true, [&](std::uint32_t d) {
    const Key k = s.keys[d];
    const std::uint32_t n = s.count(d);
    if (n == 1) {
      loc.set_owner(k, s.first(d), true);
    } else if (host_applied(it, d)) {
      // Peer sync: the host's first trainer applies the sum and holds the row dirty; the
      // others hand it their gradients and let their copies go.
      const std::uint32_t first = s.first(d);
      loc.set_owner(k, first, true);
      s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
        if (w == first || !it.models(w)) return;
        it.cache(w).erase(k);
        it.plans[w].hand_grads.push_back({k, slot, first});
        it.plans[w].drops.push_back({k, slot});
        ++it.rows.per_worker[w].peer_grad;
      });
    } else {
      loc.clear_owner(k);
      if (all) {
        loc.set_partials(k, s.trainers(d), n);
      } else {
        listed_.clear();
        for (std::uint16_t w : s.trainers(d)) {
          if (it.models(w)) listed_.push_back(w);
        }
        loc.set_partials(k, listed_, n);
      }
    }
  });
}

}  // namespace ember::scheduler
