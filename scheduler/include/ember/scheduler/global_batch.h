// GlobalBatch: the global keys of one global batch, sample-major: each sample's bags in
// table order (one key a bag when one-hot, any number when multi-hot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "ember/common/types.h"
#include "ember/data/dataset.h"

namespace ember::scheduler {

struct GlobalBatch {
  std::uint64_t index = 0;  // batch number
  std::uint32_t samples = 0;
  std::uint32_t tables = 0;
  // Key = table_offset[t] + row id. One-hot: keys[i * tables + t].
  std::vector<Key> keys;
  // Multi-hot: bag (i, t) is keys [bags[i * tables + t], bags[i * tables + t + 1]),
  // samples * tables + 1 entries. Empty when one-hot (every bag is one key).
  std::vector<std::uint32_t> bags;

  bool multi_hot() const { return !bags.empty(); }
  // Where bag (sample, table) starts in keys; (samples, 0) is keys.size().
  std::uint32_t bag_begin(std::uint32_t sample, std::uint32_t table) const {
    const std::size_t pos = static_cast<std::size_t>(sample) * tables + table;
    return bags.empty() ? static_cast<std::uint32_t>(pos) : bags[pos];
  }
  std::uint32_t bag_end(std::uint32_t sample, std::uint32_t table) const { return bag_begin(sample, table) + bag_size(sample, table); }
  std::uint32_t bag_size(std::uint32_t sample, std::uint32_t table) const {
    if (bags.empty()) return 1;
    const std::size_t pos = static_cast<std::size_t>(sample) * tables + table;
    return bags[pos + 1] - bags[pos];
  }
  // Sample i's keys are [sample_begin(i), sample_begin(i + 1)).
  std::uint32_t sample_begin(std::uint32_t sample) const { return bag_begin(sample, 0); }
  // The one key of (sample, table) of a one-hot batch.
  Key key(std::uint32_t sample, std::uint32_t table) const { return keys[static_cast<std::size_t>(sample) * tables + table]; }
};

// The global keys of samples [0, n) of `batch` (n <= batch.size()), sample-major, into
// `out`: each sample's bags in table order, key = table_offsets[t] + row id. One-hot
// datasets: n * T keys and `bags` cleared; multi-hot: `bags` as GlobalBatch::bags. The
// one place a batch's row ids become keys.
void global_keys(const data::Batch& batch, std::size_t n, const std::vector<std::uint64_t>& table_offsets, std::vector<Key>& out,
                 std::vector<std::uint32_t>& bags);

// Fills `out` from a dataset batch: its index, size and global_keys.
void to_global_batch(const data::Batch& batch, const std::vector<std::uint64_t>& table_offsets, GlobalBatch& out);

// An evaluation reads the validation split in batches of this many samples.
inline constexpr std::size_t kValidationBatch = 4096;

// The validation samples an evaluation reads, batch by batch in the split's order: its
// first `samples` (0: all), in batches of kValidationBatch, the last short. What
// evaluate() (worker/src/report/evaluation.cc) scores and validation_rows() lists.
class ValidationReader {
 public:
  ValidationReader(const data::Dataset& ds, std::uint64_t samples);
  // The next batch `b`, of which the first `n` samples are read, and their global_keys.
  // False when none is left.
  bool next(data::Batch& b, std::size_t& n, std::vector<Key>& keys, std::vector<std::uint32_t>& bags);

 private:
  std::vector<std::uint64_t> offsets_;
  std::optional<data::BatchReader> reader_;  // none: no validation split
  std::uint64_t samples_ = 0, read_ = 0;
};

// The keys of the validation samples ValidationReader reads, in its order: the rows an
// evaluation reads from the PS.
std::vector<Key> validation_rows(const data::Dataset& ds, std::uint64_t samples);

}  // namespace ember::scheduler
