// Progressive validation: each global batch scored by the model as it stands before it
// trains on that batch, so every sample is unseen when scored (the usual measure of a
// model trained on a stream, which has no held-out split). The scores are the training
// step's own forward pass, gathered over the workers by the dense all-reduce
// (ComputeStep), so they cost no extra pass. Kept over a sliding window of the last
// `iterations` iterations; worker 0 reports AUC and log loss over it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace ember::worker {

class ProgressiveWindow {
 public:
  explicit ProgressiveWindow(std::uint64_t iterations) : iterations_(iterations) {}

  // Iteration t's global batch as gathered: `logits[i]` and `marks[i]` for each position
  // i < n, a mark being label + 1 (0: no sample there, an epoch's short last batch).
  void add(std::uint64_t iteration, const float* logits, const float* marks, std::size_t n);

  struct Scores {
    double auc = 0.5, logloss = 0;
    std::uint64_t samples = 0;
    std::uint64_t first = 0, last = 0;  // the window's iterations
  };
  // Over the window; none before the first batch.
  std::optional<Scores> scores() const;
  std::uint64_t iterations() const { return iterations_; }

 private:
  struct Batch {
    std::uint64_t iteration;
    std::vector<float> probs;
    std::vector<std::uint8_t> labels;
  };
  std::uint64_t iterations_;
  std::deque<Batch> window_;
};

}  // namespace ember::worker
