// A deliberately plain model of docs/design.md's row-state contract (std::list / std::map,
// one step at a time, no shared code with the scheduler), to check the scheduler's
// counts and cache contents against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <set>
#include <vector>

#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/step_plan.h"

namespace ember::test {

class ReferenceModel {
 public:
  // The state of one worker's cached copy of a row (docs/design.md row states).
  enum CopyState { kClean, kDirty, kPartial };
  struct Copy {
    CopyState state;
    std::uint32_t version;
  };

  ReferenceModel(int workers, std::size_t capacity, bool on_demand, bool het = false, std::uint32_t staleness = 0)
      : W(workers), cap(capacity), on_demand(on_demand), het(het), S(staleness), lru(workers), cache(workers) {}

  // Peer sync (docs/design.md "The host hierarchy"): each worker's host. A row latest at
  // o goes from o to the trainers on o's host (peer_value each: no pull); o pushes a dirty
  // value only for a trainer on another host; a row trained within one host only is
  // applied by its first trainer (peer_grad per other trainer).
  void peer_sync(std::vector<int> host_of) { host = std::move(host_of); }

  // Lookahead eviction (docs/design.md "Lookahead"): `window` holds the batches after b
  // the scheduler sees. A full cache then evicts, among rows this worker does not train
  // now, the least recently used that neither b nor the window uses; if every one is
  // used, the one whose first use (b counting as the earliest) comes last, least
  // recently used first on ties.
  scheduler::TrafficCounts step(const scheduler::GlobalBatch& b, const std::vector<std::uint32_t>& worker_of,
                                const std::vector<scheduler::GlobalBatch>* window = nullptr) {
    scheduler::TrafficCounts c;
    auto first_use = [&](Key k) -> std::size_t {
      for (Key x : b.keys) {
        if (x == k) return 0;
      }
      for (std::size_t j = 0; window && j < window->size(); ++j) {
        for (Key x : (*window)[j].keys) {
          if (x == k) return j + 1;
        }
      }
      return SIZE_MAX;
    };
    // Distinct keys in batch order; per worker in micro-batch order; who trains what.
    std::vector<Key> order;
    std::map<Key, std::set<int>> users;
    std::vector<std::vector<Key>> kw(W);
    // A sample's keys: one per table, or its bags' ids (a repeated id is one row).
    for (std::uint32_t i = 0; i < b.samples; ++i) {
      for (std::uint32_t j = b.sample_begin(i); j < b.sample_begin(i + 1); ++j) {
        Key k = b.keys[j];
        if (!users.count(k)) order.push_back(k);
        users[k].insert(static_cast<int>(worker_of[i]));
      }
    }
    for (int w = 0; w < W; ++w) {
      for (std::uint32_t i = 0; i < b.samples; ++i) {
        if (static_cast<int>(worker_of[i]) != w) continue;
        for (std::uint32_t j = b.sample_begin(i); j < b.sample_begin(i + 1); ++j) {
          Key k = b.keys[j];
          if (std::find(kw[w].begin(), kw[w].end(), k) == kw[w].end()) kw[w].push_back(k);
        }
      }
    }
    // 1. Sync.
    std::set<std::pair<int, Key>> handed;  // (trainer, row) handed by a worker of its host
    if (on_demand) {
      for (Key k : order) {
        for (int w = 0; w < W; ++w) {
          auto it = cache[w].find(k);
          if (it != cache[w].end() && it->second.state == kPartial) {
            ++c.push_grad;
            erase(w, k);
          }
        }
        for (int o = 0; o < W; ++o) {
          auto it = cache[o].find(k);
          if (!host.empty() && it != cache[o].end() && it->second.state != kPartial) {
            // Peer sync: trainers on o's host take the row from o; o pushes a dirty value
            // only for a trainer on another host, and lets go of a row it does not train.
            bool across = false, trains = false;
            std::vector<int> same;
            for (int u : users[k]) {
              if (u == o) {
                trains = true;
              } else if (host[u] == host[o]) {
                same.push_back(u);
              } else {
                across = true;
              }
            }
            if (across && it->second.state == kDirty) {
              ++c.push_value;
              it->second.state = kClean;
            }
            for (int u : same) {
              handed.insert({u, k});
              ++c.peer_value;
            }
            if (!same.empty() && !trains) erase(o, k);
            continue;
          }
          if (it == cache[o].end() || it->second.state != kDirty) continue;
          bool other = false;
          for (int u : users[k]) other |= u != o;
          if (other) {
            ++c.push_value;
            it->second.state = kClean;
          }
        }
      }
    }
    // 2. Pulls: hits refreshed first, then misses in order.
    for (int w = 0; w < W; ++w) {
      std::vector<Key> miss;
      for (Key k : kw[w]) {
        auto it = cache[w].find(k);
        bool hit = it != cache[w].end() && (het ? psv[k] - it->second.version <= S : it->second.state != kPartial);
        if (hit) {
          touch(w, k);
          ++c.hits;
        } else {
          miss.push_back(k);
        }
      }
      for (Key k : miss) {
        if (!handed.count({w, k})) ++c.pulls;
        if (cache[w].count(k)) {  // het: stale copy refreshed in place
          touch(w, k);
          cache[w][k].version = psv[k];
          continue;
        }
        if (cache[w].size() == cap) {
          Key e = lru[w].front();
          if (window) {
            std::size_t latest = 0;
            bool found = false;
            for (Key x : lru[w]) {
              if (std::find(kw[w].begin(), kw[w].end(), x) != kw[w].end()) continue;
              std::size_t f = first_use(x);
              if (f == SIZE_MAX) {
                e = x;
                break;
              }
              if (!found || f > latest) {
                e = x;
                latest = f;
                found = true;
              }
            }
          }
          CopyState st = cache[w][e].state;
          if (!het && (st == kDirty || st == kPartial)) ++c.push_evict;
          erase(w, e);
        }
        lru[w].push_back(k);
        cache[w][k] = {kClean, psv[k]};
      }
    }
    // 3. Train.
    for (Key k : order) {
      const std::set<int>& u = users[k];
      if (het) {
        ++psv[k];
        c.push_grad += u.size();
        if (u.size() == 1) cache[*u.begin()][k].version = psv[k];
        for (int h = 0; h < W; ++h) {
          auto it = cache[h].find(k);
          if (it != cache[h].end() && psv[k] - it->second.version > S) erase(h, k);
        }
        continue;
      }
      for (int w = 0; w < W; ++w) {
        if (!u.count(w) && cache[w].count(k)) erase(w, k);  // stale now
      }
      bool one_host = !host.empty() && u.size() > 1;
      for (int w : u) one_host = one_host && host[w] == host[*u.begin()];
      if (on_demand && one_host) {
        // Peer sync: the first trainer applies the host's sum; the others hand it theirs.
        cache[*u.begin()][k].state = kDirty;
        for (int w : u) {
          if (w == *u.begin()) continue;
          erase(w, k);
          ++c.peer_grad;
        }
      } else if (on_demand) {
        for (int w : u) cache[w][k].state = u.size() == 1 ? kDirty : kPartial;
      } else {
        c.push_grad += u.size();
        for (int w : u) {
          if (u.size() == 1) {
            cache[w][k].state = kClean;
          } else {
            erase(w, k);
          }
        }
      }
    }
    return c;
  }

  std::vector<Key> lru_order(int w) const { return {lru[w].begin(), lru[w].end()}; }
  const std::map<Key, Copy>& copies(int w) const { return cache[w]; }

 private:
  void touch(int w, Key k) {
    lru[w].remove(k);
    lru[w].push_back(k);
  }
  void erase(int w, Key k) {
    lru[w].remove(k);
    cache[w].erase(k);
  }

  int W;
  std::size_t cap;
  bool on_demand, het;
  std::uint32_t S;
  std::vector<std::list<Key>> lru;
  std::vector<std::map<Key, Copy>> cache;
  std::map<Key, std::uint32_t> psv;
  std::vector<int> host;  // peer sync: each worker's host (empty: off)
};

}  // namespace ember::test
