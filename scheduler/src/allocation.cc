#include "allocation.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "bits.h"
#include "ember/common/hash.h"
#include "ember/common/process.h"
#include "ember/data/zipf.h"

namespace ember::scheduler {

void allocate_random(const SchedulerConfig& c, std::uint64_t iteration, std::uint32_t n, std::vector<std::uint32_t>& worker_of) {
  // Balanced random partition from (seed, iteration): identical in every process.
  data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration + 0x51ed)));
  std::vector<std::uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  for (std::uint32_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  for (std::uint32_t j = 0; j < n; ++j) worker_of[perm[j]] = j / c.batch_per_worker;
}

LaiaStats allocate_laia(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                        const std::vector<std::uint32_t>& tables, std::vector<std::uint16_t>& scores,
                        std::vector<std::uint32_t>& worker_of) {
  const std::uint32_t n = batch.samples, W = c.workers, T = batch.tables;
  scores.assign(static_cast<std::size_t>(n) * W, 0);
  Stopwatch sw;
  auto score_range = [&](std::uint32_t begin, std::uint32_t end) {
    for (std::uint32_t i = begin; i < end; ++i) {
      std::uint16_t* s = &scores[static_cast<std::size_t>(i) * W];
      const std::uint32_t* d = &rows.dpos[static_cast<std::size_t>(i) * T];
      for (std::uint32_t t : tables) {
        std::uint8_t o = rows.owner_d[d[t]];
        if (o != cache::LocationMap::kNoOwner) ++s[o];
      }
    }
  };
  if (c.threads > 1) {
    tbb::parallel_for(tbb::blocked_range<std::uint32_t>(0, n, 64),
                      [&](const tbb::blocked_range<std::uint32_t>& r) { score_range(r.begin(), r.end()); });
  } else {
    score_range(0, n);
  }
  LaiaStats st{sw.millis(), static_cast<std::uint32_t>(tables.size())};
  // Algorithm 1: each sample, in batch order, to the highest-scoring worker with room;
  // seeded random ties. Partitions (if any) are allocated independently and in parallel.
  const std::uint32_t P = c.partitions, per = n / P, cap0 = c.batch_per_worker / P;
  auto allocate_part = [&](std::uint32_t p) {
    data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration * 131 + p + 0x1a1a)));
    std::vector<std::uint32_t> cap(W, cap0), ties;
    ties.reserve(W);
    const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint16_t* s = &scores[static_cast<std::size_t>(i) * W];
      int best = -1;
      ties.clear();
      for (std::uint32_t w = 0; w < W; ++w) {
        if (cap[w] == 0) continue;
        if (s[w] > best) {
          best = s[w];
          ties.clear();
        }
        if (s[w] == best) ties.push_back(w);
      }
      std::uint32_t w = ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
      worker_of[i] = w;
      --cap[w];
    }
  };
  if (P > 1 && c.threads > 1) {
    tbb::parallel_for(0u, P, allocate_part);
  } else {
    for (std::uint32_t p = 0; p < P; ++p) allocate_part(p);
  }
  return st;
}

