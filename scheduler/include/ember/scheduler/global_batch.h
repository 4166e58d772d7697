// GlobalBatch: the global keys of one global batch, sample-major (n samples x T tables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ember/common/types.h"
#include "ember/data/dataset.h"

namespace ember::scheduler {

struct GlobalBatch {
  std::uint64_t index = 0;  // batch number
  std::uint32_t samples = 0;
  std::uint32_t tables = 0;
  std::vector<Key> keys;  // keys[i * tables + t] = table_offset[t] + row id

  Key key(std::uint32_t sample, std::uint32_t table) const { return keys[static_cast<std::size_t>(sample) * tables + table]; }
};

// The global keys of samples [0, n) of `batch` (n <= batch.size()), sample-major, into
// `out` (resized to n * T, T = table_offsets.size()): out[i * T + t] = table_offsets[t] +
// the row id of sample i in table t. The one place a batch's row ids become keys.
void global_keys(const data::Batch& batch, std::size_t n, const std::vector<std::uint64_t>& table_offsets, std::vector<Key>& out);

// Fills `out` from a dataset batch: its index, size and global_keys.
void to_global_batch(const data::Batch& batch, const std::vector<std::uint64_t>& table_offsets, GlobalBatch& out);

}  // namespace ember::scheduler
