// Identifier types shared by every module.
#pragma once

#include <cstdint>

namespace ember {

// A row of one embedding table, global across tables: table offset + row id.
// Always 64-bit: Criteo ids exceed 2^24, so they must never travel as floats.
using Key = std::uint64_t;
using TableId = std::uint32_t;
using WorkerId = std::uint32_t;

// Dynamic tables (hashed 64-bit ids, `ember-data prep --ids hash`): the id of a row slot
// that holds none (free, or its row dropped).
inline constexpr std::uint64_t kNoId = ~std::uint64_t{0};

}  // namespace ember
