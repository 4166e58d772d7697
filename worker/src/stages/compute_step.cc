#include "stages/compute_step.h"

#include <utility>

#include "ember/common/error.h"

namespace ember::worker {

ComputeStep::ComputeStep(CtrModel& model, torch::optim::Optimizer& optimizer, Collective& collective, Replicas& replicas,
                         torch::Device device, const TrainConfig& c, std::uint32_t dim, const ps::OptimizerConfig& sparse, WireCounts& wire)
    : model_(model),
      optimizer_(optimizer),
      collective_(collective),
      replicas_(replicas),
      device_(device),
      num_tables_(c.model.num_tables),
      num_dense_(c.model.num_dense),
      global_n_(c.workers * c.batch_per_worker),
      dim_(dim),
      sparse_(sparse),
      overlap_(c.overlap_allreduce),
      progressive_(c.progressive_window > 0),
      wire_(wire),
      path_(device, c.model.pooling) {}

void ComputeStep::embed(const Step& s, RowCache& cache) {
  const scheduler::StepPlan& p = s.plan;
  if (p.id_rows.size() != s.keys.size()) {
    throw Error("iteration " + std::to_string(s.iteration) + ": the plan maps " + std::to_string(p.id_rows.size()) + " ids, the step has " +
                std::to_string(s.keys.size()));
  }
  // The distinct rows: the plan's (cache slots, staged ones included), then the global
  // batch's replicated rows, whose values travel to the device for the step.
  const std::size_t R = p.rows.size();
  slots_.resize(R);
  for (std::size_t j = 0; j < R; ++j) slots_[j] = p.rows[j].slot;
  values_.clear();
  grads_.clear();
  cache.row_pointers(slots_, values_, grads_);
  replicated_ = p.replicated;
  replica_h_.clear();
  id_rows_ = &p.id_rows;
  if (!replicated_.empty()) {
    for (Key k : replicated_) {
      const std::uint32_t* h = replicas_.find(k);
      if (h == nullptr) throw Error("the plan lists row " + std::to_string(k) + " as replicated; this worker holds no replica of it");
      replica_h_.push_back(*h);
    }
    replica_values_ = replicas_.values(replica_h_).to(device_).contiguous();
    replica_grads_ = torch::zeros_like(replica_values_);
    for (std::size_t j = 0; j < replicated_.size(); ++j) {
      values_.push_back(replica_values_.data_ptr<float>() + j * dim_);
      grads_.push_back(replica_grads_.data_ptr<float>() + j * dim_);
    }
    // The ids of replicated rows renumbered past the plan's rows.
    ids_.resize(p.id_rows.size());
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      const std::uint32_t r = p.id_rows[i];
      ids_[i] = (r & scheduler::StepPlan::kReplicatedRow) ? static_cast<std::uint32_t>(R) + (r & ~scheduler::StepPlan::kReplicatedRow) : r;
    }
    id_rows_ = &ids_;
  }
  bags_ = &s.bags;
  const auto n = static_cast<std::int64_t>(p.samples.size());
  input_ =
      path_.forward(*id_rows_, s.bags, values_, dim_).view({n, static_cast<std::int64_t>(num_tables_), static_cast<std::int64_t>(dim_)});
  input_.set_requires_grad(true);
}

