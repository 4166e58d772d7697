// A straightforward implementation of Herald's Algorithm 1 "as printed" plus the
// contract's state update, for `ember-bench sched` to compare against: every sample is
// scored against every worker's cache (one lookup per sample x worker x table), caches
// are node-based (std::unordered_map + std::list). It makes the same decisions as the
// Scheduler (same tie-breaking stream), so the benchmark also checks both agree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "ember/common/hash.h"
#include "ember/data/zipf.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/step_plan.h"

namespace ember::bench {

class NaiveHeraldScheduler {
 public:
  NaiveHeraldScheduler(std::uint32_t workers, std::uint32_t batch_per_worker, std::size_t capacity, std::uint64_t seed)
      : W_(workers), B_(batch_per_worker), cap_(capacity), seed_(seed), caches_(workers) {}

  scheduler::TrafficCounts schedule(const scheduler::GlobalBatch& b) {
    scheduler::TrafficCounts c;
    const std::vector<std::vector<Key>> rows = distinct_rows(b);
    const std::vector<std::uint32_t> worker_of = assign_samples(rows);
    const Training tr = who_trains_what(rows, worker_of);
    sync_on_demand(tr, c);
    pull_rows(tr, c);
    train(tr);
    ++iteration_;
    return c;
  }

 private:
  enum State { kClean, kDirty, kPartial };
  struct Entry {
    std::list<Key>::iterator pos;
    State state;
  };
  struct Cache {
    std::list<Key> lru;
    std::unordered_map<Key, Entry> map;
    void erase(Key k) {
      auto it = map.find(k);
      lru.erase(it->second.pos);
      map.erase(it);
    }
  };
  // Who trains what in a batch.
  struct Training {
    // Per row, a flag per worker that trains it (any number of workers).
    std::unordered_map<Key, std::vector<std::uint8_t>> users;
    std::vector<Key> order;            // the rows in order of first appearance
    std::vector<std::vector<Key>> kw;  // each worker's rows in micro-batch order
  };

  // Each sample's distinct keys in order of first appearance (one-hot: its T keys;
  // bags: an id repeated in them once).
  static std::vector<std::vector<Key>> distinct_rows(const scheduler::GlobalBatch& b) {
    const std::uint32_t n = b.samples;
    std::vector<std::vector<Key>> rows(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      for (std::uint32_t j = b.sample_begin(i); j < b.sample_begin(i + 1); ++j) {
        if (std::find(rows[i].begin(), rows[i].end(), b.keys[j]) == rows[i].end()) rows[i].push_back(b.keys[j]);
      }
    }
    return rows;
  }

  // Algorithm 1: score every sample against every worker's cache; each sample's worker.
  std::vector<std::uint32_t> assign_samples(const std::vector<std::vector<Key>>& rows) const {
    const auto n = static_cast<std::uint32_t>(rows.size());
    std::vector<std::uint32_t> worker_of(n), room(W_, B_), ties;
    data::SplitMix64 rng(mix64(seed_ ^ mix64(iteration_ * 131 + 0 + 0x1a1a)));
    for (std::uint32_t i = 0; i < n; ++i) {
      int best = -1;
      ties.clear();
      for (std::uint32_t w = 0; w < W_; ++w) {
        if (room[w] == 0) continue;
        int score = 0;
        for (Key k : rows[i]) {
          auto it = caches_[w].map.find(k);
          if (it != caches_[w].map.end() && it->second.state != kPartial) ++score;
        }
        if (score > best) {
          best = score;
          ties.clear();
        }
        if (score == best) ties.push_back(w);
      }
      std::uint32_t w = ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
      worker_of[i] = w;
      --room[w];
    }
    return worker_of;
  }

  // Who trains what; each worker's rows in micro-batch order.
  Training who_trains_what(const std::vector<std::vector<Key>>& rows, const std::vector<std::uint32_t>& worker_of) const {
    const auto n = static_cast<std::uint32_t>(rows.size());
    Training tr;
    tr.kw.resize(W_);
    for (std::uint32_t i = 0; i < n; ++i) {
      for (Key k : rows[i]) {
        auto [it, fresh] = tr.users.try_emplace(k);
        if (fresh) {
          tr.order.push_back(k);
          it->second.assign(W_, 0);
        }
        it->second[worker_of[i]] = 1;
      }
    }
    for (std::uint32_t w = 0; w < W_; ++w) {
      std::unordered_map<Key, bool> seen;
      for (std::uint32_t i = 0; i < n; ++i) {
        if (worker_of[i] != w) continue;
        for (Key k : rows[i]) {
          if (seen.emplace(k, true).second) tr.kw[w].push_back(k);
        }
      }
    }
    return tr;
  }

  // Sync on demand.
  void sync_on_demand(const Training& tr, scheduler::TrafficCounts& c) {
    for (Key k : tr.order) {
      const std::vector<std::uint8_t>& u = tr.users.at(k);
      const auto trainers = static_cast<std::uint32_t>(std::count(u.begin(), u.end(), 1));
      for (std::uint32_t w = 0; w < W_; ++w) {
        auto it = caches_[w].map.find(k);
        if (it == caches_[w].map.end()) continue;
        if (it->second.state == kPartial) {
          ++c.push_grad;
          caches_[w].erase(k);
        } else if (it->second.state == kDirty && trainers > u[w]) {
          ++c.push_value;
          it->second.state = kClean;
        }
      }
    }
  }

  // Pulls: hits first, then misses.
  void pull_rows(const Training& tr, scheduler::TrafficCounts& c) {
    for (std::uint32_t w = 0; w < W_; ++w) {
      Cache& cw = caches_[w];
      std::vector<Key> miss;
      for (Key k : tr.kw[w]) {
        auto it = cw.map.find(k);
        if (it != cw.map.end()) {
          cw.lru.splice(cw.lru.end(), cw.lru, it->second.pos);
          ++c.hits;
        } else {
          miss.push_back(k);
        }
      }
      for (Key k : miss) {
        ++c.pulls;
        if (cw.map.size() == cap_) {
          Key e = cw.lru.front();
          if (cw.map[e].state != kClean) ++c.push_evict;
          cw.erase(e);
        }
        cw.lru.push_back(k);
        cw.map[k] = {std::prev(cw.lru.end()), kClean};
      }
    }
  }

  // Train.
  void train(const Training& tr) {
    for (Key k : tr.order) {
      const std::vector<std::uint8_t>& u = tr.users.at(k);
      const auto trainers = std::count(u.begin(), u.end(), 1);
      for (std::uint32_t w = 0; w < W_; ++w) {
        const bool trains = u[w] != 0;
        auto it = caches_[w].map.find(k);
        if (it == caches_[w].map.end()) continue;
        if (!trains) {
          caches_[w].erase(k);
        } else {
          it->second.state = trainers == 1 ? kDirty : kPartial;
        }
      }
    }
  }

  std::uint32_t W_, B_;
  std::size_t cap_;
  std::uint64_t seed_;
  std::uint64_t iteration_ = 0;
  std::vector<Cache> caches_;
};

}  // namespace ember::bench
