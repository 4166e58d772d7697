// CTR models in LibTorch, all taking the dense features and one embedding per table and
// returning one logit per sample (trained with BCE on logits):
//   wide-deep  linear(x) + MLP(x)                       x = [dense, flattened embeddings]
//   deepfm     linear(x) + FM(embeddings) + MLP(x)
//   dcn        cross network (x0 * (x_l . w_l) + b_l + x_l) beside an MLP, then linear
//   dcnv2      bottom MLP(dense) -> dim beside the embeddings, low-rank cross layers, top MLP
//   dlrm       bottom MLP(dense) -> dim, pairwise dots of it and the embeddings, top MLP
// or a TorchScript module of the same contract written in Python (--model-file).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/worker/model_config.h"

namespace ember::worker {

class CtrModel : public torch::nn::Module {
 public:
  // dense: [B, num_dense], emb: [B, num_tables, dim] -> logits [B].
  virtual torch::Tensor forward(const torch::Tensor& dense, const torch::Tensor& emb) = 0;
};

// Parameters initialized from LibTorch's generator: seed it (torch::manual_seed) first so
// every worker builds the same model; a model file's initial values are the file's.
// Throws ConfigError for an unknown kind, and for a model file that is missing, is not
// TorchScript, has another forward signature, returns another shape or dtype on this
// dataset's shape, has no parameters, or is not the file it was trained from.
std::shared_ptr<CtrModel> make_model(const ModelConfig& config);

// A model file's module with the model's current parameters, on the CPU, in eval mode
// (ember-export writes it). ConfigError for a built-in model.
torch::jit::Module scripted_copy(CtrModel& model);

// The dense optimizer `name` (sgd or adagrad) over `params`; ConfigError otherwise.
std::unique_ptr<torch::optim::Optimizer> make_dense_optimizer(const std::string& name, std::vector<torch::Tensor> params, float lr);

// The model's parameters, flattened in named_parameters order, on the host.
std::vector<float> flatten_params(CtrModel& model);
// The inverse: `values` (flatten_params' order) into the model's parameters. DataError
// when their number differs from the model's.
void load_flat_params(CtrModel& model, const std::vector<float>& values);

}  // namespace ember::worker
