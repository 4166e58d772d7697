// Ember's binary dataset: a directory with manifest.json and shard files per split.
//
// Shard file layout (little-endian, every section 64-byte aligned). One-hot (version 1):
//   ShardHeader | TableColumn[num_tables] | header checksum (u64) | pad
//   labels  u8[rows]
//   dense   f32[rows][num_dense]           (log(1+max(x,0)) already applied)
//   ids[t]  u32 or u64 [rows], per table   (row ids within table t)
// Multi-hot (version 2): a bag of ids per (row, table), sample-major, so that a sample's
// ids are one span (what the scheduler reads) and each bag is a sub-span (what pooling
// reads):
//   ShardHeader | BagSection | header checksum (u64) | pad
//   labels, dense                          (as above)
//   offsets u32[rows * num_tables + 1]     (bag of (r, t): ids [offsets[r*T+t], offsets[r*T+t+1]))
//   ids     u32 or u64 [offsets[rows * num_tables]]  (u64: hashed ids, BagSection::id_bytes)
// The header checksum covers everything before it; payload_checksum covers every byte
// after the header. One-hot columns are contiguous so a batch of one table is one span.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/common/mapped_file.h"

namespace ember::data {

inline constexpr std::uint32_t kDatasetFormatVersion = 1;   // one-hot
inline constexpr std::uint32_t kMultiHotFormatVersion = 2;  // bags of ids
inline constexpr char kShardMagic[8] = {'E', 'M', 'B', 'R', 'S', 'H', 'R', 'D'};

struct ShardHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t header_bytes;  // offset of the first payload byte
  std::uint64_t rows;
  std::uint64_t file_bytes;
  std::uint32_t num_dense;
  std::uint32_t num_tables;
  std::uint64_t labels_offset;
  std::uint64_t dense_offset;
  std::uint64_t payload_checksum;
};
struct TableColumn {
  std::uint64_t offset;
  std::uint32_t id_bytes;  // 4 or 8
  std::uint32_t reserved;
};
struct BagSection {
  std::uint64_t offsets_offset;
  std::uint64_t ids_offset;
  std::uint64_t ids;       // ids in the shard (= offsets[rows * num_tables])
  std::uint64_t id_bytes;  // 8: hashed ids; 4 (or 0, in shards written before hashed ids)
};
static_assert(sizeof(ShardHeader) == 64 && sizeof(TableColumn) == 16 && sizeof(BagSection) == 32);

enum class Split { kTrain = 0, kVal = 1, kTest = 2 };
inline constexpr const char* kSplitNames[3] = {"train", "val", "test"};
Split parse_split(const std::string& name);  // throws ConfigError

struct TableInfo {
  std::string name;
  std::uint64_t rows = 0;         // rows of the embedding table (incl. missing + OOV)
  std::uint32_t id_bytes = 4;     // width of stored ids
  std::uint64_t values_seen = 0;  // distinct raw values in the input
  // Multi-hot datasets: the largest bag and the mean bag size over every split.
  std::uint32_t max_bag = 1;
  double mean_bag = 1.0;
};

struct ShardInfo {
  std::string file;
  std::uint64_t rows = 0;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // payload checksum, as in the shard header
};

// Where a dataset's vocabulary is (vocabulary.h).
struct VocabularyInfo {
  std::string file;  // relative to the dataset directory
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // the file's trailing XXH3-64
};