LaiaStats allocate_laia_by_host(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& batch, const BatchRows& rows,
                                const std::vector<std::uint32_t>& tables, std::vector<std::uint16_t>& scores,
                                std::vector<std::uint32_t>& worker_of) {
  const std::uint32_t n = batch.samples, T = batch.tables;
  const std::vector<std::uint32_t>& host_of = c.host_of;
  const std::uint32_t H = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<std::vector<std::uint32_t>> members(H);
  std::vector<std::uint32_t> local(c.workers);
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    local[w] = static_cast<std::uint32_t>(members[host_of[w]].size());
    members[host_of[w]].push_back(w);
  }
  Stopwatch sw;
  // Level 1: a sample's score for a host is the rows of it the host's workers hold as
  // latest, summed.
  scores.assign(static_cast<std::size_t>(n) * H, 0);
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint16_t* s = &scores[static_cast<std::size_t>(i) * H];
    const std::uint32_t* d = &rows.dpos[static_cast<std::size_t>(i) * T];
    for (std::uint32_t t : tables) {
      const std::uint8_t o = rows.owner_d[d[t]];
      if (o != cache::LocationMap::kNoOwner) ++s[host_of[o]];
    }
  }
  LaiaStats st{sw.millis(), static_cast<std::uint32_t>(tables.size())};
  // Algorithm 1 twice, per partition: each sample to the best host with room (room: its
  // workers' micro-batches), then within each host, its samples in batch order to the
  // best of its workers with room. Seeded random ties at both levels.
  const std::uint32_t P = c.partitions, per = n / P, cap0 = c.batch_per_worker / P;
  std::vector<std::uint32_t> ties, host_cap(H), cap(c.workers), host_pick(n);
  std::vector<std::uint16_t> local_score;
  for (std::uint32_t p = 0; p < P; ++p) {
    data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration * 131 + p + 0x2b2b)));
    for (std::uint32_t h = 0; h < H; ++h) host_cap[h] = cap0 * static_cast<std::uint32_t>(members[h].size());
    std::fill(cap.begin(), cap.end(), cap0);
    const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
    const auto best_of = [&](const std::uint16_t* s, const auto& room, std::uint32_t count) {
      int best = -1;
      ties.clear();
      for (std::uint32_t x = 0; x < count; ++x) {
        if (!room(x)) continue;
        if (s[x] > best) {
          best = s[x];
          ties.clear();
        }
        if (s[x] == best) ties.push_back(x);
      }
      return ties.size() == 1 ? ties[0] : ties[rng.below(ties.size())];
    };
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t h = best_of(
          &scores[static_cast<std::size_t>(i) * H], [&](std::uint32_t x) { return host_cap[x] > 0; }, H);
      host_pick[i] = h;
      --host_cap[h];
    }
    // Level 2: the rows of the sample each of the host's workers holds as latest.
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::uint32_t h = host_pick[i];
      const auto& ws = members[h];
      local_score.assign(ws.size(), 0);
      const std::uint32_t* d = &rows.dpos[static_cast<std::size_t>(i) * T];
      for (std::uint32_t t : tables) {
        const std::uint8_t o = rows.owner_d[d[t]];
        if (o != cache::LocationMap::kNoOwner && host_of[o] == h) ++local_score[local[o]];
      }
      const std::uint32_t l = best_of(
          local_score.data(), [&](std::uint32_t x) { return cap[ws[x]] > 0; }, static_cast<std::uint32_t>(ws.size()));
      worker_of[i] = ws[l];
      --cap[ws[l]];
    }
  }
  return st;
}

namespace {

// The refinement's bookkeeping: each row's trainers and samples per (row, worker), the
// batch's cost of a row in hundredths of a row, and the change of moving a sample.
class SwapRefiner {
 public:
  SwapRefiner(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows, const cache::LocationMap& loc,
              std::vector<std::uint32_t>& worker_of)
      : rows_(rows),
        worker_of_(worker_of),
        W_(c.workers),
        T_(batch.tables),
        on_demand_(c.policy.sync() == Sync::kOnDemand),
        owner_bit_(rows.size(), 0),
        dirty_(rows.size(), 0),
        count_(static_cast<std::size_t>(rows.size()) * c.workers, 0),
        trainers_(rows.size(), 0) {
    for (std::uint32_t d = 0; d < rows.size(); ++d) {
      const std::uint8_t o = rows.owner_d[d];
      if (o == cache::LocationMap::kNoOwner) continue;
      owner_bit_[d] = bit(o);
      dirty_[d] = on_demand_ && loc.dirty(rows.keys[d]);
    }
    // Samples per (row, worker), and each row's trainers.
    for (std::uint32_t i = 0; i < batch.samples; ++i) {
      const std::uint32_t* dp = &rows.dpos[static_cast<std::size_t>(i) * T_];
      for (std::uint32_t t = 0; t < T_; ++t) {
        ++count_[static_cast<std::size_t>(dp[t]) * W_ + worker_of[i]];
        trainers_[dp[t]] |= bit(worker_of[i]);
      }
    }
  }

  // The change in cost if sample i moves from worker a to b.
  std::int64_t move_delta(std::uint32_t i, std::uint32_t a, std::uint32_t b) const {
    std::int64_t delta = 0;
    const std::uint32_t* dp = &rows_.dpos[static_cast<std::size_t>(i) * T_];
    for (std::uint32_t t = 0; t < T_; ++t) {
      const std::uint32_t d = dp[t];
      const std::uint64_t U = trainers_[d];
      std::uint64_t U2 = U | bit(b);
      if (count_[static_cast<std::size_t>(d) * W_ + a] == 1) U2 &= ~bit(a);
      if (U2 != U) delta += cost(d, U2) - cost(d, U);
    }
    return delta;
  }

  void move(std::uint32_t i, std::uint32_t a, std::uint32_t b) {
    const std::uint32_t* dp = &rows_.dpos[static_cast<std::size_t>(i) * T_];
    for (std::uint32_t t = 0; t < T_; ++t) {
      const std::uint32_t d = dp[t];
      if (--count_[static_cast<std::size_t>(d) * W_ + a] == 0) trainers_[d] &= ~bit(a);
      ++count_[static_cast<std::size_t>(d) * W_ + b];
      trainers_[d] |= bit(b);
    }
    worker_of_[i] = b;
  }

