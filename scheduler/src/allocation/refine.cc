// Refined allocation (--refine-allocation): swaps of samples between workers of a group
// while a swap lowers the rows the batch moves (docs/scheduler.md "Refined allocation").
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "../allocation.h"
#include "../bits.h"
#include "ember/common/hash.h"

namespace ember::scheduler {

namespace {

// What the refinement of one group of workers needs of the rest of the batch, kept
// across groups: each row's distinct trainers, and whether its latest holder trains it.
struct RefineRows {
  std::vector<std::uint32_t> trainers;     // d -> distinct trainers
  std::vector<std::uint8_t> owner_trains;  // d -> its latest holder trains it
  std::vector<std::uint32_t> local;        // d -> index among the group's rows + 1 (0: not the group's)
};

// The refinement's bookkeeping for one group of at most 64 workers: its rows' trainers
// in the group (a mask by local worker), samples per (row, local worker), the trainers
// outside the group (fixed while the group is refined), the batch's cost of a row in
// hundredths of a row, and the change of moving a sample.
class SwapRefiner {
 public:
  SwapRefiner(const SchedulerConfig& c, const GlobalBatch& /*batch*/, const BatchRows& rows, const cache::LocationMap& loc,
              std::vector<std::uint32_t>& worker_of, const std::vector<std::uint32_t>& group, const std::vector<std::uint32_t>& samples,
              const std::vector<std::uint32_t>& local_of, RefineRows& shared)
      : rows_(rows),
        worker_of_(worker_of),
        local_of_(local_of),
        shared_(shared),
        G_(static_cast<std::uint32_t>(group.size())),
        on_demand_(c.policy.sync() == Sync::kOnDemand),
        worker_at_(group) {
    // The group's rows, in order of first appearance.
    for (std::uint32_t i : samples) {
      for (std::uint32_t d : rows.sample_rows(i)) {
        if (shared_.local[d] != 0) continue;
        shared_.local[d] = static_cast<std::uint32_t>(d_.size()) + 1;
        d_.push_back(d);
      }
    }
    const std::size_t L = d_.size();
    count_.assign(L * G_, 0);
    mask_.assign(L, 0);
    for (std::uint32_t i : samples) {
      const std::uint32_t lw = local_of_[worker_of[i]];
      for (std::uint32_t d : rows.sample_rows(i)) {
        const std::uint32_t l = shared_.local[d] - 1;
        ++count_[static_cast<std::size_t>(l) * G_ + lw];
        mask_[l] |= bit(lw);
      }
    }
    owner_bit_.assign(L, 0);
    owner_out_.assign(L, 0);
    outside_.assign(L, 0);
    dirty_.assign(L, 0);
    for (std::size_t l = 0; l < L; ++l) {
      const std::uint32_t d = d_[l];
      const int here = popcount64(mask_[l]);
      outside_[l] = static_cast<std::int32_t>(shared_.trainers[d]) - here;
      const std::uint16_t o = rows.owner_d[d];
      if (o == cache::LocationMap::kNoOwner) continue;
      dirty_[l] = on_demand_ && loc.dirty(rows.keys[d]);
      if (local_of_[o] != kOutside) {
        owner_bit_[l] = bit(local_of_[o]);
      } else if (shared_.owner_trains[d]) {
        --outside_[l];  // the trainers outside the group other than the latest holder
        owner_out_[l] = 1;
      }
    }
    start_mask_ = mask_;
  }

  static constexpr std::uint32_t kOutside = ~std::uint32_t{0};

  // The group's moves, told to the rows' shared facts; its rows' local indexes cleared.
  ~SwapRefiner() {
    for (std::size_t l = 0; l < d_.size(); ++l) {
      const std::uint32_t d = d_[l];
      shared_.trainers[d] =
          static_cast<std::uint32_t>(static_cast<std::int64_t>(shared_.trainers[d]) + popcount64(mask_[l]) - popcount64(start_mask_[l]));
      if (owner_bit_[l] != 0) shared_.owner_trains[d] = (mask_[l] & owner_bit_[l]) != 0;
      shared_.local[d] = 0;
    }
  }

