// LAIA's shared parts (allocation/laia.cc, allocation/two_level.cc): the room left per
// worker or host, each sample's candidates, and Algorithm 1's pick among them.
#pragma once

#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <utility>
#include <vector>

#include "../allocation.h"
#include "ember/common/process.h"
#include "ember/data/zipf.h"

namespace ember::scheduler::laia {

// Room left per worker (or host) and the r-th of those with room, in increasing order (a
// Fenwick tree over "has room"), so that a sample none of whose candidates has room
// draws among all with room in O(log W), as Algorithm 1's tie over all of them.
class Room {
 public:
  Room(std::vector<std::uint32_t> cap) : cap_(std::move(cap)), tree_(cap_.size() + 1, 0) {
    const auto n = static_cast<std::uint32_t>(cap_.size());
    for (std::uint32_t i = 1; i <= n; ++i) {
      tree_[i] += cap_[i - 1] > 0;
      with_room_ += cap_[i - 1] > 0;
      const std::uint32_t up = i + (i & (~i + 1));
      if (up <= n) tree_[up] += tree_[i];
    }
    top_ = n == 0 ? 0 : std::bit_floor(n);
  }
  bool has(std::uint32_t x) const { return cap_[x] > 0; }
  std::uint32_t with_room() const { return with_room_; }
  void take(std::uint32_t x) {
    if (--cap_[x] > 0) return;
    --with_room_;
    for (std::uint32_t i = x + 1; i < tree_.size(); i += i & (~i + 1)) --tree_[i];
  }
  // The r-th (from 0) with room.
  std::uint32_t nth(std::uint32_t r) const {
    std::uint32_t pos = 0;
    for (std::uint32_t step = top_; step > 0; step >>= 1) {
      if (pos + step < tree_.size() && tree_[pos + step] <= r) {
        pos += step;
        r -= tree_[pos];
      }
    }
    return pos;  // 0-based: the (pos + 1)-th entry
  }

 private:
  std::vector<std::uint32_t> cap_;
  std::vector<std::uint32_t> tree_;
  std::uint32_t with_room_ = 0, top_ = 0;
};

// Calls f(d) once for each distinct row of sample i in `tables` (in increasing order
// when multi-hot, where a repeated id is one row).
template <typename F>
inline void for_each_scored_row(const GlobalBatch& batch, const BatchRows& rows, const std::vector<std::uint32_t>& tables, std::uint32_t i,
                                F&& f) {
  if (!batch.multi_hot()) {
    const std::uint32_t* d = &rows.dpos[static_cast<std::size_t>(i) * batch.tables];
    for (std::uint32_t t : tables) f(d[t]);
    return;
  }
  if (tables.size() == batch.tables) {
    for (std::uint32_t d : rows.sample_rows(i)) f(d);
    return;
  }
  thread_local std::vector<std::uint32_t> ds;
  ds.clear();
  for (std::uint32_t t : tables) {
    for (std::uint32_t j = batch.bag_begin(i, t), e = batch.bag_end(i, t); j < e; ++j) ds.push_back(rows.dpos[j]);
  }
  std::sort(ds.begin(), ds.end());
  ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
  for (std::uint32_t d : ds) f(d);
}

// Sample i's candidates: the ids (id_of(owner)) holding its scored rows as latest, with
// their counts, in increasing id order. They start at the sample's first key position
// (a sample has no more candidates than keys).
template <typename IdOf>
inline void collect_candidates(const GlobalBatch& batch, const BatchRows& rows, const std::vector<std::uint32_t>& tables, std::uint32_t i,
                               IdOf&& id_of, LaiaScratch& x) {
  Candidate* c = x.candidates.data() + batch.sample_begin(i);
  std::uint32_t n = 0;
  for_each_scored_row(batch, rows, tables, i, [&](std::uint32_t d) {
    const std::uint16_t o = rows.owner_d[d];
    if (o == cache::LocationMap::kNoOwner) return;
    const auto id = static_cast<std::uint16_t>(id_of(o));
    std::uint32_t j = 0;
    while (j < n && c[j].id < id) ++j;
    if (j < n && c[j].id == id) {
      ++c[j].rows;
      return;
    }
    for (std::uint32_t m = n; m > j; --m) c[m] = c[m - 1];
    c[j] = {id, 1};
    ++n;
  });
  x.count[i] = static_cast<std::uint16_t>(n);
}

template <typename IdOf>
inline double score_samples(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows,
                            const std::vector<std::uint32_t>& tables, IdOf&& id_of, LaiaScratch& x) {
  const std::uint32_t n = batch.samples;
  x.candidates.resize(batch.keys.size());
  x.count.resize(n);
  Stopwatch sw;
  auto range = [&](std::uint32_t begin, std::uint32_t end) {
    for (std::uint32_t i = begin; i < end; ++i) collect_candidates(batch, rows, tables, i, id_of, x);
  };
  if (c.threads > 1) {
    tbb::parallel_for(tbb::blocked_range<std::uint32_t>(0, n, 64),
                      [&](const tbb::blocked_range<std::uint32_t>& r) { range(r.begin(), r.end()); });
  } else {
    range(0, n);
  }
  return sw.millis();
}

// Algorithm 1's choice for sample i: the candidate with the most rows among those with
// room; none with room (or none at all): any with room. Seeded random ties.
inline std::uint32_t pick(const LaiaScratch& x, const GlobalBatch& batch, std::uint32_t i, const Room& room, data::SplitMix64& rng,
                          std::vector<std::uint32_t>& ties) {
  const Candidate* c = x.candidates.data() + batch.sample_begin(i);
  int best = 0;
  ties.clear();
  for (std::uint32_t j = 0; j < x.count[i]; ++j) {
    if (!room.has(c[j].id)) continue;
    if (c[j].rows > best) {
      best = c[j].rows;
      ties.clear();
    }
    if (c[j].rows == best) ties.push_back(c[j].id);
  }
  if (ties.empty()) {
    const std::uint32_t r = room.with_room();
    return room.nth(r == 1 ? 0 : static_cast<std::uint32_t>(rng.below(r)));
  }
  return ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
}

}  // namespace ember::scheduler::laia
