// Stage 3, the compute step: the micro-batch's rows pooled from the cache (and the
// replicas) into the model's input by the fused embedding path, forward and backward
// through the dense model, the bags' gradients added into the rows' accumulators, the
// dense gradients and the loss summed over the workers (with the replicated rows'
// gradients: fae's hot rows, replicated tables), then the dense optimizer. The loss is
// the micro-batch's sum scaled by the global batch, so the all-reduced gradient is the
// global batch's mean loss's, whatever the partition: the model BSP training gives.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/worker/embedding_path.h"
#include "ember/worker/model.h"
#include "ember/worker/row_cache.h"
#include "job/collective.h"
#include "stages/loader.h"
#include "stages/phase_clock.h"
#include "stages/replicas.h"

namespace ember::worker {

class ComputeStep {
 public:
  // `wire`: where the all-reduces' bytes and the replicated rows' updates are counted.
  ComputeStep(CtrModel& model, torch::optim::Optimizer& optimizer, Collective& collective, Replicas& replicas, torch::Device device,
              const TrainConfig& c, std::uint32_t dim, const ps::OptimizerConfig& sparse, WireCounts& wire);

  // Step `s`'s rows pooled into the model's input (the embedding phase). The plan must
  // carry id_rows (SchedulerConfig::id_rows_for).
  void embed(const Step& s, RowCache& cache);
  // Forward and backward of the dense model on what embed pooled (the compute phase).
  // The dense model must be stepped first (wait_allreduce).
  void forward_backward(Step& s);
  // Starts summing the dense gradients, the loss and the replicated rows' gradients over
  // the workers (c10d's threads carry it on meanwhile) and adds the bags' gradients into
  // the rows' accumulators. Waits for the sum here unless it may overlap the next PS
  // exchange (--overlap-allreduce, and no flush follows, whose evaluation and dense state
  // need the stepped model).
  void allreduce(bool flush, PhaseClock& clock);
  // Completes the all-reduce in flight, if any (the one place one is finished): waits
  // for the sum, updates the replicated rows and takes the dense optimizer's step.
  void wait_allreduce(PhaseClock& clock);
  // The global batch's mean loss of the last all-reduce completed.
  double loss() const { return loss_mean_; }
  // Whether an all-reduce completed in this run (with --overlap-allreduce, not yet after
  // the first iteration: its loss comes with the next one).
  bool loss_known() const { return loss_known_; }
  // With --progressive-window: called as each all-reduce completes with its iteration's
  // global batch as scored before training (ProgressiveWindow::add's arguments).
  using Scored = std::function<void(std::uint64_t iteration, const float* logits, const float* marks, std::size_t n)>;
  void on_scored(Scored f) { on_scored_ = std::move(f); }

 private:
  // The bags' gradients into the rows' accumulators; the replicas' into their sums.
  void embedding_backward();

  CtrModel& model_;
  torch::optim::Optimizer& optimizer_;
  Collective& collective_;
  Replicas& replicas_;
  torch::Device device_;
  std::uint32_t num_tables_, num_dense_, global_n_, dim_;
  ps::OptimizerConfig sparse_;
  bool overlap_;
  bool progressive_;
  WireCounts& wire_;
  EmbeddingPath path_;
  double loss_mean_ = 0;
  bool loss_known_ = false;
  // This iteration's: each id's distinct row (the plan's rows, then its replicated rows),
  // the bags, where each distinct row's value and gradient sum live, the replicated rows
  // (their replica indices, values and gradient sums on the device), the model's input
  // (its gradient after the backward) and the loss.
  std::vector<std::uint32_t> ids_, slots_;
  const std::vector<std::uint32_t>* id_rows_ = nullptr;
  const std::vector<std::uint32_t>* bags_ = nullptr;
  std::vector<const float*> values_;
  std::vector<float*> grads_;
  std::vector<std::uint32_t> replica_h_;
  std::vector<Key> replicated_;  // the global batch's replicated rows (the plan's)
  torch::Tensor replica_values_, replica_grads_, input_, loss_;
  // The all-reduce in flight: its flat tensor and what completes it.
  std::vector<torch::Tensor> flat_;
  std::function<void()> reduced_;
  // Progressive validation: the step's scores and labels + 1 at their global places, and
  // the iterations of the last forward pass and of the all-reduce in flight.
  torch::Tensor scored_;
  std::uint64_t scored_iteration_ = 0, reduced_iteration_ = 0;
  Scored on_scored_;
};

}  // namespace ember::worker
