// On-demand sync (plan, herald, brute; Herald's Algorithm 2): before the pulls, the
// partial holders of a row someone trains push their gradients and a dirty owner pushes
// its value if another worker trains the row; the pull of the latest-copy modes; after
// training, a sole trainer holds the latest (dirty) copy and several trainers a partial
// gradient each, pushed only when the row is next needed (or evicted, or flushed).
#include "sync_on_demand.h"

namespace ember::scheduler {

void OnDemandSync::sync(Iteration& it) {
  sync_rows(it, [&](std::uint32_t d, std::uint32_t o) {
    if (it.loc.dirty(it.rows.keys[d])) push_value(it, d, o);
  });
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

void OnDemandSync::pull(Iteration& it, std::uint32_t w) { pull_latest(it, w); }

void OnDemandSync::keep_partials(Iteration& it, std::uint32_t d) {
  const BatchRows& s = it.rows;
  const Key k = s.keys[d];
  it.loc.clear_owner(k);
  if (it.config.model_host < 0) {
    it.loc.set_partials(k, s.trainers(d), s.count(d));
    return;
  }
  listed_.clear();
  for (std::uint16_t w : s.trainers(d)) {
    if (it.models(w)) listed_.push_back(w);
  }
  it.loc.set_partials(k, listed_, s.count(d));
}

void OnDemandSync::train(Iteration& it) {
  const BatchRows& s = it.rows;
  train_cached_rows(it, true, [&](std::uint32_t d) {
    if (s.count(d) == 1) {
      it.loc.set_owner(s.keys[d], s.first(d), true);
    } else {
      keep_partials(it, d);
    }
  });
}

}  // namespace ember::scheduler
