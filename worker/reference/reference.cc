// The single-process reference (train_reference) and the dump reader: the baselines the
// equivalence tests and the end-to-end benchmark compare a job with.
#include "reference.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "ember/common/distinct_keys.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/common/process.h"
#include "ember/data/dataset.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/batch_stream.h"
#include "ember/scheduler/global_batch.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/simulator.h"
#include "ember/worker/embedding_path.h"
#include "ember/worker/model.h"

namespace ember::worker {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void fill_model_shape(const data::Dataset& ds, std::uint32_t dim, TrainConfig& c) {
  c.model.num_dense = static_cast<std::uint32_t>(ds.num_dense());
  c.model.num_tables = static_cast<std::uint32_t>(ds.num_tables());
  c.model.dim = dim;
}

// A batch's distinct rows in first-appearance order, each key's place among them, and
// where their values and gradient sums are (the worker's embedding path takes these).
struct DistinctRows {
  U64Map<std::uint32_t> index;
  std::vector<Key> order;
  std::vector<std::uint32_t> ids;
  std::vector<const float*> values;
  std::vector<float*> grads;
  std::vector<float> sums;

  void build(const std::vector<Key>& keys, const std::vector<float>& table, std::uint32_t dim) {
    index.clear();
    order.clear();
    ids.clear();
    number_distinct(keys, index, order, ids);
    values.resize(order.size());
    grads.resize(order.size());
    sums.assign(order.size() * dim, 0.0f);
    for (std::size_t j = 0; j < order.size(); ++j) {
      values[j] = &table[order[j] * dim];
      grads[j] = &sums[j * dim];
    }
  }
};

// Dynamic tables, as a job's loaders and PS shards have them: each batch's ids become
// slots (refused ids leave their bags), the slots made and dropped are reset.
class DynamicSlots {
 public:
  DynamicSlots(const TrainConfig& c, ReferenceSlots slots, std::uint32_t dim, std::uint32_t state)
      : dir_(scheduler::dynamic_table_options(c, slots.shards), slots.slots_per_shard), seed_(c.seed), dim_(dim), state_(state) {}
  std::uint64_t slot_count() const { return dir_.slot_count(); }

  // Batch t's ids to slots; the rows dropped after t - 1, then those made now, reset in
  // `rows` and `states` (ShardStore::reset_rows).
  void admit(std::uint64_t t, scheduler::GlobalBatch& g, const ps::OptimizerConfig& sparse, std::vector<float>& rows,
             std::vector<float>& states) {
    dir_.admit(t, g, &resets_);
    apply_resets(sparse, rows, states);
  }
  // The rows dropped after t, reset at the next batch.
  void end(std::uint64_t t) {
    dropped_.clear();
    dir_.end_iteration(t, &dropped_);
    for (Key k : dropped_) resets_.push_back({k, scheduler::KeyDirectory::kNoId});
  }
  // After the last batch: the rows dropped after it cleared, as a job's final commit does.
  void finish(const ps::OptimizerConfig& sparse, std::vector<float>& rows, std::vector<float>& states) {
    apply_resets(sparse, rows, states);
  }

 private:
  // The resets pending (ShardStore::reset_rows): a made row's initial value, a dropped
  // row's zeros, and a fresh state either way.
  void apply_resets(const ps::OptimizerConfig& sparse, std::vector<float>& rows, std::vector<float>& states) {
    for (const auto& a : resets_) {
      float* row = &rows[a.slot * dim_];
      if (a.id == scheduler::KeyDirectory::kNoId)
        std::fill(row, row + dim_, 0.0f);
      else
        ps::initial_row(seed_, a.id, dim_, row);
      ps::init_state(sparse, dim_, &states[a.slot * state_]);
    }
    resets_.clear();
  }

  scheduler::KeyDirectory dir_;
  std::uint64_t seed_;
  std::uint32_t dim_, state_;
  std::vector<scheduler::SlotAssignment> resets_;
  std::vector<Key> dropped_;
};

}  // namespace

