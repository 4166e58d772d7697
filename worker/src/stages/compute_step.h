// Stage 3, the compute step: the micro-batch's rows gathered from the cache (and fae's
// replica), forward and backward through the dense model, the dense gradients and the
// loss summed over the workers (with the replicated rows' gradients: fae's hot rows, replicated tables), then the dense optimizer
// and the row gradients added into the cache's slots. The loss is the micro-batch's sum
// scaled by the global batch, so the all-reduced gradient is the global batch's mean
// loss's, whatever the partition: the model BSP training gives.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/worker/model.h"
#include "ember/worker/row_cache.h"
#include "job/collective.h"
#include "stages/loader.h"
#include "stages/replicas.h"

namespace ember::worker {

class ComputeStep {
 public:
  // `wire`: where the all-reduces' bytes and the replicated rows' updates are counted.
  ComputeStep(CtrModel& model, torch::optim::Optimizer& optimizer, Collective& collective, Replicas& replicas, torch::Device device,
              const TrainConfig& c, std::uint32_t dim, const ps::OptimizerConfig& sparse, WireCounts& wire);

  // Gather, forward, backward of step `s` (row_of: index_rows of its plan). The dense
  // model must be stepped first (wait_allreduce).
  void forward_backward(Step& s, const U64Map<std::uint32_t>& row_of, RowCache& cache);
  // Starts summing the dense gradients, the loss and the replicated rows' gradients over the
  // workers (c10d's threads carry it on meanwhile) and adds the row gradients into the
  // cache's slots. Waits for the sum here unless it may overlap the next PS exchange
  // (--overlap-allreduce, and no flush follows, whose evaluation and dense state need
  // the stepped model).
  void allreduce(RowCache& cache, bool flush);
  // Completes the all-reduce in flight, if any (the one place one is finished): waits
  // for the sum, updates the replicated rows and takes the dense optimizer's step.
  void wait_allreduce();
  // The global batch's mean loss of the last all-reduce completed.
  double loss() const { return loss_mean_; }
  // Whether an all-reduce completed in this run (with --overlap-allreduce, not yet after
  // the first iteration: its loss comes with the next one).
  bool loss_known() const { return loss_known_; }

 private:
  CtrModel& model_;
  torch::optim::Optimizer& optimizer_;
  Collective& collective_;
  Replicas& replicas_;
  torch::Device device_;
  std::uint32_t num_tables_, num_dense_, global_n_, dim_;
  std::string pooling_;  // multi-hot steps' pooling
  ps::OptimizerConfig sparse_;
  bool overlap_;
  WireCounts& wire_;
  double loss_mean_ = 0;
  bool loss_known_ = false;
  // This iteration's: the cache slots of the cached rows and the replica rows of the replicated
  // ones, their positions in the batch, the rows' gradients, the loss.
  std::vector<std::uint32_t> slots_, replica_h_;
  std::vector<Key> replicated_;  // the global batch's replicated rows (the plan's)
  std::vector<std::int64_t> cached_pos_, replica_pos_;
  torch::Tensor cached_idx_, replica_idx_, emb_grad_, loss_;
  // The all-reduce in flight: its flat tensor and what completes it.
  std::vector<torch::Tensor> flat_;
  std::function<void()> reduced_;
};

}  // namespace ember::worker
