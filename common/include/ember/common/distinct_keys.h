// Numbering a key stream's distinct keys in first-appearance order: the order the
// embedding path pools and sums rows in, shared by whoever gathers rows per batch (the
// one-process reference, the evaluation).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/common/types.h"

namespace ember {

// Appends to `ids` each key's number among the distinct keys seen so far (`index`, which
// also names them in `order`); a key not seen before takes the next number.
inline void number_distinct(std::span<const Key> keys, U64Map<std::uint32_t>& index, std::vector<Key>& order,
                            std::vector<std::uint32_t>& ids) {
  ids.reserve(ids.size() + keys.size());
  for (Key k : keys) {
    const auto [at, fresh] = index.try_emplace(k, static_cast<std::uint32_t>(order.size()));
    if (fresh) order.push_back(k);
    ids.push_back(*at);
  }
}

}  // namespace ember
