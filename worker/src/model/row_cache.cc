#include "ember/worker/row_cache.h"

#include <cstring>

#include "ember/common/error.h"

namespace ember::worker {
namespace {

torch::Tensor slot_index(std::span<const std::uint32_t> slots, torch::Device device) {
  auto idx = torch::empty({static_cast<std::int64_t>(slots.size())}, torch::kInt64);
  auto* p = idx.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < slots.size(); ++i) p[i] = slots[i];
  return idx.to(device);
}

// Host memory and the PS's optimizer code: what the equivalence tests compare bit for bit.
class HostRowCache final : public RowCache {
 public:
  HostRowCache(std::uint32_t capacity, std::uint32_t dim, std::uint32_t state_dim) : c_(capacity, dim, state_dim) {}

  Key key(std::uint32_t slot) const override { return c_.key(slot); }

  void fill(std::span<const std::uint32_t> slots, std::span<const Key> keys, const float* rows, bool with_state) override {
    const std::size_t per = c_.dim() + (with_state ? c_.state_dim() : 0);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const float* r = rows + i * per;
      c_.fill(slots[i], keys[i], r, with_state ? r + c_.dim() : nullptr);
    }
  }
  void read_rows(std::span<const std::uint32_t> slots, std::vector<float>& out) override {
    for (std::uint32_t s : slots) {
      out.insert(out.end(), c_.value(s), c_.value(s) + c_.dim());
      out.insert(out.end(), c_.state(s), c_.state(s) + c_.state_dim());
    }
  }
  void read_grads(std::span<const std::uint32_t> slots, std::vector<float>& out) override {
    for (std::uint32_t s : slots) out.insert(out.end(), c_.grad(s), c_.grad(s) + c_.dim());
  }
  void scatter_add_grad(const std::vector<std::uint32_t>& slots, const torch::Tensor& grads) override {
    auto g = grads.contiguous();
    c_.scatter_add_grad(slots.data(), slots.size(), g.data_ptr<float>());
  }
  void row_pointers(std::span<const std::uint32_t> slots, std::vector<const float*>& values, std::vector<float*>& grads) override {
    for (std::uint32_t s : slots) {
      values.push_back(c_.value(s));
      grads.push_back(c_.grad(s));
    }
  }
  void apply(std::span<const std::uint32_t> slots, const ps::OptimizerConfig& opt, float lr) override {
    for (std::uint32_t s : slots) {
      ps::apply(opt, lr, c_.dim(), c_.value(s), c_.state(s), c_.grad(s));
      c_.zero_grad(s);
    }
  }
  void zero_grad(std::span<const std::uint32_t> slots) override {
    for (std::uint32_t s : slots) c_.zero_grad(s);
  }
  torch::Device device() const override { return torch::kCPU; }
  std::size_t memory_bytes() const override { return c_.memory_bytes(); }
  const char* backend() const override { return "host"; }

 private:
  cache::EmbeddingCache c_;
};

// Tensors on a device; the optimizers written with tensor operations (same formulas as
// ps::apply, so results agree within float rounding, not bit for bit).
class TensorRowCache final : public RowCache {
 public:
  TensorRowCache(torch::Device device, std::uint32_t capacity, std::uint32_t dim, std::uint32_t state_dim)
      : device_(device), dim_(dim), state_dim_(state_dim), keys_(capacity, 0) {
    auto o = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    values_ = torch::zeros({capacity, dim}, o);
    opt_state_ = torch::zeros({capacity, std::max<std::uint32_t>(state_dim, 1)}, o);
    grads_ = torch::zeros({capacity, dim}, o);
  }

  Key key(std::uint32_t slot) const override { return keys_[slot]; }

