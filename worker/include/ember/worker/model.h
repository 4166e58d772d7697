// CTR models in LibTorch, all taking the dense features and one embedding per table and
// returning one logit per sample (trained with BCE on logits):
//   wide-deep  linear(x) + MLP(x)                       x = [dense, flattened embeddings]
//   deepfm     linear(x) + FM(embeddings) + MLP(x)
//   dcn        cross network (x0 * (x_l . w_l) + b_l + x_l) beside an MLP, then linear
//   dlrm       bottom MLP(dense) -> dim, pairwise dots of it and the embeddings, top MLP
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
// every worker builds the same model. Throws ConfigError for an unknown kind.
std::shared_ptr<CtrModel> make_model(const ModelConfig& config);

// The dense optimizer `name` (sgd or adagrad) over `params`; ConfigError otherwise.
std::unique_ptr<torch::optim::Optimizer> make_dense_optimizer(const std::string& name, std::vector<torch::Tensor> params, float lr);

// The model's parameters, flattened in named_parameters order, on the host.
std::vector<float> flatten_params(CtrModel& model);
// The inverse: `values` (flatten_params' order) into the model's parameters. DataError
// when their number differs from the model's.
void load_flat_params(CtrModel& model, const std::vector<float>& values);

}  // namespace ember::worker
