#include "doi_profiler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ember/common/hash.h"
#include "ember/data/zipf.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kDoiInterval = 16;  // iterations between DoI updates
constexpr std::uint32_t kDoiSamplesPerWorker = 4096;

}  // namespace

DoiProfiler::DoiProfiler(const SchedulerConfig& c, std::uint32_t tables) : tables_(tables), doi_(tables, 0.0), scored_tables_(tables) {
  std::iota(scored_tables_.begin(), scored_tables_.end(), 0u);
  if (c.budget_ms > 0) access_.assign(c.num_keys, 0);
}

void DoiProfiler::record(const SchedulerConfig& c, const GlobalBatch& batch, double scoring_ms, std::uint64_t iteration,
                         const WorkerCaches& lru) {
  for (Key k : batch.keys) {
    if (access_[k] != UINT32_MAX) ++access_[k];
  }
  if (!scored_tables_.empty()) {
    double per_table = scoring_ms / static_cast<double>(scored_tables_.size());
    table_cost_ms_ = table_cost_ms_ == 0 ? per_table : 0.9 * table_cost_ms_ + 0.1 * per_table;
  }
  if ((iteration + 1) % kDoiInterval == 0) profile(c, iteration, lru);
}

void DoiProfiler::profile(const SchedulerConfig& c, std::uint64_t iteration, const WorkerCaches& lru) {
  // DoI per table over a deterministic sample of cached rows: the share accessed fewer
  // times than the samples one worker has trained so far.
  const double per_worker = static_cast<double>(iteration + 1) * c.batch_per_worker;
  std::vector<std::uint64_t> cached(tables_, 0), rare(tables_, 0);
  data::SplitMix64 rng(mix64(c.seed ^ (iteration + 0xd01)));
  for (const auto& modelled : lru) {
    if (!modelled || modelled->size() == 0) continue;
    const WorkerCache& l = *modelled;
    for (std::uint32_t i = 0; i < kDoiSamplesPerWorker; ++i) {
      std::uint32_t s = static_cast<std::uint32_t>(rng.below(l.capacity()));
      if (!l.occupied(s)) continue;
      Key k = l.key_at(s);
      auto t =
          static_cast<std::uint32_t>(std::upper_bound(c.table_offsets.begin(), c.table_offsets.end(), k) - c.table_offsets.begin() - 1);
      ++cached[t];
      rare[t] += access_[k] < per_worker;
    }
  }
  for (std::uint32_t t = 0; t < tables_; ++t) doi_[t] = cached[t] ? static_cast<double>(rare[t]) / static_cast<double>(cached[t]) : 0.0;
  std::uint32_t k = tables_;
  if (table_cost_ms_ > 0) {
    k = static_cast<std::uint32_t>(std::clamp(std::floor(c.budget_ms / table_cost_ms_), 1.0, static_cast<double>(tables_)));
  }
  std::vector<std::uint32_t> order(tables_);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return doi_[a] > doi_[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  scored_tables_ = order;
}

}  // namespace ember::scheduler
