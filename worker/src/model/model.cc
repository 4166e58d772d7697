#include "ember/worker/model.h"

#include <fmt/format.h>
#include <torch/script.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

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

// MLPerf's DLRM-DCNv2: a bottom MLP of the dense features to the embedding dim, beside
// the embeddings: x0 = [bottom(dense), emb flattened]; low-rank cross layers
// x_{l+1} = x0 * (W_l (V_l x_l) + b_l) + x_l (V_l: in -> rank, W_l: rank -> in); a top
// MLP of x_L to the logit.
class DcnV2 : public CtrModel {
 public:
  explicit DcnV2(const ModelConfig& c) : has_dense_(c.num_dense > 0) {
    if (c.cross_rank < 1) throw ConfigError("--cross-rank must be at least 1");
    if (has_dense_) bottom_ = register_module("bottom", mlp(c.num_dense, with(c.bottom, c.dim), true));
    const std::int64_t in = static_cast<std::int64_t>(c.num_tables + (has_dense_ ? 1 : 0)) * c.dim;
    for (int l = 0; l < c.cross_layers; ++l) {
      const std::string n = std::to_string(l);
      v_.push_back(register_module("cross_v" + n, nn::Linear(nn::LinearOptions(in, c.cross_rank).bias(false))));
      w_.push_back(register_module("cross_w" + n, nn::Linear(c.cross_rank, in)));
    }
    top_ = register_module("top", mlp(in, with(c.top, 1), false));
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override {
    auto x0 = has_dense_ ? torch::cat({bottom_->forward(dense), emb.flatten(1)}, 1) : emb.flatten(1);
    auto x = x0;
    for (std::size_t l = 0; l < v_.size(); ++l) x = x0 * w_[l]->forward(v_[l]->forward(x)) + x;
    return top_->forward(x).squeeze(1);
  }

 private:
  bool has_dense_;
  nn::Sequential bottom_{nullptr}, top_{nullptr};
  std::vector<nn::Linear> v_, w_;
};

// A TorchScript module (ember-worker --model-file): its parameters registered here too
// (the same tensors, under names without dots) so that the optimizer, the all-reduce,
// checkpoints and flatten_params see them as a built-in model's.
class ScriptedModel : public CtrModel {
 public:
  explicit ScriptedModel(torch::jit::Module m) : m_(std::move(m)) {
    for (const auto& p : m_.named_parameters(/*recurse=*/true)) {
      if (!p.value.requires_grad()) continue;  // frozen: the file's values stay
      std::string name = p.name;
      std::replace(name.begin(), name.end(), '.', '_');
      register_parameter(name, p.value);
    }
    // Buffers too, so that checkpoints hold them (not all-reduced: a buffer that training
    // changes, like BatchNorm's running statistics, would differ per worker).
    for (const auto& b : m_.named_buffers(/*recurse=*/true)) {
      std::string name = b.name;
      std::replace(name.begin(), name.end(), '.', '_');
      register_buffer(name, b.value);
    }
  }
  torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) override { return m_.forward({dense, emb}).toTensor(); }
  void train(bool on) override {
    nn::Module::train(on);
    m_.train(on);
  }
  using nn::Module::to;
  void to(torch::Device device, bool non_blocking) override { m_.to(device, non_blocking); }
  torch::jit::Module& module() { return m_; }

 private:
  torch::jit::Module m_;
};

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The model file, checked against the contract before anything trains (docs/training.md
// "Your own model"): ConfigError naming the file and what is wrong.
torch::jit::Module open_model_file(const std::string& file, const std::string& identity) {
  const std::string what = "--model-file " + file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw ConfigError(what + ": no such file");
  if (!identity.empty() && model_file_identity(file) != identity) {
    throw ConfigError(what + ": changed since this model was trained (now " + model_file_identity(file) + ", then " + identity + ")");
  }
  torch::jit::Module m;
  try {
    m = torch::jit::load(file, torch::kCPU);
  } catch (const c10::Error& e) {
    throw ConfigError(what +
                      ": not a TorchScript module (torch.jit.save of torch.jit.script(model)): " + first_line(e.what_without_backtrace()));
  }
  const auto method = m.find_method("forward");
  if (!method) throw ConfigError(what + ": has no forward method");
  const c10::FunctionSchema& schema = method->function().getSchema();
  const auto& args = schema.arguments();
  const auto is_tensor = [](const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; };
  if (args.size() != 3 || !is_tensor(args[1].type()) || !is_tensor(args[2].type()) || schema.returns().size() != 1 ||
      !is_tensor(schema.returns()[0].type())) {
    std::ostringstream sig;
    sig << schema;
    throw ConfigError(what + ": forward must be forward(self, dense: Tensor, emb: Tensor) -> Tensor; it is " + sig.str());
  }
  std::size_t params = 0;
  for (const auto& p : m.parameters()) {
    if (p.scalar_type() != torch::kFloat32) throw ConfigError(what + ": its parameters must be float32");
    if (p.requires_grad()) ++params;
  }
  if (params == 0) throw ConfigError(what + ": has no parameters to train");
  return m;
}

std::shared_ptr<CtrModel> load_model_file(const ModelConfig& c) {
  const std::string what = "--model-file " + c.file;
  torch::jit::Module m = open_model_file(c.file, c.file_identity);
  // One probe of two samples of this dataset's shape.
  const std::int64_t T = c.num_tables, D = c.dim, N = c.num_dense;
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    m.eval();
    out = m.forward({torch::zeros({2, N}), torch::zeros({2, T, D})}).toTensor();
    m.train();
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: forward fails on dense [2, {}] and emb [2, {}, {}] (this dataset's shape): {}", what, N, T, D,
                                  first_line(e.what())));
  }
  if (out.dim() != 1 || out.size(0) != 2) {
    throw ConfigError(what + ": forward returns a tensor of shape " + c10::str(out.sizes()) +
                      "; it must return one logit per sample ([B])");
  }
  if (out.scalar_type() != torch::kFloat32) {
    throw ConfigError(fmt::format("{}: forward returns {}; it must return float32 logits", what, c10::toString(out.scalar_type())));
  }
  return std::make_shared<ScriptedModel>(std::move(m));
}

}  // namespace

std::shared_ptr<CtrModel> make_model(const ModelConfig& c) {
  if (c.dim == 0 || c.num_tables == 0) throw ConfigError("a model needs at least one table and dim > 0");
  check_pooling(c.pooling);
  if (c.scripted()) return load_model_file(c);
  if (c.kind == "wide-deep") return std::make_shared<WideDeep>(c);
  if (c.kind == "deepfm") return std::make_shared<DeepFm>(c);
  if (c.kind == "dcn") return std::make_shared<Dcn>(c);
  if (c.kind == "dlrm") return std::make_shared<Dlrm>(c);
  if (c.kind == "dcnv2") return std::make_shared<DcnV2>(c);
  throw ConfigError("--model '" + c.kind + "': choose wide-deep, deepfm, dcn, dcnv2 or dlrm (or give --model-file)");
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

void check_model_file(const std::string& file) { open_model_file(file, ""); }

torch::jit::Module scripted_copy(CtrModel& model) {
  auto* scripted = dynamic_cast<ScriptedModel*>(&model);
  if (scripted == nullptr) throw ConfigError("not a model from a TorchScript file");
  torch::jit::Module copy = scripted->module().deepcopy();
  copy.to(torch::kCPU);
  copy.eval();
  return copy;
}

}  // namespace ember::worker
