// A CTR model's shape (kind and layers), without LibTorch: what the configuration and
// the checkpoints carry (model.h builds the model from it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::worker {

struct ModelConfig {
  std::string kind = "dlrm";  // wide-deep, deepfm, dcn, dcnv2, dlrm; "file": `file`'s
  std::uint32_t num_dense = 13;
  std::uint32_t num_tables = 26;
  std::uint32_t dim = 16;
  std::vector<std::int64_t> bottom = {512, 256, 64};  // dlrm: dense -> ... -> dim
  std::vector<std::int64_t> top = {512, 256};         // dlrm: interactions -> ... -> 1
  std::vector<std::int64_t> deep = {400, 400, 400};   // wide-deep, deepfm, dcn
  int cross_layers = 3;                               // dcn, dcnv2
  std::int64_t cross_rank = 512;                      // dcnv2: rank of each cross layer
  // A TorchScript module written in Python (ember-worker --model-file): forward(dense,
  // emb) -> logits, its parameters and their initial values its own. Empty: `kind`'s.
  std::string file;
  // model_file_identity(file) when the model was trained, so that a checkpoint or dump
  // is not read back through a file that has changed since.
  std::string file_identity;
  // How a table's bag of rows becomes the one [dim] vector the model sees (multi-hot
  // datasets; a bag of one is its row either way): "sum" or "mean" (an empty bag: zeros).
  std::string pooling = "sum";

  bool scripted() const { return !file.empty(); }
  // What the model is: `kind`, or "file" for a model file.
  std::string effective_kind() const { return scripted() ? "file" : kind; }
};

// A model file as workers and checkpoints compare it: its size and contents' hash
// ("none" for no file). IoError when it cannot be read.
std::string model_file_identity(const std::string& path);

// What can be checked of a model file before the job forms (make_model's checks but the
// probe on the dataset's shape; model.cc, with LibTorch): ConfigError otherwise.
void check_model_file(const std::string& file);

// "sum" or "mean"; ConfigError naming --pooling otherwise.
void check_pooling(const std::string& pooling);

// "512-256-64" -> {512, 256, 64}; ConfigError otherwise ("" -> {}).
std::vector<std::int64_t> parse_layers(const std::string& text, const std::string& flag);

// A model's configuration as JSON text (kind, num_dense, num_tables, dim, bottom, top,
// deep, cross_layers), written beside its weights so that they can be read back without
// the command line that trained them; and back (DataError naming `origin`).
std::string model_config_json(const ModelConfig& config);
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin);

}  // namespace ember::worker
