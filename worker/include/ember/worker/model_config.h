// A CTR model's shape (kind and layers), without LibTorch: what the configuration and
// the checkpoints carry (model.h builds the model from it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::worker {

struct ModelConfig {
  std::string kind = "dlrm";  // wide-deep, deepfm, dcn, dlrm
  std::uint32_t num_dense = 13;
  std::uint32_t num_tables = 26;
  std::uint32_t dim = 16;
  std::vector<std::int64_t> bottom = {512, 256, 64};  // dlrm: dense -> ... -> dim
  std::vector<std::int64_t> top = {512, 256};         // dlrm: interactions -> ... -> 1
  std::vector<std::int64_t> deep = {400, 400, 400};   // wide-deep, deepfm, dcn
  int cross_layers = 3;                               // dcn
};

// "512-256-64" -> {512, 256, 64}; ConfigError otherwise ("" -> {}).
std::vector<std::int64_t> parse_layers(const std::string& text, const std::string& flag);

// A model's configuration as JSON text (kind, num_dense, num_tables, dim, bottom, top,
// deep, cross_layers), written beside its weights so that they can be read back without
// the command line that trained them; and back (DataError naming `origin`).
std::string model_config_json(const ModelConfig& config);
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin);

}  // namespace ember::worker