  // Swaps between workers a and b (their samples: sa, sb): the samples of a ranked by
  // the change of moving them to b, those of b by moving to a. In that order, each
  // sample i of a is swapped with the first of the next few unswapped samples j of b
  // whose predicted sum is negative and whose exact change (after i moves) is too.
  // Whether any swap was made.
  bool swap_pair(std::uint32_t a, std::uint32_t b, const std::vector<std::uint32_t>& sa, const std::vector<std::uint32_t>& sb) {
    constexpr std::size_t kTries = 4;
    ra_.clear();
    rb_.clear();
    for (std::uint32_t i : sa) ra_.emplace_back(move_delta(i, a, b), i);
    for (std::uint32_t j : sb) rb_.emplace_back(move_delta(j, b, a), j);
    std::sort(ra_.begin(), ra_.end());
    std::sort(rb_.begin(), rb_.end());
    taken_.assign(rb_.size(), 0);
    std::size_t first = 0;  // the first untaken sample of b
    bool moved = false;
    for (const auto& [predicted, i] : ra_) {
      while (first < rb_.size() && taken_[first]) ++first;
      if (first == rb_.size() || predicted + rb_[first].first >= 0) break;
      const std::int64_t di = move_delta(i, a, b);
      move(i, a, b);
      bool done = false;
      for (std::size_t k = first, tried = 0; k < rb_.size() && tried < kTries && predicted + rb_[k].first < 0; ++k) {
        if (taken_[k]) continue;
        ++tried;
        const std::uint32_t j = rb_[k].second;
        if (di + move_delta(j, b, a) < 0) {
          move(j, b, a);
          taken_[k] = 1;
          done = true;
          break;
        }
      }
      if (done) {
        moved = true;
      } else {
        move(i, b, a);
      }
    }
    return moved;
  }

 private:
  // The batch's cost of a row trained by the workers U, in hundredths of a row: a pull
  // for each trainer but its latest holder o; on demand, o's value push when another
  // trains it (o dirty), and half a row per trainer of a shared row (its partial
  // gradients are pushed, and it pulled by every trainer, when it is next used);
  // full-set, a gradient push per trainer.
  std::int64_t cost(std::uint32_t d, std::uint64_t U) const {
    constexpr std::int64_t kRow = 100, kShared = 50;
    const std::uint64_t others = U & ~owner_bit_[d];
    const int m = popcount64(U);
    std::int64_t c = kRow * popcount64(others);
    if (!on_demand_) return c + kRow * m;
    if (dirty_[d] && others != 0) c += kRow;
    if (m > 1) c += kShared * m;
    return c;
  }

  const BatchRows& rows_;
  std::vector<std::uint32_t>& worker_of_;
  const std::uint32_t W_, T_;
  const bool on_demand_;
  std::vector<std::uint64_t> owner_bit_;
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint32_t> count_;
  std::vector<std::uint64_t> trainers_;
  std::vector<std::pair<std::int64_t, std::uint32_t>> ra_, rb_;
  std::vector<std::uint8_t> taken_;
};

}  // namespace

void refine_allocation(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows, const cache::LocationMap& loc,
                       std::vector<std::uint32_t>& worker_of) {
  // At most kPasses passes over every pair of workers (a, b) of every partition; fewer
  // when a pass swaps nothing.
  constexpr int kPasses = 3;
  const std::uint32_t n = batch.samples, W = c.workers, P = c.partitions, per = n / P;
  SwapRefiner refiner(c, batch, rows, loc, worker_of);
  std::vector<std::vector<std::uint32_t>> members(W);
  for (int pass = 0; pass < kPasses; ++pass) {
    bool swapped = false;
    for (std::uint32_t p = 0; p < P; ++p) {
      const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
      for (auto& m : members) m.clear();
      for (std::uint32_t i = begin; i < end; ++i) members[worker_of[i]].push_back(i);
      for (std::uint32_t a = 0; a < W; ++a) {
        for (std::uint32_t b = a + 1; b < W; ++b) {
          // Allocated by host: swaps within a host keep each host's samples.
          if (c.host_allocation && c.host_of[a] != c.host_of[b]) continue;
          if (!refiner.swap_pair(a, b, members[a], members[b])) continue;
          swapped = true;
          members[a].clear();
          members[b].clear();
          for (std::uint32_t i = begin; i < end; ++i) {
            if (worker_of[i] == a || worker_of[i] == b) members[worker_of[i]].push_back(i);
          }
        }
      }
    }
    if (!swapped) break;
  }
}

void allocate_brute(std::uint32_t workers, const std::function<std::uint64_t(const std::vector<std::uint32_t>&)>& cost,
                    std::vector<std::uint32_t>& worker_of) {
  std::vector<std::uint32_t> perm(workers), best;
  std::iota(perm.begin(), perm.end(), 0u);
  std::uint64_t best_cost = ~std::uint64_t{0};
  do {
    const std::uint64_t c = cost(perm);
    if (c < best_cost) {
      best_cost = c;
      best = perm;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  worker_of = best;
}

}  // namespace ember::scheduler
