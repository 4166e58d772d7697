// Evaluation metrics of a CTR model: ROC AUC (ties averaged) and log loss.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::worker {

// Area under the ROC curve of `scores` for binary `labels`; 0.5 when one class is absent.
double auc(const std::vector<float>& scores, const std::vector<std::uint8_t>& labels);
// Mean binary cross-entropy of probabilities (clamped away from 0 and 1).
double logloss(const std::vector<float>& probs, const std::vector<std::uint8_t>& labels);

}  // namespace ember::worker
