#include "report/evaluation.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "ember/common/byte_io.h"
#include "ember/common/distinct_keys.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/scheduler/global_batch.h"
#include "ember/worker/embedding_path.h"
#include "ember/worker/metrics.h"

namespace ember::worker {

namespace fs = std::filesystem;

namespace {

// Batches read in chunks; each chunk's distinct rows are read from the PS once (a row
// repeats across the batches of a validation set), then pooled from there.
constexpr std::size_t kChunkBatches = 64;

struct EvalChunk {
  std::vector<data::Batch> batches;
  std::vector<std::size_t> sizes;                // samples read of each batch
  std::vector<std::vector<std::uint32_t>> ids;   // each key's place among `distinct`
  std::vector<std::vector<std::uint32_t>> bags;  // global_keys' bags
  std::vector<Key> distinct;
  U64Map<std::uint32_t> index;

  // Up to kChunkBatches batches from `reader`, ids through `dir` (dynamic tables); false
  // when none was left.
  bool read(scheduler::ValidationReader& reader, const scheduler::KeyDirectory* dir, std::uint32_t tables) {
    batches.clear();
    sizes.clear();
    ids.clear();
    bags.clear();
    distinct.clear();
    index.clear();
    std::vector<Key> keys;
    data::Batch b;
    std::size_t n = 0;
    while (batches.size() < kChunkBatches) {
      bags.emplace_back();
      if (!reader.next(b, n, keys, bags.back())) {
        bags.pop_back();
        break;
      }
      if (dir != nullptr) dir->lookup(keys, bags.back(), static_cast<std::uint32_t>(n), tables);
      number_distinct(keys, index, distinct, ids.emplace_back());
      batches.push_back(std::move(b));
      sizes.push_back(n);
    }
    return !batches.empty();
  }
};

// The chunk's distinct rows, each from `held` or else read from the PS (in one read).
void read_rows(const EvalChunk& chunk, const HeldRows& held, ps::PsClient& client, std::uint32_t dim, std::uint64_t iteration,
               std::vector<float>& rows, std::vector<const float*>& pointers) {
  std::vector<Key> from_ps;
  std::vector<std::size_t> at;  // their places among `distinct`
  pointers.resize(chunk.distinct.size());
  for (std::size_t j = 0; j < pointers.size(); ++j) {
    pointers[j] = held.size() > 0 ? held.find(chunk.distinct[j]) : nullptr;
    if (pointers[j] == nullptr) {
      from_ps.push_back(chunk.distinct[j]);
      at.push_back(j);
    }
  }
  if (!from_ps.empty()) client.read(from_ps, rows, false, iteration);
  for (std::size_t i = 0; i < at.size(); ++i) pointers[at[i]] = rows.data() + i * dim;
}

}  // namespace

Evaluation evaluate(const data::Dataset& ds, const TrainConfig& c, ps::PsClient& client, CtrModel& model, torch::Device device,
                    std::uint32_t dim, std::uint64_t iteration, const HeldRows& held, const scheduler::KeyDirectory* directory) {
  Evaluation result;
  if (ds.split(data::Split::kVal).rows() == 0) {
    if (c.stream.empty()) {
      spdlog::warn("no validation split in {}: skipping evaluation (ember-data prep --val-fraction)", c.dataset);
    } else {
      spdlog::info("--stream: no validation split to evaluate; --progressive-window scores each batch before it trains");
    }
    return result;
  }
  torch::NoGradGuard no_grad;
  scheduler::ValidationReader reader(ds, c.eval_samples);
  std::vector<float> probs, rows, dense;
  std::vector<std::uint8_t> labels;
  std::vector<const float*> pointers;
  const std::uint32_t T = c.model.num_tables, D = c.model.num_dense;
  EmbeddingPath path(torch::kCPU, c.model.pooling);
  EvalChunk chunk;
  if (ds.manifest().hashed_ids && directory == nullptr) throw Error("an evaluation of hashed ids needs the job's key directory");
  while (chunk.read(reader, directory, T)) {
    read_rows(chunk, held, client, dim, iteration, rows, pointers);
    for (std::size_t i = 0; i < chunk.batches.size(); ++i) {
      const auto n = static_cast<std::int64_t>(chunk.sizes[i]);
      dense.resize(static_cast<std::size_t>(n) * D);
      for (std::int64_t r = 0; r < n; ++r) {
        std::memcpy(&dense[static_cast<std::size_t>(r) * D], chunk.batches[i].dense(static_cast<std::size_t>(r)), D * sizeof(float));
        labels.push_back(chunk.batches[i].label(static_cast<std::size_t>(r)));
      }
      const torch::Tensor emb =
          path.forward(chunk.ids[i], chunk.bags[i], pointers, dim).view({n, static_cast<std::int64_t>(T), dim}).to(device);
      auto x = torch::from_blob(dense.data(), {n, static_cast<std::int64_t>(D)}, torch::kFloat32).to(device);
      auto p = torch::sigmoid(model.forward(x, emb)).to(torch::kCPU).contiguous();
      probs.insert(probs.end(), p.data_ptr<float>(), p.data_ptr<float>() + n);
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
                std::uint64_t iteration, const scheduler::KeyDirectory* directory) {
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
  if (directory != nullptr) {
    std::string ids;
    ids.reserve(N * 8);
    for (Key k = 0; k < N; ++k) put(ids, directory->id_of(k));
    write_file_atomic(fs::path(c.dump_dir) / "slot_ids.bin", ids);
  }
  nlohmann::json meta = {{"dim", dim},
                         {"num_keys", N},
                         {"dense_floats", dense.size()},
                         {"iterations", iteration + 1},
                         {"model", c.model.kind},
                         {"model_config", nlohmann::json::parse(model_config_json(c.model))}};
  if (directory != nullptr) meta["slot_ids"] = "slot_ids.bin";
  write_file_atomic(fs::path(c.dump_dir) / "model.json", meta.dump(2) + "\n");
  spdlog::info("model written to {} ({} dense floats, {} rows)", c.dump_dir, dense.size(), N);
}

}  // namespace ember::worker
