#include "ember/worker/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ember::worker {

double auc(const std::vector<float>& scores, const std::vector<std::uint8_t>& labels) {
  const std::size_t n = scores.size();
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney U: sum of the positives' ranks, tied scores sharing their mean rank.
  double rank_sum = 0;
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2.0 + 1.0;
    for (std::size_t k = i; k < j; ++k) {
      if (labels[order[k]]) {
        rank_sum += mean_rank;
        ++pos;
      }
    }
    i = j;
  }
  const std::uint64_t neg = n - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - static_cast<double>(pos) * (static_cast<double>(pos) + 1) / 2.0) /
         (static_cast<double>(pos) * static_cast<double>(neg));
}

double logloss(const std::vector<float>& probs, const std::vector<std::uint8_t>& labels) {
  if (probs.empty()) return 0;
  double sum = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probs[i]), 1e-7, 1 - 1e-7);
    sum -= labels[i] ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(probs.size());
}

}  // namespace ember::worker
