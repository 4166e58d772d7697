#include "report/evaluation.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/scheduler/global_batch.h"
#include "ember/worker/embedding_path.h"
#include "ember/worker/metrics.h"

namespace ember::worker {

namespace fs = std::filesystem;

Evaluation evaluate(const data::Dataset& ds, const TrainConfig& c, ps::PsClient& client, CtrModel& model, torch::Device device,
                    std::uint32_t dim, std::uint64_t iteration) {
  Evaluation result;
  const auto& val = ds.split(data::Split::kVal);
  if (val.rows() == 0) {
    spdlog::warn("no validation split in {}: skipping evaluation (ember-data prep --val-fraction)", c.dataset);
    return result;
  }
  torch::NoGradGuard no_grad;
  data::BatchOptions bo;
  bo.batch_size = scheduler::kValidationBatch;  // as scheduler::validation_rows reads
  bo.drop_last = false;
  data::BatchReader reader(val, bo);
  std::vector<float> probs;
  std::vector<std::uint8_t> labels;
  const std::uint32_t T = c.model.num_tables, D = c.model.num_dense;
  const auto offsets = ds.manifest().table_offsets();
  EmbeddingPath path(torch::kCPU, c.model.pooling);
  // Batches read in chunks; each chunk's distinct rows read from the PS once (a row
  // repeats across the batches of a validation set), then pooled from there.
  constexpr std::size_t kChunkBatches = 64;
  std::vector<data::Batch> chunk;
  std::vector<std::vector<Key>> keys;
  std::vector<std::vector<std::uint32_t>> bags;
  std::vector<Key> distinct;
  std::vector<float> rows, dense;
  std::vector<std::uint32_t> ids;
  std::vector<const float*> pointers;
  U64Map<std::uint32_t> index;
  bool more = true;
  while (more) {
    chunk.clear();
    keys.clear();
    bags.clear();
    distinct.clear();
    index.clear();
    std::uint64_t taken = probs.size();
    while (chunk.size() < kChunkBatches) {
      data::Batch b;
      if (!reader.next(b)) {
        more = false;
        break;
      }
      std::size_t n = b.size();
      if (c.eval_samples > 0) n = std::min<std::size_t>(n, c.eval_samples - taken);
      if (n == 0) {
        more = false;
        break;
      }
      keys.emplace_back();
      bags.emplace_back();
      scheduler::global_keys(b, n, offsets, keys.back(), bags.back());
      for (Key k : keys.back())
        if (index.try_emplace(k, static_cast<std::uint32_t>(distinct.size())).second) distinct.push_back(k);
      chunk.push_back(std::move(b));
      taken += n;
    }
    if (chunk.empty()) break;
    client.read(distinct, rows, false, iteration);
    pointers.resize(distinct.size());
    for (std::size_t j = 0; j < distinct.size(); ++j) pointers[j] = rows.data() + j * dim;
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      const auto rows_n = static_cast<std::int64_t>(bags[i].empty() ? keys[i].size() / T : (bags[i].size() - 1) / T);
      ids.resize(keys[i].size());
      for (std::size_t j = 0; j < ids.size(); ++j) ids[j] = *index.find(keys[i][j]);
      dense.resize(static_cast<std::size_t>(rows_n) * D);
      for (std::int64_t r = 0; r < rows_n; ++r) {
        std::memcpy(&dense[static_cast<std::size_t>(r) * D], chunk[i].dense(static_cast<std::size_t>(r)), D * sizeof(float));
        labels.push_back(chunk[i].label(static_cast<std::size_t>(r)));
      }
      const torch::Tensor emb = path.forward(ids, bags[i], pointers, dim).view({rows_n, static_cast<std::int64_t>(T), dim}).to(device);
      auto x = torch::from_blob(dense.data(), {rows_n, static_cast<std::int64_t>(D)}, torch::kFloat32).to(device);
      auto p = torch::sigmoid(model.forward(x, emb)).to(torch::kCPU).contiguous();
      probs.insert(probs.end(), p.data_ptr<float>(), p.data_ptr<float>() + rows_n);
    }
  }
  result.ran = true;
  result.auc = auc(probs, labels);
  result.logloss = logloss(probs, labels);
  result.samples = probs.size();
  spdlog::info("eval after iteration {}: AUC {:.4f}, logloss {:.4f} on {} validation samples", iteration + 1, result.auc, result.logloss,
               result.samples);
  return result;
}

void dump_model(const TrainConfig& c, ps::PsClient& client, CtrModel& model, std::uint64_t num_keys, std::uint32_t dim,
                std::uint64_t iteration) {
  fs::create_directories(c.dump_dir);
  auto dense = flatten_params(model);
  write_file_atomic(fs::path(c.dump_dir) / "dense.bin", std::string_view(reinterpret_cast<const char*>(dense.data()), dense.size() * 4));
  const std::uint64_t N = num_keys;
  if (N * dim * 4 > (std::uint64_t{4} << 30)) throw ConfigError("--dump-dir: the tables are over 4 GiB; use the PS checkpoints instead");
  std::string rows;
  rows.reserve(N * dim * 4);
  std::vector<Key> keys;
  std::vector<float> out;
  for (Key k0 = 0; k0 < N; k0 += 65536) {
    keys.clear();
    for (Key k = k0; k < std::min<Key>(N, k0 + 65536); ++k) keys.push_back(k);
    client.read(keys, out, false, iteration);
    rows.append(reinterpret_cast<const char*>(out.data()), out.size() * 4);
  }
  write_file_atomic(fs::path(c.dump_dir) / "rows.bin", rows);
  nlohmann::json meta = {{"dim", dim},
                         {"num_keys", N},
                         {"dense_floats", dense.size()},
                         {"iterations", iteration + 1},
                         {"model", c.model.kind},
                         {"model_config", nlohmann::json::parse(model_config_json(c.model))}};
  write_file_atomic(fs::path(c.dump_dir) / "model.json", meta.dump(2) + "\n");
  spdlog::info("model written to {} ({} dense floats, {} rows)", c.dump_dir, dense.size(), N);
}

}  // namespace ember::worker