  void fill(std::span<const std::uint32_t> slots, std::span<const Key> keys, const float* rows, bool with_state) override {
    if (slots.empty()) return;
    const auto n = static_cast<std::int64_t>(slots.size());
    const std::int64_t per = dim_ + (with_state ? state_dim_ : 0);
    auto host = torch::from_blob(const_cast<float*>(rows), {n, per}, torch::kFloat32);
    auto dev = host.to(device_);  // one copy to the device for the whole batch
    auto idx = slot_index(slots, device_);
    values_.index_copy_(0, idx, dev.narrow(1, 0, dim_));
    if (state_dim_ > 0 && with_state) opt_state_.index_copy_(0, idx, dev.narrow(1, dim_, state_dim_));
    if (state_dim_ > 0 && !with_state) opt_state_.index_fill_(0, idx, 0.0f);
    grads_.index_fill_(0, idx, 0.0f);
    for (std::size_t i = 0; i < slots.size(); ++i) keys_[slots[i]] = keys[i];
  }
  void read_rows(std::span<const std::uint32_t> slots, std::vector<float>& out) override {
    if (slots.empty()) return;
    auto idx = slot_index(slots, device_);
    auto rows = values_.index_select(0, idx);
    if (state_dim_ > 0) rows = torch::cat({rows, opt_state_.index_select(0, idx)}, 1);
    append(rows, out);
  }
  void read_grads(std::span<const std::uint32_t> slots, std::vector<float>& out) override {
    if (slots.empty()) return;
    append(grads_.index_select(0, slot_index(slots, device_)), out);
  }
  void scatter_add_grad(const std::vector<std::uint32_t>& slots, const torch::Tensor& grads) override {
    grads_.index_add_(0, slot_index(slots, device_), grads.to(device_));
  }
  void row_pointers(std::span<const std::uint32_t> slots, std::vector<const float*>& values, std::vector<float*>& grads) override {
    const float* v = values_.data_ptr<float>();
    float* g = grads_.data_ptr<float>();
    for (std::uint32_t s : slots) {
      values.push_back(v + static_cast<std::size_t>(s) * dim_);
      grads.push_back(g + static_cast<std::size_t>(s) * dim_);
    }
  }
  void apply(std::span<const std::uint32_t> slots, const ps::OptimizerConfig& c, float lr) override {
    if (slots.empty()) return;
    torch::NoGradGuard no_grad;
    auto idx = slot_index(slots, device_);
    auto w = values_.index_select(0, idx);
    auto g = grads_.index_select(0, idx) + c.weight_decay * w;
    switch (c.kind) {
      case ps::OptimizerKind::kSgd:
        w -= lr * g;
        break;
      case ps::OptimizerKind::kAdagrad: {
        auto s = opt_state_.index_select(0, idx) + g * g;
        w -= lr * g / (s.sqrt() + c.eps);
        opt_state_.index_copy_(0, idx, s);
        break;
      }
      case ps::OptimizerKind::kRowWiseAdagrad: {
        auto s = opt_state_.index_select(0, idx) + (g * g).sum(1, true) / static_cast<double>(dim_);
        w -= (lr / (s.sqrt() + c.eps)) * g;
        opt_state_.index_copy_(0, idx, s);
        break;
      }
      case ps::OptimizerKind::kAdam: {
        auto st = opt_state_.index_select(0, idx);
        auto m = st.narrow(1, 0, dim_) * c.beta1 + (1.0f - c.beta1) * g;
        auto v = st.narrow(1, dim_, dim_) * c.beta2 + (1.0f - c.beta2) * g * g;
        auto step = st.narrow(1, 2 * dim_, 1) + 1.0f;
        auto bc1 = 1.0f - torch::pow(torch::full_like(step, c.beta1), step);
        auto bc2 = 1.0f - torch::pow(torch::full_like(step, c.beta2), step);
        w -= lr * (m / bc1) / ((v / bc2).sqrt() + c.eps);
        opt_state_.index_copy_(0, idx, torch::cat({m, v, step}, 1));
        break;
      }
    }
    values_.index_copy_(0, idx, w);
    grads_.index_fill_(0, idx, 0.0f);
  }
  void zero_grad(std::span<const std::uint32_t> slots) override {
    if (!slots.empty()) grads_.index_fill_(0, slot_index(slots, device_), 0.0f);
  }
  torch::Device device() const override { return device_; }
  std::size_t memory_bytes() const override {
    return (values_.numel() + opt_state_.numel() + grads_.numel()) * sizeof(float) + keys_.size() * (sizeof(Key) + 1);
  }
  const char* backend() const override { return "tensor"; }

 private:
  static void append(const torch::Tensor& t, std::vector<float>& out) {
    auto h = t.to(torch::kCPU).contiguous();
    out.insert(out.end(), h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }

  torch::Device device_;
  std::int64_t dim_, state_dim_;
  torch::Tensor values_, opt_state_, grads_;
  std::vector<Key> keys_;
};

}  // namespace

std::string resolve_cache_backend(const std::string& backend, torch::Device device) {
  if (backend == "auto") return device.is_cpu() ? "host" : "tensor";
  if (backend == "host" && !device.is_cpu()) throw ConfigError("--cache-backend host keeps rows in CPU memory: use it with --device cpu");
  if (backend != "host" && backend != "tensor") throw ConfigError("--cache-backend '" + backend + "': choose auto, host or tensor");
  return backend;
}

std::unique_ptr<RowCache> make_row_cache(const std::string& backend, torch::Device device, std::uint32_t capacity, std::uint32_t dim,
                                         std::uint32_t state_dim) {
  if (resolve_cache_backend(backend, device) == "host") return std::make_unique<HostRowCache>(capacity, dim, state_dim);
  return std::make_unique<TensorRowCache>(device, capacity, dim, state_dim);
}

}  // namespace ember::worker
