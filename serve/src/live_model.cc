#include "live_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"
#include "ember/data/hashed_ids.h"
#include "ember/ps/checkpoints.h"
#include "ember/worker/dense_state.h"

namespace ember::serve {

namespace fs = std::filesystem;

LiveModel::LiveModel(const ExportOptions& o) {
  std::string vocab_bytes;
  const data::Manifest dm = trained_on(o, vocab_bytes);
  const Source s = from_checkpoint(o.checkpoint, o.dense);
  dense_dir_ = s.dense_dir;
  if (s.config.num_tables != dm.tables.size() || s.config.num_dense != dm.dense_names.size()) {
    throw DataError(s.what + ": a model of " + std::to_string(s.config.num_tables) + " tables and " + std::to_string(s.config.num_dense) +
                    " dense features, the data it serves has " + std::to_string(dm.tables.size()) + " and " +
                    std::to_string(dm.dense_names.size()));
  }
  if (dm.hashed_ids == s.slot_ids.empty())
    throw DataError(s.what + ": its ids and the data's differ (hashed and vocabulary ids): another dataset or --stream-format?");
  if (!dm.hashed_ids && s.num_keys != dm.total_table_rows()) {
    throw DataError(s.what + ": " + std::to_string(s.num_keys) + " rows, the dataset's tables have " +
                    std::to_string(dm.total_table_rows()) + " (another dataset?)");
  }
  ExportedModel& m = model_;
  m.dir_ = o.checkpoint;
  m.config_ = s.config;
  m.format_ = data::parse_source_format(dm.source_format);
  m.iterations_ = s.iterations;
  m.multi_hot_sep_ = dm.multi_hot ? dm.multi_hot_sep : 0;
  for (const auto& t : dm.tables) m.table_names_.push_back(t.name);
  m.dense_ = script_model(*s.model, s.config);
  m.dense_.eval();
  source_ = s.what;
  shards_ = s.shards;
  sums_ = s.shard_sums;
  num_keys_ = s.num_keys;
  if (dm.hashed_ids) {
    build_dynamic(s, dm);
    return;
  }
  const std::uint32_t dim = s.config.dim;
  offsets_ = dm.table_offsets();
  for (std::size_t t = 0; t < dm.tables.size(); ++t) {
    const auto rows = static_cast<std::int64_t>(dm.tables[t].rows);
    auto table = torch::empty({rows, static_cast<std::int64_t>(dim)}, torch::kFloat32);
    float* dst = table.data_ptr<float>();
    for (std::int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * dim, s.row(offsets_[t] + static_cast<std::uint64_t>(i)), dim * 4);
    m.tables_.push_back(table);
    m.table_rows_.push_back(dm.tables[t].rows);
  }
  if (dm.vocabulary) m.vocabulary_ = std::make_shared<data::Vocabulary>(data::Vocabulary::of_dataset(o.dataset, dm));
}

// As export.cc's write_dynamic_tables, in memory: each table's live ids, row 0 the zero
// row of ids without one; room to grow for the ids deltas bring.
void LiveModel::build_dynamic(const Source& s, const data::Manifest& dm) {
  const std::uint32_t dim = s.config.dim;
  ExportedModel& m = model_;
  const auto by_table = ids_by_table(s, dm.tables.size());
  slot_ids_ = s.slot_ids;
  free_rows_.assign(by_table.size(), {});
  for (std::size_t t = 0; t < by_table.size(); ++t) {
    const auto& live = by_table[t];
    const auto n = static_cast<std::int64_t>(live.size());
    auto rows = torch::zeros({n + 1 + n / 2 + 64, static_cast<std::int64_t>(dim)}, torch::kFloat32);
    float* dst = rows.data_ptr<float>();
    U64Map<std::uint32_t>& map = m.id_rows_.emplace_back();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto& [id, slot] = live[static_cast<std::size_t>(i)];
      std::memcpy(dst + (i + 1) * dim, s.row(slot), dim * 4);
      map.try_emplace(id, static_cast<std::uint32_t>(i + 1));
    }
    m.tables_.push_back(rows);
    m.table_rows_.push_back(static_cast<std::uint64_t>(n + 1));
    used_rows_.push_back(static_cast<std::uint32_t>(n + 1));
  }
}