  // The change in cost if sample i moves from worker a to b (local indexes).
  std::int64_t move_delta(std::uint32_t i, std::uint32_t a, std::uint32_t b) const {
    std::int64_t delta = 0;
    for (std::uint32_t d : rows_.sample_rows(i)) {
      const std::uint32_t l = shared_.local[d] - 1;
      const std::uint64_t U = mask_[l];
      std::uint64_t U2 = U | bit(b);
      if (count_[static_cast<std::size_t>(l) * G_ + a] == 1) U2 &= ~bit(a);
      if (U2 != U) delta += cost(l, U2) - cost(l, U);
    }
    return delta;
  }

  void move(std::uint32_t i, std::uint32_t a, std::uint32_t b) {
    for (std::uint32_t d : rows_.sample_rows(i)) {
      const std::uint32_t l = shared_.local[d] - 1;
      if (--count_[static_cast<std::size_t>(l) * G_ + a] == 0) mask_[l] &= ~bit(a);
      ++count_[static_cast<std::size_t>(l) * G_ + b];
      mask_[l] |= bit(b);
    }
    worker_of_[i] = worker_at_[b];
  }

  // Swaps between workers a and b (local indexes; their samples: sa, sb): the samples of
  // a ranked by the change of moving them to b, those of b by moving to a. In that
  // order, each sample i of a is swapped with the first of the next few unswapped
  // samples j of b whose predicted sum is negative and whose exact change (after i
  // moves) is too. Whether any swap was made.
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
  // The batch's cost of a row trained by the group's workers U (and its trainers
  // outside), in hundredths of a row: a pull for each trainer but its latest holder o;
  // on demand, o's value push when another trains it (o dirty), and half a row per
  // trainer of a shared row (its partial gradients are pushed, and it pulled by every
  // trainer, when it is next used); full-set, a gradient push per trainer.
  std::int64_t cost(std::uint32_t l, std::uint64_t U) const {
    constexpr std::int64_t kRow = 100, kShared = 50;
    const int others = popcount64(U & ~owner_bit_[l]) + outside_[l];
    const int m = popcount64(U) + outside_[l] + owner_out_[l];
    std::int64_t c = kRow * others;
    if (!on_demand_) return c + kRow * m;
    if (dirty_[l] && others != 0) c += kRow;
    if (m > 1) c += kShared * m;
    return c;
  }