void ComputeStep::forward_backward(Step& s) {
  const auto n = static_cast<std::int64_t>(s.plan.samples.size());
  auto dense = torch::from_blob(s.dense.data(), {n, static_cast<std::int64_t>(num_dense_)}, torch::kFloat32).to(device_);
  auto labels = torch::from_blob(s.labels.data(), {n}, torch::kFloat32).to(device_);
  optimizer_.zero_grad();
  auto logits = model_.forward(dense, input_);
  loss_ = torch::binary_cross_entropy_with_logits(logits, labels, {}, {}, at::Reduction::Sum) / static_cast<double>(global_n_);
  loss_.backward();
  if (progressive_) {
    // This worker's samples' scores (the model before it trains on them) and labels + 1,
    // at their places in the global batch, on the device; the all-reduce's sum gathers
    // every worker's (the other places hold zeros: x + 0 is x).
    auto at = torch::from_blob(s.plan.samples.data(), {n}, torch::kInt32).to(device_, torch::kLong);
    scored_ = torch::zeros({2 * static_cast<std::int64_t>(global_n_)}, torch::TensorOptions(torch::kFloat32).device(device_));
    scored_.index_put_({at}, logits.detach().to(torch::kFloat32));
    scored_.index_put_({at + static_cast<std::int64_t>(global_n_)}, labels + 1.0f);
    scored_iteration_ = s.iteration;
  }
}

void ComputeStep::embedding_backward() {
  path_.backward(*id_rows_, *bags_, input_.grad(), grads_, dim_);
  if (!replicated_.empty()) replicas_.add_grads(replica_h_, replica_grads_.to(torch::kCPU));
  input_ = torch::Tensor();
  replica_values_ = replica_grads_ = torch::Tensor();
}

void ComputeStep::allreduce(bool flush, PhaseClock& clock) {
  // The replicated rows' gradients are summed with the dense ones: added up first.
  const bool replicated = !replicated_.empty();
  if (replicated) {
    embedding_backward();
    clock.lap(&PhaseTimes::embedding);
  }
  std::vector<torch::Tensor> parts;
  for (auto& param : model_.parameters()) parts.push_back(param.grad().reshape(-1));
  parts.push_back(loss_.detach().reshape(1));
  if (!replicas_.empty()) replicas_.append_to(parts, device_, replicated_);
  if (progressive_) {  // last: wait_allreduce finds it at the end
    parts.push_back(std::exchange(scored_, torch::Tensor()));
    reduced_iteration_ = scored_iteration_;
  }
  // Gloo reduces host tensors: on a GPU the flat gradient makes one round trip to the
  // host (with NCCL it stays on the device). One flat tensor, whether or not the sum
  // overlaps anything: the same sums, so the same model.
  flat_.assign(1, collective_.on_device() ? torch::cat(parts) : torch::cat(parts).to(torch::kCPU));
  reduced_ = collective_.start_allreduce(flat_);
  loss_ = torch::Tensor();  // the step's graph is not needed past here (the loss is in flat_)
  clock.lap(&PhaseTimes::allreduce);
  // The row gradients into the cache while the sum runs (they do not wait for it).
  if (!replicated) {
    embedding_backward();
    clock.lap(&PhaseTimes::embedding);
  }
  if (!overlap_ || flush) wait_allreduce(clock);
}

void ComputeStep::wait_allreduce(PhaseClock& clock) {
  if (!reduced_) return;
  std::exchange(reduced_, nullptr)();
  wire_.allreduce_bytes += static_cast<std::uint64_t>(flat_[0].numel()) * 4;
  std::int64_t off = 0;
  for (auto& param : model_.parameters()) {
    const std::int64_t k = param.numel();
    param.mutable_grad().copy_(flat_[0].narrow(0, off, k).view_as(param));  // copy_ moves it back to the device
    off += k;
  }
  loss_mean_ = flat_[0][off].item<double>();
  loss_known_ = true;
  clock.lap(&PhaseTimes::allreduce);
  if (!replicas_.empty()) wire_.rows.hot_sync += replicas_.apply(flat_[0], off + 1, sparse_);
  if (progressive_ && on_scored_) {
    const auto n = static_cast<std::int64_t>(global_n_);
    const torch::Tensor g = flat_[0].narrow(0, flat_[0].numel() - 2 * n, 2 * n).to(torch::kCPU).contiguous();
    on_scored_(reduced_iteration_, g.data_ptr<float>(), g.data_ptr<float>() + n, global_n_);
  }
  flat_.clear();
  optimizer_.step();
  clock.lap(&PhaseTimes::dense_step);
}

}  // namespace ember::worker
