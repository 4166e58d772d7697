// What an export, and ember-serve's model, is made from (export.cc): a checkpoint's rows
// and dense state, or a --dump-dir, as one model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/serve/export.h"

namespace ember::serve {

struct Source {
  std::string what;
  ModelConfig config;
  std::shared_ptr<CtrModel> model;
  std::int64_t iterations = -1;
  std::uint64_t num_keys = 0;  // rows of all tables
  std::uint64_t rows_stored = 0;
  std::uint32_t shards = 1;               // a checkpoint's shards (keys in their layout)
  std::vector<std::uint64_t> shard_sums;  // each shard's checkpoint file's checksum (ps::checkpoint_checksum)
  // Row `key` (global) of the model: dim floats.
  std::function<const float*(std::uint64_t key)> row;
  std::shared_ptr<void> keep;  // what `row` reads from
  nlohmann::ordered_json origin;
  // Dynamic tables (a dataset of hashed ids): each slot's id, kNoId if free.
  std::vector<std::uint64_t> slot_ids;
  std::filesystem::path dense_dir;  // from_checkpoint(): where the workers' dense states are
};

// Dynamic tables: each table's live (id, slot) pairs, by ascending id (the export's and
// ember-serve's row order). DataError naming the slot of an id beyond `tables`.
std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> ids_by_table(const Source& s, std::size_t tables);

// A launcher's --checkpoint-dir (ps/ and dense/) or the shards' root with `dense`: where
// the shards' and the workers' parts are. ConfigError without a dense directory.
struct CheckpointPaths {
  std::filesystem::path ps_root, dense;
};
CheckpointPaths checkpoint_paths(const std::filesystem::path& checkpoint, std::filesystem::path dense);

// The newest whole checkpoint under `checkpoint` (or the one it names) with the workers'
// dense state of its iteration.
Source from_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& dense);

// The dense state of `iteration` under `dense` (a worker's --checkpoint-dir, or a file).
std::filesystem::path dense_file_of(const std::filesystem::path& dense, std::int64_t iteration);

// The manifest of the data the model was trained on: the dataset's (its vocabulary's
// bytes into `vocab_bytes`), or a stream's (data::stream_manifest: hashed ids).
data::Manifest trained_on(const ExportOptions& o, std::string& vocab_bytes);

}  // namespace ember::serve
