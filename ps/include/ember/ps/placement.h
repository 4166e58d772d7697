// Which PS shard owns a row, and a row's initial value: both pure functions of the key
// (and seed), so any number of shards, and any worker, agree.
#pragma once

#include <cstdint>

#include "ember/common/hash.h"
#include "ember/common/types.h"

namespace ember::ps {

// Row key to shard by a fixed hash (spreads each table's hot rows over every shard).
inline std::uint32_t shard_of(Key key, std::uint32_t shards) {
  return static_cast<std::uint32_t>(mix64(key ^ 0x5ca1ab1e) % shards);
}

// The initial value of row `key`: uniform in [-1/sqrt(dim), 1/sqrt(dim)), from (seed, key)
// alone, so any shard layout builds the same initial model.
void initial_row(std::uint64_t seed, Key key, std::uint32_t dim, float* out);

}  // namespace ember::ps