  const BatchRows& rows_;
  std::vector<std::uint32_t>& worker_of_;
  const std::vector<std::uint32_t>& local_of_;
  RefineRows& shared_;
  const std::uint32_t G_;
  const bool on_demand_;
  const std::vector<std::uint32_t> worker_at_;  // local index -> worker
  std::vector<std::uint32_t> d_;                // local row -> d
  std::vector<std::uint64_t> owner_bit_, mask_, start_mask_;
  std::vector<std::int32_t> outside_;
  std::vector<std::uint8_t> owner_out_;  // local row -> its latest holder is outside the group and trains it
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint32_t> count_;
  std::vector<std::pair<std::int64_t, std::uint32_t>> ra_, rb_;
  std::vector<std::uint8_t> taken_;
};

// The groups the refinement swaps within, in rounds refined one after the other: under
// two-level allocation, the hosts (a sample stays on its host); else blocks of
// kRefineGroup consecutive workers, then (past one block) the groups w, w + S, w + 2S, ...
// for S = ceil(W / kRefineGroup): a sample is weighed against at most 2 (kRefineGroup -
// 1) other workers whatever the job's size, and the second round links the blocks.
constexpr std::uint32_t kRefineGroup = 8;

std::vector<std::vector<std::vector<std::uint32_t>>> refine_rounds(const SchedulerConfig& c) {
  const std::uint32_t W = c.workers;
  if (c.host_allocation) {
    const std::uint32_t H = *std::max_element(c.host_of.begin(), c.host_of.end()) + 1;
    std::vector<std::vector<std::vector<std::uint32_t>>> hosts(H);
    for (std::uint32_t w = 0; w < W; ++w) {
      auto& g = hosts[c.host_of[w]];
      if (g.empty() || g.back().size() == 64) g.emplace_back();  // a mask per row: at most 64 workers a group
      g.back().push_back(w);
    }
    std::vector<std::vector<std::uint32_t>> round;
    for (auto& host : hosts) {
      for (auto& g : host) round.push_back(std::move(g));
    }
    return {round};
  }
  std::vector<std::vector<std::vector<std::uint32_t>>> rounds(1);
  for (std::uint32_t w = 0; w < W; ++w) {
    if (w % kRefineGroup == 0) rounds[0].emplace_back();
    rounds[0].back().push_back(w);
  }
  if (W > kRefineGroup) {
    const std::uint32_t stride = (W + kRefineGroup - 1) / kRefineGroup;
    rounds.emplace_back(stride);
    for (std::uint32_t w = 0; w < W; ++w) rounds[1][w % stride].push_back(w);
  }
  return rounds;
}

// Refines one group's samples (their workers: `group`) by swaps: at most kPasses passes
// over every pair of its workers (a, b) within each partition, fewer when a pass swaps
// nothing.
void refine_group(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows, const cache::LocationMap& loc,
                  const std::vector<std::uint32_t>& group, const std::vector<std::uint32_t>& samples, std::vector<std::uint32_t>& local_of,
                  RefineRows& shared, std::vector<std::uint32_t>& worker_of) {
  constexpr int kPasses = 3;
  const std::uint32_t n = batch.samples, P = c.partitions, per = n / P;
  const auto G = static_cast<std::uint32_t>(group.size());
  if (G < 2) return;
  for (std::uint32_t l = 0; l < G; ++l) local_of[group[l]] = l;
  {
    SwapRefiner refiner(c, batch, rows, loc, worker_of, group, samples, local_of, shared);
    std::vector<std::vector<std::uint32_t>> members(G);
    for (int pass = 0; pass < kPasses; ++pass) {
      bool swapped = false;
      for (std::uint32_t p = 0; p < P; ++p) {
        const std::uint32_t begin = p * per, end = p + 1 == P ? n : begin + per;
        for (auto& m : members) m.clear();
        for (std::uint32_t i : samples) {
          if (i >= begin && i < end) members[local_of[worker_of[i]]].push_back(i);
        }
        for (std::uint32_t a = 0; a < G; ++a) {
          for (std::uint32_t b = a + 1; b < G; ++b) {
            if (!refiner.swap_pair(a, b, members[a], members[b])) continue;
            swapped = true;
            members[a].clear();
            members[b].clear();
            for (std::uint32_t i : samples) {
              if (i < begin || i >= end) continue;
              const std::uint32_t l = local_of[worker_of[i]];
              if (l == a || l == b) members[l].push_back(i);
            }
          }
        }
      }
      if (!swapped) break;
    }
  }
  for (std::uint32_t w : group) local_of[w] = SwapRefiner::kOutside;
}

}  // namespace

void refine_allocation(const SchedulerConfig& c, const GlobalBatch& batch, const BatchRows& rows, const cache::LocationMap& loc,
                       std::vector<std::uint32_t>& worker_of) {
  const std::uint32_t n = batch.samples, W = c.workers;
  const std::uint32_t D = rows.size();
  // Every row's distinct trainers, and whether its latest holder is one of them.
  RefineRows shared{std::vector<std::uint32_t>(D, 0), std::vector<std::uint8_t>(D, 0), std::vector<std::uint32_t>(D, 0)};
  {
    std::vector<std::vector<std::uint32_t>> of(W);
    for (std::uint32_t i = 0; i < n; ++i) of[worker_of[i]].push_back(i);
    std::vector<std::uint32_t>& stamp = shared.local;
    for (std::uint32_t w = 0; w < W; ++w) {
      for (std::uint32_t i : of[w]) {
        for (std::uint32_t d : rows.sample_rows(i)) {
          if (stamp[d] == w + 1) continue;
          stamp[d] = w + 1;
          ++shared.trainers[d];
          shared.owner_trains[d] |= rows.owner_d[d] == w;
        }
      }
    }
    std::fill(stamp.begin(), stamp.end(), 0);
  }
  std::vector<std::uint32_t> local_of(W, SwapRefiner::kOutside);
  for (const auto& groups : refine_rounds(c)) {
    // Each group's samples, in batch order (one pass: the work per sample stays constant).
    std::vector<std::uint32_t> group_of(W);
    for (std::uint32_t g = 0; g < groups.size(); ++g) {
      for (std::uint32_t w : groups[g]) group_of[w] = g;
    }
    std::vector<std::vector<std::uint32_t>> samples_of(groups.size());
    for (std::uint32_t i = 0; i < n; ++i) samples_of[group_of[worker_of[i]]].push_back(i);
    for (std::uint32_t g = 0; g < groups.size(); ++g)
      refine_group(c, batch, rows, loc, groups[g], samples_of[g], local_of, shared, worker_of);
  }
}

}  // namespace ember::scheduler
