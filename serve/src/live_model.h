// ember-serve's model: a whole checkpoint built in memory (as ember-export then
// ExportedModel::load would give it), then taken from version to version by the shards'
// serving deltas (ps/serving_delta.h) and each version's dense state, so that a new
// version costs its changed rows and the dense weights, not the tables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/common/types.h"
#include "ember/ps/serving_delta.h"
#include "ember/serve/export.h"
#include "model_source.h"

namespace ember::serve {

// One version's change, read and checked before it is applied (outside the lock that
// scoring holds).
struct ModelUpdate {
  std::int64_t iteration = -1;
  struct Row {
    Key key;
    ps::DeltaKind kind;
    std::uint64_t id;
  };
  std::vector<Row> rows;                    // every shard's records
  std::vector<float> values;                // dim floats for each record that is not kFreed, in order
  std::vector<std::uint64_t> sums;          // each shard's checkpoint file of `iteration`: what the next delta follows
  std::optional<torch::jit::Module> dense;  // the last of a run of updates only
  std::uint64_t bytes = 0;                  // the deltas' files
  std::string dense_file;
};

class LiveModel {
 public:
  // The newest whole checkpoint under o.checkpoint (export_model's options, no output).
  explicit LiveModel(const ExportOptions& o);

  ExportedModel& model() { return model_; }
  std::int64_t iteration() const { return model_.iterations_; }
  const std::string& source() const { return source_; }

  // The version held: its iteration and each shard's checkpoint file's checksum.
  std::int64_t held() const { return model_.iterations_; }
  const std::vector<std::uint64_t>& held_sums() const { return sums_; }
  // Checkpoint `dir` of `iteration` as a change of version `after` (whose shards' files
  // have checksums `after_sums`): every shard's delta there follows that very checkpoint,
  // in this model's layout. None when one does not (missing, corrupt, of another
  // version, run or shard layout): load the newest whole.
  std::optional<ModelUpdate> read_update(const std::filesystem::path& dir, std::int64_t iteration, std::int64_t after,
                                         const std::vector<std::uint64_t>& after_sums) const;
  // The dense state of the update's iteration, scripted (the dense state's errors).
  void read_dense(ModelUpdate& u) const;
  // Applies updates read on this model's version, in order. DataError if the rows do not
  // fit the model held (then it is half changed: load a whole checkpoint).
  void apply(std::vector<ModelUpdate>& updates);

 private:
  void build_dynamic(const Source& s, const data::Manifest& dm);
  // A free row of table t (its tensor grows by doubling).
  std::uint32_t take_row(unsigned t);

  std::filesystem::path dense_dir_;
  ExportedModel model_;
  std::string source_;
  std::uint32_t shards_ = 0;         // the shard layout of the checkpoint loaded
  std::vector<std::uint64_t> sums_;  // the held version's shard files' checksums
  std::uint64_t num_keys_ = 0;
  std::vector<std::uint64_t> offsets_;                 // vocabulary tables: each table's first key
  std::vector<std::uint64_t> slot_ids_;                // dynamic tables: each slot's id (kNoId: free)
  std::vector<std::vector<std::uint32_t>> free_rows_;  // dynamic tables: rows no id holds
  std::vector<std::uint32_t> used_rows_;               // dynamic tables: rows handed out (row 0 the zero row)
};

}  // namespace ember::serve
