// Serving deltas (ember-ps --serving-deltas): with each checkpoint a shard writes, beside
// its checkpoint file, the rows that changed since its previous save (or the checkpoint it
// was restored from), for a serving process to apply to the model it holds
// (ember-serve). A checkpoint file keeps what a resume needs (keys, ids, optimizer state;
// whole every K); a delta keeps what scoring needs, and every checkpoint has one, so a
// follower goes from version to version through whole checkpoints too.
//
//   ROOT/iter-000000012/shard-0-of-2.delta   (the .ckpt is written under a staging name,
//                                             then the delta, then the .ckpt renamed in:
//                                             a manifest means every delta is there)
//
// A delta file: a 96-byte header (magic EMBRDLTA, version, dim, shard, shards, num_keys,
// iteration, previous, flags, rows updated, rows created, slots freed, the stored checksum
// of the shard's checkpoint file of `previous` (which run's checkpoint it follows) and of
// the one written with it), then one record a
// changed slot in ascending order, then a checksum of all before it. A record is a varint
// (gap << 2 | kind), the gap counting the slots skipped since the last record; kind 0: the
// row (dim float32) of the id the slot held before; 1: a new id (uint64) and its row;
// 2: the slot freed (nothing follows). Values are absolute, not increments: applying a
// row twice, or one that did not change, is harmless.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "ember/common/types.h"

namespace ember::ps {

// shard-S-of-N.delta
std::string delta_file_name(std::uint32_t shard, std::uint32_t shards);

enum class DeltaKind : std::uint8_t { kRow = 0, kNewId = 1, kFreed = 2 };

struct DeltaInfo {
  std::uint32_t dim = 0, shard = 0, shards = 1;
  std::uint64_t num_keys = 0;  // rows (slots) of all shards
  std::int64_t iteration = -1;
  // The iteration of the state the delta applies to: the shard's save before, or the
  // checkpoint it restored; kNoPrevious after a fresh start (nothing to apply it to).
  std::int64_t previous = kNoPrevious;
  // The stored checksum of the shard's checkpoint file of `previous` (checkpoint_checksum):
  // a checkpoint of the same iteration written by another run (a restart from an older
  // one, a new job in the same directory) has another, and the delta does not apply to it.
  std::uint64_t previous_sum = 0;
  // The stored checksum of the checkpoint file written with this delta: a follower takes
  // the delta only beside that very file (not a rewrite of the directory by another run).
  std::uint64_t own_sum = 0;
  bool hashed_ids = false;
  std::uint64_t updated = 0, created = 0, freed = 0;
  std::uint64_t bytes = 0;  // the file's size
  static constexpr std::int64_t kNoPrevious = -2;
};

// Builds one shard's delta in memory (it holds the changed rows only) and writes it whole
// (temp + rename). Records go in ascending local slot order.
class DeltaWriter {
 public:
  DeltaWriter(const DeltaInfo& header) : info_(header) {}
  // Local slot `local` (key local * shards + shard): kRow and kNewId carry dim floats.
  void add(std::uint64_t local, DeltaKind kind, std::uint64_t id, const float* row);
  // Returns the header written (counts and bytes filled in).
  DeltaInfo write(const std::filesystem::path& file);

 private:
  DeltaInfo info_;
  std::string body_;
  std::uint64_t next_ = 0;  // the slot after the last record's
};

// Reads a delta file whole, checks its size and checksum, and hands each record to
// `take` (key, kind, id: kNoId unless kNewId, row: dim floats or null for kFreed).
// DataError naming the file for a truncated or corrupt one.
using DeltaRecord = std::function<void(Key key, DeltaKind kind, std::uint64_t id, const float* row)>;
DeltaInfo read_delta(const std::filesystem::path& file, const DeltaRecord& take);
// The header alone (counts, iteration, previous); DataError if it is not a delta.
DeltaInfo delta_info(const std::filesystem::path& file);

}  // namespace ember::ps
