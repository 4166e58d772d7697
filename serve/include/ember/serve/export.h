// A trained model as files a user can load (ember-export), and scoring with it
// (ember-predict). An export is a directory:
//
//   manifest.json   format, model kind and layers, dim, tables (name, rows, file), dense
//                   feature names and transform, source format, iterations, vocabulary
//   dense.pt        the dense model as TorchScript (torch.jit.load):
//                   forward(dense [B, num_dense], emb [B, num_tables, dim]) -> logits [B],
//                   probability(dense, emb) -> sigmoid of them
//   tables/NAME.pt  one embedding table per file, a float32 tensor [rows, dim] (torch.load)
//   vocab.bin       the dataset's vocabulary (data/vocabulary.h), when it has one
//
// A sample's embedding input is emb[:, t] = table_t[row of its value of table t].
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/data/dataset.h"
#include "ember/data/schema.h"
#include "ember/data/vocabulary.h"
#include "ember/worker/model.h"

namespace ember::serve {

// The worker's model as the exports build it.
using worker::CtrModel;
using worker::ModelConfig;

inline constexpr std::uint32_t kExportFormatVersion = 1;

// The dense model `model` (of configuration `config`) as a TorchScript module: its
// parameters copied (named as in named_parameters, '.' as '_'), its forward written in
// TorchScript, computing what CtrModel::forward computes, op for op.
torch::jit::Module script_model(CtrModel& model, const ModelConfig& config);

struct ExportOptions {
  // From the PS's checkpoint: one checkpoint's directory, a root of them (the newest
  // whole one, as `ember-ps --restore` picks), or a launcher's --checkpoint-dir (its ps/
  // and dense/). `dense`: the workers' dense state, a --checkpoint-dir of ember-worker or
  // one file; empty: the launcher's dense/ beside ps/.
  std::filesystem::path checkpoint, dense;
  // Or from the final model of ember-worker --dump-dir.
  std::filesystem::path dump;
  std::filesystem::path dataset;     // the prepared dataset the model was trained on
  std::string stream_format;         // or, trained on a stream (--stream): its lines' format
  std::string stream_multi_hot_sep;  // and its bags' separator (empty: one-hot)
  std::filesystem::path output;
  bool overwrite = false;
};

struct ExportReport {
  std::string source;             // what was exported, in words
  std::int64_t iterations = -1;   // iterations trained into the model
  std::uint64_t rows = 0;         // rows of every table
  std::uint64_t rows_stored = 0;  // of them, rows the checkpoint or dump held (the others: initial values)
  std::uint64_t bytes = 0;        // written
};

// Writes the export directory atomically (a temporary directory renamed). Throws
// ConfigError (options, an existing output without overwrite), DataError (a checkpoint,
// dump or dataset that is not whole or does not fit), IoError.
ExportReport export_model(const ExportOptions& options);

// An export, loaded for scoring.
class ExportedModel {
 public:
  // Throws DataError naming what is missing or corrupt.
  static ExportedModel load(const std::filesystem::path& dir);

  const ModelConfig& config() const { return config_; }
  data::SourceFormat source_format() const { return format_; }
  const std::vector<std::string>& table_names() const { return table_names_; }
  const std::vector<std::uint64_t>& table_rows() const { return table_rows_; }
  std::int64_t iterations() const { return iterations_; }
  // The vocabulary; DataError when the export has none (its dataset was prepared without).
  const data::Vocabulary& vocabulary() const;

  // Probabilities of n samples: dense[i * num_dense + d], ids[t][i] (sample i's row of table t).
  std::vector<float> predict(const float* dense, const std::vector<const std::uint32_t*>& ids, std::size_t n) const;
  // Multi-hot: bag (i, t) holds sizes[i * T + t] rows, the bags' rows in that order in
  // `ids`; pooled as the model was trained (config().pooling), the same sums in the same order.
  std::vector<float> predict_bags(const float* dense, const std::vector<std::uint32_t>& sizes, const std::vector<std::uint32_t>& ids,
                                  std::size_t n) const;
  // The separator of the training text's bags; 0: one-hot.
  char multi_hot_sep() const { return multi_hot_sep_; }
  // Dynamic tables (an export of hashed ids): values map to rows through their ids
  // (data/hashed_ids.h) and each table's ids file; an id without a row is row 0, the zero
  // vector training gives it.
  bool hashed_ids() const { return !id_rows_.empty(); }
  // The rows of keys[0..n) (raw values) of `table`, as data::KeyRows.
  void rows_of_values(int table, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows) const;

 private:
  friend class LiveModel;  // ember-serve's: built in memory, then changed by deltas
  std::filesystem::path dir_;
  ModelConfig config_;
  data::SourceFormat format_ = data::SourceFormat::kCriteoTsv;
  std::vector<std::string> table_names_;
  std::vector<std::uint64_t> table_rows_;
  std::int64_t iterations_ = -1;
  char multi_hot_sep_ = 0;
  std::shared_ptr<data::Vocabulary> vocabulary_;
  std::vector<U64Map<std::uint32_t>> id_rows_;  // hashed ids: each table's, id -> row
  // Reads each table's ids (int64, ascending; id i is row i + 1).
  void load_ids(const std::vector<std::string>& files);
  mutable torch::jit::Module dense_;
  std::vector<torch::Tensor> tables_;
};

struct PredictOptions {
  std::filesystem::path model;
  // A text file (plain or gzip) in `format` (empty: the export's source format), or a
  // prepared dataset's split.
  std::filesystem::path input;
  std::string format;
  std::filesystem::path dataset;
  std::string split = "val";
  std::filesystem::path output;  // one probability per line; empty: none
  std::size_t batch = 4096;      // samples per forward pass (the training's evaluation uses 4096)
};

struct PredictReport {
  std::uint64_t samples = 0;
  bool labeled = false;
  double auc = -1, logloss = -1;  // when labeled
  double seconds = 0;
};

// Scores every sample of the input. Bad text: DataError "FILE:LINE: what".
PredictReport predict(const PredictOptions& options);

// The probabilities of raw lines of `format` (with or without their label column; a CSV
// format's first line is its header), each as ember-predict scores it. DataError
// "request:N: what" for a bad line N.
std::vector<float> score_lines(const ExportedModel& model, std::string_view text, data::SourceFormat format);

}  // namespace ember::serve