struct Manifest {
  std::uint32_t format_version = kDatasetFormatVersion;
  std::string source_format;
  std::vector<std::string> inputs;
  std::uint64_t rows[3] = {0, 0, 0};  // train, val, test
  bool has_labels = true;
  std::vector<std::string> dense_names;
  std::vector<TableInfo> tables;
  std::uint64_t shard_rows = 0;
  std::uint64_t min_count = 1;
  bool shuffled = false;
  std::uint64_t seed = 0;
  std::uint64_t bad_lines_skipped = 0;
  // Bags of ids per table (format version 2); false: one id per table (version 1).
  bool multi_hot = false;
  char multi_hot_sep = 0;  // the separator of the text's bags (ember-predict reads text alike)
  std::vector<ShardInfo> shards[3];
  // Raw value -> row of every table (vocabulary.h); none in datasets prepared before
  // prep wrote one.
  std::optional<VocabularyInfo> vocabulary;
  // `prep --ids hash`: every id is hashed_id(table, value) (hashed_ids.h), 8 bytes wide,
  // and the tables are dynamic: no row count, no vocabulary. Collisions: distinct values
  // that share an id with another (possible only among `wide_values`, counted exactly).
  bool hashed_ids = false;
  std::uint64_t hash_collisions = 0;
  std::uint64_t wide_values = 0;

  std::uint64_t total_rows() const { return rows[0] + rows[1] + rows[2]; }
  // Sum of table rows: the size of the global key space.
  std::uint64_t total_table_rows() const;
  // Global key = table_offset(t) + row id.
  std::vector<std::uint64_t> table_offsets() const;
  // Throws ConfigError when the tables are dynamic (hashed ids): `who` (a program or a
  // mode) sizes its state by a fixed key space, which hashed ids do not have.
  void require_fixed_tables(const std::string& dataset, const std::string& who) const;

  std::string to_json() const;
  static Manifest from_json(const std::string& text, const std::string& origin);
};

// Bytes a shard of `rows` rows takes, and where each section starts.
struct ShardLayout {
  std::uint64_t header_bytes = 0;
  std::uint64_t labels_offset = 0;
  std::uint64_t dense_offset = 0;
  std::vector<std::uint64_t> table_offsets;  // one-hot
  bool multi_hot = false;
  std::uint64_t bag_offsets_offset = 0;  // multi-hot
  std::uint64_t bag_ids_offset = 0;
  std::uint64_t bag_ids = 0;
  std::uint32_t bag_id_bytes = 4;
  std::uint64_t file_bytes = 0;
};
ShardLayout shard_layout(std::uint64_t rows, std::uint32_t num_dense, const std::vector<std::uint32_t>& id_bytes);
// A multi-hot shard of `rows` rows of `num_tables` bags holding `ids` ids in all, each
// `id_bytes` (4 or 8) wide.
ShardLayout multi_hot_shard_layout(std::uint64_t rows, std::uint32_t num_dense, std::uint32_t num_tables, std::uint64_t ids,
                                   std::uint32_t id_bytes = 4);

// Fills the header of a shard whose payload is written; computes both checksums.
void finish_shard_header(char* file_base, const ShardLayout& layout, std::uint64_t rows, std::uint32_t num_dense,
                         const std::vector<std::uint32_t>& id_bytes, std::uint64_t payload_checksum);

// The columns of a shard held in memory (a stream's batch, stream.h): what a shard
// file holds after its header, in vectors.
struct ShardColumns {
  std::uint32_t num_dense = 0;
  std::uint32_t num_tables = 0;
  std::vector<std::uint8_t> labels;  // rows
  std::vector<float> dense;          // rows x num_dense
  // One-hot: one id column of rows() ids per table. Multi-hot: `bag_offsets` (rows x
  // num_tables + 1) into `bag_ids`, as a version 2 file's.
  std::vector<std::vector<std::uint64_t>> columns;
  std::vector<std::uint32_t> bag_offsets;
  std::vector<std::uint64_t> bag_ids;
  bool multi_hot() const { return !bag_offsets.empty(); }
  std::uint64_t rows() const { return labels.size(); }
  void clear();  // no rows; the vectors' memory kept
};

