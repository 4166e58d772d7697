#include "stages/compute_step.h"

#include <utility>

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
      pooling_(c.model.pooling),
      sparse_(sparse),
      overlap_(c.overlap_allreduce),
      wire_(wire) {}

void ComputeStep::forward_backward(Step& s, const U64Map<std::uint32_t>& row_of, RowCache& cache) {
  const scheduler::StepPlan& p = s.plan;
  const auto n = static_cast<std::int64_t>(p.samples.size());
  const std::size_t cells = s.keys.size();  // n x tables, or every id of the samples' bags
  slots_.clear();
  replica_h_.clear();
  cached_pos_.clear();
  replica_pos_.clear();
  replicated_ = p.replicated;
  slots_.reserve(cells);
  for (std::size_t i = 0; i < cells; ++i) {
    if (const std::uint32_t* h = replicas_.find(s.keys[i])) {
      replica_pos_.push_back(static_cast<std::int64_t>(i));
      replica_h_.push_back(*h);
    } else {
      cached_pos_.push_back(static_cast<std::int64_t>(i));
      slots_.push_back(p.rows[*row_of.find(s.keys[i])].slot);
    }
  }
  torch::Tensor emb_flat;
  if (replica_pos_.empty()) {
    emb_flat = cache.gather(slots_);
  } else {
    // Positions of the cached and the replicated rows in the batch, on the device (used forward and backward).
    cached_idx_ = torch::tensor(cached_pos_).to(device_);
    replica_idx_ = torch::tensor(replica_pos_).to(device_);
    emb_flat = torch::empty({static_cast<std::int64_t>(cells), static_cast<std::int64_t>(dim_)}, torch::TensorOptions().device(device_));
    if (!cached_pos_.empty()) emb_flat.index_copy_(0, cached_idx_, cache.gather(slots_));
    emb_flat.index_copy_(0, replica_idx_, replicas_.values(replica_h_).to(device_));
  }
  // One-hot: the rows are the model's input; multi-hot: pooled bag by bag into it, so
  // that the gradient reaching each row is its bag's.
  const std::int64_t T = num_tables_;
  torch::Tensor leaf = s.bags.empty() ? emb_flat.view({n, T, dim_}) : emb_flat;
  leaf.set_requires_grad(true);
  torch::Tensor emb = s.bags.empty() ? leaf : pool_bags(leaf, bag_index(s.bags, pooling_, device_)).view({n, T, dim_});
  auto dense = torch::from_blob(s.dense.data(), {n, static_cast<std::int64_t>(num_dense_)}, torch::kFloat32).to(device_);
  auto labels = torch::from_blob(s.labels.data(), {n}, torch::kFloat32).to(device_);
  optimizer_.zero_grad();
  auto logits = model_.forward(dense, emb);
  loss_ = torch::binary_cross_entropy_with_logits(logits, labels, {}, {}, at::Reduction::Sum) / static_cast<double>(global_n_);
  loss_.backward();
  emb_grad_ = leaf.grad().reshape({-1, static_cast<std::int64_t>(dim_)});
}

void ComputeStep::allreduce(RowCache& cache, bool flush) {
  if (!replica_pos_.empty()) replicas_.add_grads(replica_h_, emb_grad_.index_select(0, replica_idx_).to(torch::kCPU));
  std::vector<torch::Tensor> parts;
  for (auto& param : model_.parameters()) parts.push_back(param.grad().reshape(-1));
  parts.push_back(loss_.detach().reshape(1));
  if (!replicas_.empty()) replicas_.append_to(parts, device_, replicated_);
  // Gloo reduces host tensors: on a GPU the flat gradient makes one round trip to the
  // host (with NCCL it stays on the device). One flat tensor, whether or not the sum
  // overlaps anything: the same sums, so the same model.
  flat_.assign(1, collective_.on_device() ? torch::cat(parts) : torch::cat(parts).to(torch::kCPU));
  reduced_ = collective_.start_allreduce(flat_);
  // The row gradients into the cache while the sum runs (they do not wait for it).
  if (replica_pos_.empty()) {
    cache.scatter_add_grad(slots_, emb_grad_);
  } else if (!cached_pos_.empty()) {
    cache.scatter_add_grad(slots_, emb_grad_.index_select(0, cached_idx_));
  }
  // The step's graph and row gradients are not needed past here (the loss is in flat_).
  loss_ = torch::Tensor();
  emb_grad_ = torch::Tensor();
  if (!overlap_ || flush) wait_allreduce();
}

void ComputeStep::wait_allreduce() {
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
  if (!replicas_.empty()) wire_.rows.hot_sync += replicas_.apply(flat_[0], off + 1, sparse_);
  flat_.clear();
  optimizer_.step();
}

}  // namespace ember::worker
