// A row's initial value: a pure function of (seed, key), so any number of shards, and
// any worker, agree. (Which shard owns a row: owner_shard() in shard_store.h.)
#pragma once

#include <cstdint>

#include "ember/common/hash.h"
#include "ember/common/types.h"

namespace ember::ps {

// The initial value of row `key`: uniform in [-1/sqrt(dim), 1/sqrt(dim)), from (seed, key)
// alone, so any shard layout builds the same initial model.
void initial_row(std::uint64_t seed, Key key, std::uint32_t dim, float* out);

}  // namespace ember::ps