ReferenceResult train_reference(const TrainConfig& config, const ps::OptimizerConfig& sparse, std::uint32_t dim, ReferenceSlots slots) {
  TrainConfig c = config;
  auto ds = scheduler::open_job_data(c.dataset, c);
  fill_model_shape(ds, dim, c);
  const std::uint32_t state = ps::state_floats(sparse.kind, dim), T = c.model.num_tables, D = c.model.num_dense;
  std::optional<DynamicSlots> dir;
  if (!ds.manifest().hashed_ids && slots.shards != 0)
    throw ConfigError("dataset " + c.dataset + " has a vocabulary: the job's slots (--reference-shards) are for hashed ids");
  if (ds.manifest().hashed_ids) {
    if (slots.shards == 0)
      ds.manifest().require_fixed_tables(
          c.dataset, "the one-process reference without the job's slots (ember-worker --reference-shards, --reference-slots-per-shard)");
    dir.emplace(c, slots, dim, state);
  }
  const std::uint64_t N = dir ? dir->slot_count() : ds.manifest().total_table_rows();
  const auto offsets = ds.manifest().table_offsets();
  ReferenceResult r;
  std::vector<float> states(N * state);
  r.rows.resize(N * dim);
  for (Key k = 0; k < N; ++k) {
    ps::initial_row(config.seed, k, dim, &r.rows[k * dim]);
    ps::init_state(sparse, dim, &states[k * state]);
  }
  at::set_num_threads(c.torch_threads);
  torch::manual_seed(c.seed);
  auto model = make_model(c.model);
  auto opt = make_dense_optimizer(c.dense_optimizer, model->parameters(), c.dense_lr);
  scheduler::BatchStream batches = scheduler::job_batches(ds, c, offsets, 0);  // the job's order
  const std::size_t batch_size = static_cast<std::size_t>(c.workers) * c.batch_per_worker;
  data::Batch b;
  scheduler::GlobalBatch g;
  const std::int64_t n = static_cast<std::int64_t>(batch_size);
  std::vector<float> dense(batch_size * D), labels(batch_size);
  EmbeddingPath path(torch::kCPU, c.model.pooling);
  DistinctRows rows;
  Stopwatch clock;
  for (std::uint64_t t = 0; t < c.iterations; ++t) {
    batches.next(b, g);
    if (dir) dir->admit(t, g, sparse, r.rows, states);
    const std::vector<Key>& keys = g.keys;
    const std::vector<std::uint32_t>& bags = g.bags;
    for (std::size_t i = 0; i < batch_size; ++i) {
      std::memcpy(&dense[i * D], b.dense(i), D * sizeof(float));
      labels[i] = static_cast<float>(b.label(i));
    }
    rows.build(keys, r.rows, dim);
    // The worker's embedding path: the model's input pooled from the rows, and each
    // row's gradient summed over the batch in key order.
    torch::Tensor emb = path.forward(rows.ids, bags, rows.values, dim).view({n, static_cast<std::int64_t>(T), dim});
    emb.set_requires_grad(true);
    opt->zero_grad();
    auto logits = model->forward(torch::from_blob(dense.data(), {n, static_cast<std::int64_t>(D)}), emb);
    auto loss = torch::binary_cross_entropy_with_logits(logits, torch::from_blob(labels.data(), {n}), {}, {}, at::Reduction::Sum) /
                static_cast<double>(n);
    loss.backward();
    opt->step();
    r.losses.push_back(loss.item<double>());
    path.backward(rows.ids, bags, emb.grad(), rows.grads, dim);
    // One optimizer step per row.
    for (std::size_t j = 0; j < rows.order.size(); ++j) {
      const Key k = rows.order[j];
      ps::apply(sparse, sparse.lr, dim, &r.rows[k * dim], &states[k * state], &rows.sums[j * dim]);
    }
    if (dir) dir->end(t);
  }
  if (dir) dir->finish(sparse, r.rows, states);
  r.seconds = clock.seconds();
  r.dense = flatten_params(*model);
  return r;
}

ModelDump read_dump(const std::string& dir) {
  ModelDump m;
  auto meta = json::parse(read_file(fs::path(dir) / "model.json"));
  m.dim = meta.at("dim");
  auto load = [&](const char* name, std::vector<float>& out) {
    std::string bytes = read_file(fs::path(dir) / name);
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
  };
  load("dense.bin", m.dense);
  load("rows.bin", m.rows);
  if (meta.contains("slot_ids")) {
    const std::string bytes = read_file(fs::path(dir) / meta.at("slot_ids").get<std::string>());
    m.slot_ids.resize(bytes.size() / sizeof(std::uint64_t));
    std::memcpy(m.slot_ids.data(), bytes.data(), m.slot_ids.size() * sizeof(std::uint64_t));
  }
  return m;
}

}  // namespace ember::worker
