#include "report/progressive.h"

#include <cmath>

#include "ember/worker/metrics.h"

namespace ember::worker {

void ProgressiveWindow::add(std::uint64_t iteration, const float* logits, const float* marks, std::size_t n) {
  Batch b{iteration, {}, {}};
  for (std::size_t i = 0; i < n; ++i) {
    if (marks[i] < 0.5f) continue;
    b.probs.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])))));
    b.labels.push_back(marks[i] > 1.5f ? 1 : 0);
  }
  window_.push_back(std::move(b));
  while (!window_.empty() && window_.front().iteration + iterations_ <= iteration) window_.pop_front();
}

std::optional<ProgressiveWindow::Scores> ProgressiveWindow::scores() const {
  if (window_.empty()) return std::nullopt;
  std::vector<float> probs;
  std::vector<std::uint8_t> labels;
  for (const Batch& b : window_) {
    probs.insert(probs.end(), b.probs.begin(), b.probs.end());
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  Scores s;
  s.auc = auc(probs, labels);
  s.logloss = logloss(probs, labels);
  s.samples = probs.size();
  s.first = window_.front().iteration;
  s.last = window_.back().iteration;
  return s;
}

}  // namespace ember::worker