// One shard: a mapped file, or columns in memory.
class Shard {
 public:
  // Validates magic, version, header checksum and sizes against the manifest; with
  // `verify_payload` also the payload checksum. Throws DataError naming the file.
  Shard(const std::filesystem::path& path, const Manifest& manifest, const ShardInfo& info, bool verify_payload);
  // Views `columns`, which it keeps (ids 8 bytes wide).
  explicit Shard(ShardColumns columns);
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  std::uint64_t rows() const { return rows_; }
  std::uint8_t label(std::uint64_t r) const { return labels_[r]; }
  const float* dense(std::uint64_t r) const { return dense_ + r * num_dense_; }
  bool multi_hot() const { return bag_offsets_ != nullptr; }
  // The one id of row r in a table of a one-hot shard.
  std::uint64_t id(int table, std::uint64_t r) const {
    const Column& c = cols_[static_cast<std::size_t>(table)];
    return c.bytes == 4 ? reinterpret_cast<const std::uint32_t*>(c.base)[r] : reinterpret_cast<const std::uint64_t*>(c.base)[r];
  }
  // Ids in row r's bag of `table` (1 in a one-hot shard).
  std::uint32_t bag_size(int table, std::uint64_t r) const {
    if (bag_offsets_ == nullptr) return 1;
    const std::uint32_t* o = bag_offsets_ + r * num_tables_ + static_cast<std::uint64_t>(table);
    return o[1] - o[0];
  }
  // Calls f(id) for each id of row r's bag of `table`, in stored order.
  template <typename F>
  void for_each_id(int table, std::uint64_t r, F&& f) const {
    if (bag_offsets_ == nullptr) {
      f(id(table, r));
      return;
    }
    const std::uint32_t* o = bag_offsets_ + r * num_tables_ + static_cast<std::uint64_t>(table);
    if (bag_id_bytes_ == 8) {
      const auto* ids = reinterpret_cast<const std::uint64_t*>(bag_ids_);
      for (std::uint32_t k = o[0]; k < o[1]; ++k) f(ids[k]);
      return;
    }
    const auto* ids = reinterpret_cast<const std::uint32_t*>(bag_ids_);
    for (std::uint32_t k = o[0]; k < o[1]; ++k) f(static_cast<std::uint64_t>(ids[k]));
  }
  // Multi-hot shards: the num_tables + 1 bag offsets of row r (into bag_ids()).
  const std::uint32_t* bag_offsets(std::uint64_t r) const { return bag_offsets_ + r * num_tables_; }
  const std::uint8_t* labels() const { return labels_; }
  // Raw column of table t: `id_bytes(t)`-wide ids, rows() of them.
  const void* column(int table) const { return cols_[static_cast<std::size_t>(table)].base; }
  std::uint32_t id_bytes(int table) const { return cols_[static_cast<std::size_t>(table)].bytes; }

 private:
  struct Column {
    const char* base;
    std::uint32_t bytes;
  };
  MappedFile file_;
  ShardColumns held_;  // a shard in memory
  std::uint64_t rows_ = 0;
  std::uint32_t num_dense_ = 0;
  std::uint64_t num_tables_ = 0;
  const std::uint8_t* labels_ = nullptr;
  const float* dense_ = nullptr;
  std::vector<Column> cols_;                    // one-hot
  const std::uint32_t* bag_offsets_ = nullptr;  // multi-hot
  const char* bag_ids_ = nullptr;
  std::uint32_t bag_id_bytes_ = 4;
};

// All shards of one split, addressed by a split-wide sample index.
class SplitData {
 public:
  SplitData() = default;
  SplitData(std::vector<std::unique_ptr<Shard>> shards, std::uint64_t shard_rows);

  std::uint64_t rows() const { return rows_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const Shard& shard(int i) const { return *shards_[static_cast<std::size_t>(i)]; }
  // Shard and row within it of split-wide sample i (every shard but the last is full).
  const Shard& shard_of(std::uint64_t i, std::uint64_t& row) const {
    std::uint64_t s = i >> shift_;
    row = i & mask_;
    return *shards_[s];
  }

 private:
  std::vector<std::unique_ptr<Shard>> shards_;
  std::uint64_t rows_ = 0;
  int shift_ = 0;
  std::uint64_t mask_ = 0;
};

struct OpenOptions {
  bool verify_checksums = true;  // read every payload byte once at open
};

class Dataset {
 public:
  // Opens a directory written by `ember-data prep`. Throws DataError / IoError.
  static Dataset open(const std::filesystem::path& dir, OpenOptions options = {});
  // A dataset of `manifest`'s shape and no rows: a stream's (stream.h), whose batches come
  // from elsewhere.
  static Dataset without_rows(Manifest manifest);

