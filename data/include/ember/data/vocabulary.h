// A dataset's vocabulary: which raw categorical value has which row of its table, as
// `ember-data prep` assigned them (schema.h: row 0 missing, row 1 OOV, then the values
// kept, by decreasing frequency). Prep writes it into the dataset directory
// (`vocab.bin`, listed in the manifest); `ember-predict` maps raw text through it, so
// that a line is encoded exactly as prep would have encoded it.
//
// A value is known by its key (line_parser.h): Criteo's hexadecimal id as an integer,
// an Avazu field's XXH3-64 hash of its bytes. vocab.bin, little-endian:
//   "EMBRVOCB" | u32 version | u32 tables | per table: u64 values, u32 key bytes (4 or
//   8), u32 0, then `values` keys of that width (the key of row 2, row 3, ...), padded
//   to 8 bytes | u64 XXH3-64 of every byte before it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"

namespace ember::data {

inline constexpr const char* kVocabularyFile = "vocab.bin";

class Vocabulary {
 public:
  using Map = U64Map<std::uint32_t>;  // key -> row

  Vocabulary() = default;
  // Row maps split by hash partition (partition_of) as prep builds them: maps[t][p].
  // Keys mapped to kOovRow (seen too rarely) may be in them.
  explicit Vocabulary(std::vector<std::vector<Map>> maps);

  // Reads a vocabulary file; checks its checksum, its layout and, when given, that it
  // has `expect_tables` tables with `expect_rows[t]` rows each. Throws DataError naming
  // the file, IoError.
  static Vocabulary read(const std::filesystem::path& file, const std::vector<std::uint64_t>& expect_rows = {});
  // The vocabulary of a prepared dataset (its manifest's entry, checked against the
  // size listed and its tables). A dataset prepared before prep wrote vocabularies has
  // none: DataError saying so.
  static Vocabulary of_dataset(const std::filesystem::path& dir, const Manifest& manifest);

  int num_tables() const { return static_cast<int>(maps_.size()); }

  // The row of `key` in table t: kMissingRow for kMissingKey, kOovRow for a value the
  // vocabulary does not keep (unseen, or seen fewer than --min-count times).
  std::uint32_t row(int table, std::uint64_t key) const {
    if (key == kMissingKey) return static_cast<std::uint32_t>(kMissingRow);
    const std::uint64_t h = Map::hash(key);
    const auto& parts = maps_[static_cast<std::size_t>(table)];
    const std::uint32_t* r = parts[partition_of(h, static_cast<unsigned>(parts.size()))].find_hashed(key, h);
    return r == nullptr ? static_cast<std::uint32_t>(kOovRow) : *r;
  }
  // row() of keys[0..n) into out[i * stride], prefetching ahead (big tables miss the
  // cache on nearly every key).
  void rows(int table, const std::uint64_t* keys, std::size_t n, std::uint32_t* out, std::size_t stride = 1) const;

  // Which partition of `parts` owns a key of hash h: the hash's high bits, independent
  // of the low bits that pick its slot.
  static unsigned partition_of(std::uint64_t h, unsigned parts) { return static_cast<unsigned>((h >> 40) % parts); }

 private:
  std::vector<std::vector<Map>> maps_;
};

// Writes a vocabulary file table by table (prep hands over each table's keys once its
// rows are assigned). The file is complete, fsynced, after finish().
class VocabularyWriter {
 public:
  VocabularyWriter(const std::filesystem::path& file, std::uint32_t tables);
  ~VocabularyWriter();
  VocabularyWriter(const VocabularyWriter&) = delete;
  VocabularyWriter& operator=(const VocabularyWriter&) = delete;

  // The next table's kept values: keys[i] has row kFirstValueRow + i.
  void add_table(std::span<const std::uint64_t> keys);
  // Writes the checksum, fsyncs, closes; returns what the manifest lists.
  VocabularyInfo finish();

 private:
  void put(const void* data, std::size_t n);
  std::filesystem::path file_;
  std::uint32_t tables_ = 0, written_ = 0;
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  void* state_ = nullptr;  // XXH3 state
  std::string buf_;
};

// Encoded rows of a piece of text, column by column, as a dataset stores them.
struct EncodedRows {
  std::vector<std::uint8_t> labels;
  std::vector<float> dense;                     // [row][num_dense], transformed (line_parser.h)
  std::vector<std::vector<std::uint32_t>> ids;  // one-hot: [table][row]
  // Multi-hot parsers: each (row, table) bag's size, row-major, and the ids of every
  // bag in that order (the dataset's sample-major layout).
  std::vector<std::uint32_t> bag_sizes;
  std::vector<std::uint32_t> bag_ids;
  std::uint64_t lines = 0;  // lines of the text, blank and bad included
  // The first bad lines (index of the line in the text, from 0; what is wrong), at most
  // `max_bad` of them, and how many there were.
  std::vector<std::pair<std::uint64_t, std::string>> bad;
  std::uint64_t bad_count = 0;
  std::size_t size() const { return labels.size(); }
};

// Encodes every line of `text` (whole lines, the last may lack its newline; blank lines
// skipped; bad ones listed and skipped): the label and dense features by `parser`, the
// categorical values mapped to rows by `vocabulary`. What `ember-data prep` stores for
// those lines, and what `ember-predict` scores. `parser` keeps scratch: one per thread.
void encode_lines(const LineParser& parser, const Vocabulary& vocabulary, std::string_view text, EncodedRows& out, std::size_t max_bad = 5);
// The same with another mapping of values to rows: rows_of(table, keys, n, rows) writes
// the rows of keys[0..n) of `table` (an export of hashed ids maps them through their ids).
using KeyRows = std::function<void(int table, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows)>;
void encode_lines(const LineParser& parser, const KeyRows& rows_of, std::string_view text, EncodedRows& out, std::size_t max_bad = 5);

}  // namespace ember::data
