#include "ember/worker/model.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"

namespace ember::worker {

namespace nn = torch::nn;

namespace {

// Linear layers with ReLU between them (and after the last one when `relu_last`).
nn::Sequential mlp(std::int64_t in, const std::vector<std::int64_t>& sizes, bool relu_last) {
  nn::Sequential seq;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    seq->push_back(nn::Linear(in, sizes[i]));
    if (i + 1 < sizes.size() || relu_last) seq->push_back(nn::ReLU());
    in = sizes[i];
  }
  return seq;
}

std::vector<std::int64_t> with(std::vector<std::int64_t> v, std::int64_t last) {
  v.push_back(last);
  return v;
}

torch::Tensor flat_input(const torch::Tensor& dense, const torch::Tensor& emb) { return torch::cat({dense, emb.flatten(1)}, 1); }

std::int64_t flat_width(const ModelConfig& c) { return c.num_dense + static_cast<std::int64_t>(c.num_tables) * c.dim; }

class WideDeep : public CtrModel {
 public:
  explicit WideDeep(const ModelConfig& c) {
    wide_ = register_module("wide", nn::Linear(flat_width(c), 1));
    deep_ = register_module("deep", mlp(flat_width(c), with(c.deep, 1), false));
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override {
    auto x = flat_input(dense, emb);
    return (wide_->forward(x) + deep_->forward(x)).squeeze(1);
  }

 private:
  nn::Linear wide_{nullptr};
  nn::Sequential deep_{nullptr};
};

class DeepFm : public CtrModel {
 public:
  explicit DeepFm(const ModelConfig& c) {
    linear_ = register_module("linear", nn::Linear(flat_width(c), 1));
    deep_ = register_module("deep", mlp(flat_width(c), with(c.deep, 1), false));
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override {
    auto x = flat_input(dense, emb);
    auto sum = emb.sum(1);  // FM second order: 0.5 * ((sum e)^2 - sum e^2), over the dims
    auto fm = 0.5 * (sum * sum - (emb * emb).sum(1)).sum(1, true);
    return (linear_->forward(x) + fm + deep_->forward(x)).squeeze(1);
  }

 private:
  nn::Linear linear_{nullptr};
  nn::Sequential deep_{nullptr};
};

class Dcn : public CtrModel {
 public:
  explicit Dcn(const ModelConfig& c) {
    const std::int64_t in = flat_width(c);
    for (int l = 0; l < c.cross_layers; ++l) {
      w_.push_back(register_parameter("cross_w" + std::to_string(l), torch::randn({in, 1}) * (1.0 / std::sqrt(static_cast<double>(in)))));
      b_.push_back(register_parameter("cross_b" + std::to_string(l), torch::zeros({in})));
    }
    deep_ = register_module("deep", mlp(in, c.deep, true));
    out_ = register_module("out", nn::Linear(in + (c.deep.empty() ? 0 : c.deep.back()), 1));
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override {
    auto x0 = flat_input(dense, emb);
    auto x = x0;
    for (std::size_t l = 0; l < w_.size(); ++l) x = x0 * x.matmul(w_[l]) + b_[l] + x;
    return out_->forward(torch::cat({x, deep_->forward(x0)}, 1)).squeeze(1);
  }

 private:
  std::vector<torch::Tensor> w_, b_;
  nn::Sequential deep_{nullptr};
  nn::Linear out_{nullptr};
};

class Dlrm : public CtrModel {
 public:
  // Without dense features (Avazu) there is no bottom MLP: only the embeddings interact.
  explicit Dlrm(const ModelConfig& c) : has_dense_(c.num_dense > 0) {
    if (has_dense_) bottom_ = register_module("bottom", mlp(c.num_dense, with(c.bottom, c.dim), true));
    const std::int64_t f = c.num_tables + (has_dense_ ? 1 : 0);
    auto tri = torch::tril_indices(f, f, -1);  // strictly lower triangle: each pair once
    li_ = tri[0];
    lj_ = tri[1];
    top_ = register_module("top", mlp((has_dense_ ? c.dim : 0) + f * (f - 1) / 2, with(c.top, 1), false));
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override {
    torch::Tensor x, z = emb;
    if (has_dense_) {
      x = bottom_->forward(dense);               // [B, dim]
      z = torch::cat({x.unsqueeze(1), emb}, 1);  // [B, T+1, dim]
    }
    auto dots = torch::bmm(z, z.transpose(1, 2));  // [B, F, F]
    auto pairs = dots.index({torch::indexing::Slice(), li_, lj_});
    return top_->forward(has_dense_ ? torch::cat({x, pairs}, 1) : pairs).squeeze(1);
  }

 private:
  bool has_dense_;
  nn::Sequential bottom_{nullptr}, top_{nullptr};
  torch::Tensor li_, lj_;
};

}  // namespace

std::shared_ptr<CtrModel> make_model(const ModelConfig& c) {
  if (c.dim == 0 || c.num_tables == 0) throw ConfigError("a model needs at least one table and dim > 0");
  if (c.kind == "wide-deep") return std::make_shared<WideDeep>(c);
  if (c.kind == "deepfm") return std::make_shared<DeepFm>(c);
  if (c.kind == "dcn") return std::make_shared<Dcn>(c);
  if (c.kind == "dlrm") return std::make_shared<Dlrm>(c);
  throw ConfigError("--model '" + c.kind + "': choose wide-deep, deepfm, dcn or dlrm");
}

std::unique_ptr<torch::optim::Optimizer> make_dense_optimizer(const std::string& name, std::vector<torch::Tensor> params, float lr) {
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
  if (name == "adagrad") return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(lr));
  throw ConfigError("--dense-optimizer '" + name + "': choose sgd or adagrad");
}

std::vector<float> flatten_params(CtrModel& model) {
  std::vector<float> out;
  for (const auto& p : model.named_parameters()) {
    auto t = p.value().detach().contiguous().to(torch::kCPU);
    out.insert(out.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  return out;
}

void load_flat_params(CtrModel& model, const std::vector<float>& values) {
  std::size_t want = 0;
  for (const auto& p : model.parameters()) want += static_cast<std::size_t>(p.numel());
  if (values.size() != want) {
    throw DataError("the model has " + std::to_string(want) + " dense parameters, not " + std::to_string(values.size()));
  }
  torch::NoGradGuard no_grad;
  std::size_t pos = 0;
  for (const auto& p : model.named_parameters()) {
    auto t = p.value();
    auto host = torch::from_blob(const_cast<float*>(values.data() + pos), t.sizes(), torch::kFloat32);
    t.copy_(host);
    pos += static_cast<std::size_t>(t.numel());
  }
}

// The fields by name, in declaration order (the JSON dense checkpoint files keep).
}  // namespace ember::worker