  const Manifest& manifest() const { return manifest_; }
  const SplitData& split(Split s) const { return splits_[static_cast<int>(s)]; }
  int num_tables() const { return static_cast<int>(manifest_.tables.size()); }
  int num_dense() const { return static_cast<int>(manifest_.dense_names.size()); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  Manifest manifest_;
  SplitData splits_[3];
};

// A global batch: a view of samples of one split. Contiguous batches inside one shard
// expose their columns as plain memory spans (zero-copy); others go through indices.
class Batch {
 public:
  std::size_t size() const { return size_; }
  std::uint64_t index() const { return index_; }  // batch number within the epoch
  bool multi_hot() const {
    if (single_ != nullptr) return single_->multi_hot();
    return split_ != nullptr && split_->num_shards() > 0 && split_->shard(0).multi_hot();
  }
  // Every row of `shard` (a stream's batch), as batch `index`.
  static Batch whole(const Shard& shard, std::uint64_t index);

  std::uint8_t label(std::size_t i) const {
    std::uint64_t r;
    return locate(i, r).label(r);
  }
  const float* dense(std::size_t i) const {
    std::uint64_t r;
    return locate(i, r).dense(r);
  }
  // The one id of sample i in `table` (one-hot datasets).
  std::uint64_t id(int table, std::size_t i) const {
    std::uint64_t r;
    return locate(i, r).id(table, r);
  }
  std::uint32_t bag_size(int table, std::size_t i) const {
    std::uint64_t r;
    return locate(i, r).bag_size(table, r);
  }
  // Calls f(id) for each id of sample i's bag of `table` (one call when one-hot).
  template <typename F>
  void for_each_id(int table, std::size_t i, F&& f) const {
    std::uint64_t r;
    locate(i, r).for_each_id(table, r, f);
  }
  // Split-wide sample index of the i-th sample.
  std::uint64_t sample(std::size_t i) const { return order_ != nullptr ? order_[begin_ + i] : begin_ + i; }

  // Non-null when every sample lies contiguously in one shard: then sample i is row
  // first_row() + i of that shard.
  const Shard* contiguous_shard() const { return single_; }
  std::uint64_t first_row() const { return single_row_; }

 private:
  friend class BatchReader;
  const Shard& locate(std::size_t i, std::uint64_t& row) const {
    if (single_ != nullptr) {
      row = single_row_ + i;
      return *single_;
    }
    return split_->shard_of(sample(i), row);
  }
  const SplitData* split_ = nullptr;
  const std::uint64_t* order_ = nullptr;  // shuffled permutation, or null for file order
  std::uint64_t begin_ = 0;
  std::size_t size_ = 0;
  std::uint64_t index_ = 0;
  const Shard* single_ = nullptr;
  std::uint64_t single_row_ = 0;
};

struct BatchOptions {
  std::size_t batch_size = 1024;
  bool shuffle = false;  // permute samples by `seed` (a new permutation every epoch)
  std::uint64_t seed = 0;
  bool drop_last = true;  // a last partial batch is dropped (BSP needs equal batches)
};

// Iterates the global batches of one split, in dataset order or shuffled by seed.
class BatchReader {
 public:
  BatchReader(const SplitData& split, BatchOptions options);

  // Fills `batch` with the next batch of the current epoch; false at the epoch's end.
  bool next(Batch& batch);
  // Starts epoch `epoch` (shuffled runs draw a new permutation from (seed, epoch)).
  void start_epoch(std::uint64_t epoch);
  std::uint64_t batches_per_epoch() const;

 private:
  const SplitData* split_;
  BatchOptions options_;
  std::vector<std::uint64_t> order_;
  std::uint64_t next_ = 0;
  std::uint64_t batch_index_ = 0;
};

}  // namespace ember::data
