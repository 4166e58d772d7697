#include "host/host_plans.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"

namespace ember::worker {

using scheduler::EvictKind;
using scheduler::StepPlan;

std::uint64_t HandOffs::sent() const {
  std::uint64_t n = 0;
  for (const auto& s : send) n += s.size();
  return n;
}

std::uint64_t HandOffs::received() const {
  std::uint64_t n = 0;
  for (const auto& r : recv) n += r.size();
  return n;
}

namespace {

// A row of one worker's list: `cls` keeps apart rows that must not be merged (a prefetch
// and a pull at the commit), its bit kState says a pull wants the row's state (merged
// pulls carry it if any of them does).
struct Item {
  Key key;
  std::uint32_t local;  // local rank of the worker whose list holds it
  std::uint32_t pos;    // its position there
  std::uint32_t cls;
};

constexpr std::uint32_t kState = 1;
enum class Flow { kToFirst, kFromFirst };  // gradients gather at the first; pulled rows leave it

// The hand-offs over one list per worker of the host (`lists[local]`, keys and
// classes). A row in two or more lists, of one class, whose shard is on another host, is
// moved by the first of them (lowest local rank). Gradients (`parts`, with kToFirst) are
// summed only where the phase holds all of the host's parts of the row (HostParts).
HandOffs hand_offs(const HostGroup& g, const std::vector<std::vector<std::pair<Key, std::uint32_t>>>& lists, Flow flow,
                   scheduler::HostParts* parts) {
  const auto m = static_cast<std::uint32_t>(g.ranks.size());
  HandOffs h;
  std::vector<Item> items;
  for (std::uint32_t l = 0; l < m; ++l) {
    const auto& list = lists[l];
    for (std::uint32_t i = 0; i < list.size(); ++i)
      if (g.across(list[i].first)) items.push_back({list[i].first, l, i, list[i].second});
  }
  // By key, then local rank: each group's first item is its first worker's. The same
  // order on every worker of the host, whatever its own lists.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return std::tie(a.key, a.local) < std::tie(b.key, b.local); });
  h.send.resize(m);
  h.recv.resize(m);
  const std::size_t mine = lists[g.me].size();
  for (std::size_t i = 0; i < items.size();) {
    std::size_t j = i + 1;
    bool one_class = true;
    std::uint32_t state = items[i].cls & kState;
    for (; j < items.size() && items[j].key == items[i].key; ++j) {
      one_class &= (items[j].cls & ~kState) == (items[i].cls & ~kState);
      state |= items[j].cls & kState;
    }
    const bool whole = parts == nullptr || parts->take(items[i].key, static_cast<std::uint32_t>(j - i));
    if (j - i >= 2 && one_class && whole) {
      if (h.share.empty()) h.share.assign(mine, 1);
      h.any = true;
      const Item& first = items[i];
      if (flow == Flow::kFromFirst) {
        if (h.state.empty()) {
          h.state.resize(mine);
          for (std::uint32_t p = 0; p < mine; ++p) h.state[p] = static_cast<std::uint8_t>(lists[g.me][p].second & kState);
        }
        for (std::size_t k = i; k < j; ++k)
          if (items[k].local == g.me) h.state[items[k].pos] = static_cast<std::uint8_t>(state);
      }
      if (first.local == g.me && flow == Flow::kToFirst) h.share[first.pos] = static_cast<std::uint32_t>(j - i);
      for (std::size_t k = i + 1; k < j; ++k) {
        const Item& other = items[k];
        if (flow == Flow::kToFirst) {
          if (other.local == g.me) h.send[first.local].push_back(other.pos), h.share[other.pos] = 0;
          if (first.local == g.me) h.recv[other.local].push_back(first.pos);
        } else {
          if (first.local == g.me) h.send[other.local].push_back(first.pos);
          if (other.local == g.me) h.recv[first.local].push_back(other.pos), h.share[other.pos] = 0;
        }
      }
    }
    i = j;
  }
  return h;
}

template <typename List>
HandOffs over(const HostGroup& g, const std::vector<StepPlan>& plans, Flow flow, scheduler::HostParts* parts, List&& list) {
  std::vector<std::vector<std::pair<Key, std::uint32_t>>> lists(g.ranks.size());
  for (std::size_t l = 0; l < g.ranks.size(); ++l) list(plans[g.ranks[l]], lists[l]);
  return hand_offs(g, lists, flow, parts);
}

void grads_of(const std::vector<scheduler::KeySlot>& rows, std::vector<std::pair<Key, std::uint32_t>>& out) {
  for (const auto& r : rows) out.emplace_back(r.key, 0);
}

// Peer sync's: what worker g.me hands over (`given`: its hand_values or hand_grads, to
// their `to`'s local ranks) and what is handed to it (positions in `taker_list` of the
// keys the others hand it, in each giver's order).
template <typename Given, typename TakerList>
HandOffs peer_hand_offs(const HostGroup& g, const std::vector<StepPlan>& plans, Given&& given, TakerList&& taker_list) {
  const auto m = static_cast<std::uint32_t>(g.ranks.size());
  HandOffs h;
  h.send.resize(m);
  h.recv.resize(m);
  const auto local_of = [&](WorkerId r) {
    return static_cast<std::uint32_t>(std::find(g.ranks.begin(), g.ranks.end(), r) - g.ranks.begin());
  };
  const StepPlan& mine = plans[g.ranks[g.me]];
  const std::vector<scheduler::HandValue>& out = given(mine);
  for (std::uint32_t i = 0; i < out.size(); ++i) {
    const std::uint32_t to = local_of(out[i].to);
    if (to == m) throw Error("peer sync hands row " + std::to_string(out[i].key) + " to another host's worker");
    h.send[to].push_back(i);
  }
  const U64Map<std::uint32_t> at = taker_list(mine);  // key -> position
  for (std::uint32_t j = 0; j < m; ++j) {
    if (j == g.me) continue;
    for (const auto& v : given(plans[g.ranks[j]])) {
      if (v.to != g.ranks[g.me]) continue;
      const std::uint32_t* i = at.find(v.key);
      if (i == nullptr) {
        throw Error("peer sync: worker " + std::to_string(g.ranks[j]) + " hands row " + std::to_string(v.key) +
                    " to a worker that does not take it");
      }
      h.recv[j].push_back(*i);
    }
  }
  h.any = h.sent() + h.received() > 0;
  return h;
}

}  // namespace

HostPlans host_plans(const HostGroup& g, const std::vector<StepPlan>& plans, scheduler::HostParts& parts) {
  HostPlans h;
  if (!g.active()) return h;
  if (g.peer) {
    h.peer = peer_hand_offs(
        g, plans, [](const StepPlan& p) -> const auto& { return p.hand_values; },
        [](const StepPlan& p) {
          U64Map<std::uint32_t> at;  // the peer pulls
          for (std::uint32_t i = 0; i < p.pulls.size(); ++i)
            if (p.pulls[i].peer) at.try_emplace(p.pulls[i].key, i);
          return at;
        });
    h.apply = peer_hand_offs(
        g, plans, [](const StepPlan& p) -> const auto& { return p.hand_grads; },
        [](const StepPlan& p) {
          U64Map<std::uint32_t> at;  // the rows applied in the host
          for (std::uint32_t i = 0; i < p.rows.size(); ++i)
            if (p.rows[i].host == scheduler::HostApply::kApplies) at.try_emplace(p.rows[i].key, i);
          return at;
        });
  }
  if (!g.aggregate) return h;
  // Parts of earlier iterations first (sync, evictions), then this one's (end pushes).
  h.sync = over(g, plans, Flow::kToFirst, &parts, [](const StepPlan& p, auto& out) { grads_of(p.push_grads, out); });
  h.evict = over(g, plans, Flow::kToFirst, &parts, [](const StepPlan& p, auto& out) {
    for (const auto& e : p.pulls)
      if (e.kind == EvictKind::kPartial) out.emplace_back(e.evicted, 0);
  });
  h.pull = over(g, plans, Flow::kFromFirst, nullptr, [](const StepPlan& p, auto& out) {
    for (const auto& e : p.pulls) out.emplace_back(e.key, (e.with_state ? kState : 0u) | (e.prefetch ? 2u : 0u));
  });
  std::vector<const StepPlan*> mine;
  for (WorkerId r : g.ranks) mine.push_back(&plans[r]);
  parts.trained(mine, g.across);
  h.end = over(g, plans, Flow::kToFirst, &parts, [](const StepPlan& p, auto& out) { grads_of(p.end_pushes, out); });
  return h;
}

HandOffs host_flush(const HostGroup& g, const std::vector<StepPlan>& plans, scheduler::HostParts& parts) {
  if (!g.active() || !g.aggregate) return {};
  return over(g, plans, Flow::kToFirst, &parts, [](const StepPlan& p, auto& out) { grads_of(p.push_grads, out); });
}

}  // namespace ember::worker