std::optional<ModelUpdate> LiveModel::read_update(const fs::path& dir, std::int64_t iteration, std::int64_t after,
                                                  const std::vector<std::uint64_t>& after_sums) const {
  const std::uint32_t dim = model_.config_.dim;
  const bool hashed = !slot_ids_.empty();
  ModelUpdate u;
  u.iteration = iteration;
  try {
    std::vector<fs::path> files;
    for (std::uint32_t shard = 0; shard < shards_; ++shard) {
      files.push_back(dir / ps::delta_file_name(shard, shards_));
      std::error_code ec;
      if (!fs::exists(files.back(), ec)) return std::nullopt;  // no deltas (or another shard layout)
      const ps::DeltaInfo info = ps::delta_info(files.back());
      if (info.previous != after || info.previous_sum != after_sums.at(shard) || info.iteration != iteration ||
          info.num_keys != num_keys_ || info.dim != dim || info.hashed_ids != hashed || info.shard != shard || info.shards != shards_)
        return std::nullopt;
      // The checkpoint file beside it must be the one written with it (not another run's
      // rewrite of the directory): what the next delta follows.
      if (ps::checkpoint_checksum(dir / ps::checkpoint_file_name(shard, shards_)) != info.own_sum) return std::nullopt;
      u.sums.push_back(info.own_sum);
    }
    for (const fs::path& f : files) {
      u.bytes += ps::read_delta(f, [&](Key key, ps::DeltaKind kind, std::uint64_t id, const float* row) {
                   if (!hashed && kind != ps::DeltaKind::kRow)
                     throw DataError(f.string() + ": an id's record in a delta of vocabulary ids");
                   u.rows.push_back({key, kind, id});
                   if (row != nullptr) u.values.insert(u.values.end(), row, row + dim);
                 }).bytes;
    }
  } catch (const Error& e) {  // a corrupt or vanished delta or checkpoint file
    spdlog::warn("ember-serve: {}: loading the newest checkpoint whole", e.what());
    return std::nullopt;
  }
  return u;
}

void LiveModel::read_dense(ModelUpdate& u) const {
  const fs::path dense_file = dense_file_of(dense_dir_, u.iteration);
  worker::DenseState st = worker::read_dense_state(dense_file);
  if (st.model.dim != model_.config_.dim || st.model.num_tables != model_.config_.num_tables ||
      st.meta.value("iteration", std::int64_t{-1}) != u.iteration)
    throw DataError(dense_file.string() + ": not the dense state of iteration " + std::to_string(u.iteration) + " of this model");
  u.dense = script_model(*st.weights, st.model);
  u.dense->eval();
  u.dense_file = dense_file.string();
}

std::uint32_t LiveModel::take_row(unsigned t) {
  if (!free_rows_[t].empty()) {
    const std::uint32_t r = free_rows_[t].back();
    free_rows_[t].pop_back();
    return r;
  }
  torch::Tensor& table = model_.tables_[t];
  if (used_rows_[t] == table.size(0)) {  // full: twice the room
    auto bigger = torch::zeros({table.size(0) * 2, table.size(1)}, torch::kFloat32);
    bigger.narrow(0, 0, table.size(0)).copy_(table);
    table = bigger;
  }
  model_.table_rows_[t] = used_rows_[t] + 1;
  return used_rows_[t]++;
}

void LiveModel::apply(std::vector<ModelUpdate>& updates) {
  const std::uint32_t dim = model_.config_.dim;
  const auto copy = [&](unsigned t, std::uint64_t row, const float* values) {
    std::memcpy(model_.tables_[t].data_ptr<float>() + row * dim, values, dim * sizeof(float));
  };
  for (ModelUpdate& u : updates) {
    const float* values = u.values.data();
    if (slot_ids_.empty()) {
      for (const ModelUpdate::Row& r : u.rows) {
        const auto t = static_cast<unsigned>(std::upper_bound(offsets_.begin(), offsets_.end(), r.key) - offsets_.begin() - 1);
        copy(t, r.key - offsets_[t], values);
        values += dim;
      }
    } else {
      // First the ids that leave their slots (freed, or a new id there), then the rows:
      // an id may move from a slot to one before it.
      for (const ModelUpdate::Row& r : u.rows) {
        const std::uint64_t old = slot_ids_[r.key];
        if (r.kind == ps::DeltaKind::kRow || old == kNoId) continue;
        const unsigned t = data::hashed_id_table(old);
        std::uint32_t row = 0;
        if (model_.id_rows_[t].erase(old, row)) free_rows_[t].push_back(row);
        slot_ids_[r.key] = kNoId;
      }
      for (const ModelUpdate::Row& r : u.rows) {
        if (r.kind == ps::DeltaKind::kFreed) continue;
        const std::uint64_t id = r.kind == ps::DeltaKind::kNewId ? r.id : slot_ids_[r.key];
        const unsigned t = id == kNoId ? 0 : data::hashed_id_table(id);
        if (id == kNoId || t >= model_.tables_.size())
          throw DataError("the delta of iteration " + std::to_string(u.iteration) + " updates slot " + std::to_string(r.key) +
                          ", which holds no id in the model served (or an id of no table)");
        std::uint32_t row = 0;
        if (r.kind == ps::DeltaKind::kNewId) {
          slot_ids_[r.key] = id;
          row = take_row(t);
          const auto [at, fresh] = model_.id_rows_[t].try_emplace(id, row);
          if (!fresh) free_rows_[t].push_back(std::exchange(*at, row));
        } else if (const std::uint32_t* at = model_.id_rows_[t].find(id)) {
          row = *at;
        } else {
          throw DataError("the delta of iteration " + std::to_string(u.iteration) + " updates id " + std::to_string(id) +
                          ", which has no row in the model served");
        }
        copy(t, row, values);
        values += dim;
      }
    }
    if (u.dense) model_.dense_ = std::move(*u.dense);
    model_.iterations_ = u.iteration;
    sums_ = u.sums;
  }
}

}  // namespace ember::serve
