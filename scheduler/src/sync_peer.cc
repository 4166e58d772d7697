// Peer sync (--peer-sync; Herald's Appendix B within a host, docs/design.md "The host
// hierarchy"): on-demand sync in which a row's latest holder hands the row (value and
// state) to the workers of its host that train it, instead of their pulling it from the
// PS, and a row trained by several workers all on one host is applied there by its first
// trainer, which receives the others' gradients. No new state: a row still has at most
// one latest holder, or partial holders, or neither.
#include "sync_on_demand.h"

namespace ember::scheduler {

bool host_applied(const Iteration& it, std::uint32_t d) {
  if (!it.config.peer_sync || it.rows.count(d) < 2) return false;
  const std::uint32_t h = it.config.host_of[it.rows.first(d)];
  for (std::uint16_t w : it.rows.trainers(d)) {
    if (it.config.host_of[w] != h) return false;
  }
  return true;
}

void PeerSync::sync(Iteration& it) {
  it.rows.peer_d.assign(it.rows.size(), cache::LocationMap::kNoOwner);
  sync_rows(it, [&](std::uint32_t d, std::uint32_t o) { hand_over(it, d, o); });
}

void PeerSync::hand_over(Iteration& it, std::uint32_t d, std::uint32_t o) {
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

void PeerSync::train(Iteration& it) {
  BatchRows& s = it.rows;
  train_cached_rows(it, true, [&](std::uint32_t d) {
    const Key k = s.keys[d];
    if (s.count(d) == 1) {
      it.loc.set_owner(k, s.first(d), true);
    } else if (host_applied(it, d)) {
      // The host's first trainer applies the sum and holds the row dirty; the others
      // hand it their gradients and let their copies go.
      const std::uint32_t first = s.first(d);
      it.loc.set_owner(k, first, true);
      s.for_each_trainer(d, [&](std::uint32_t w, std::uint32_t slot) {
        if (w == first || !it.models(w)) return;
        it.cache(w).erase(k);
        it.plans[w].hand_grads.push_back({k, slot, first});
        it.plans[w].drops.push_back({k, slot});
        ++s.per_worker[w].peer_grad;
      });
    } else {
      keep_partials(it, d);
    }
  });
}

}  // namespace ember::scheduler
