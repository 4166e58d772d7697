// Hashed ids (`ember-data prep --ids hash`): a categorical value becomes a 64-bit id
// computed from (table, value key) alone, with no vocabulary pass. The same function
// serves prep and, later, whatever hashes raw lines at serving time.
//
// Layout of an id: bits 63..56 the table, bit 55 "wide", bits 54..0 the value mixed.
//  - A value key below 2^55 (every Criteo value: hexadecimal of at most 8 digits) is
//    mixed by a bijection of 55 bits: distinct values never share an id.
//  - A wider key (Avazu's XXH3 of the field's bytes, the missing value) is folded to 55
//    bits and then mixed, with bit 55 set: two wide values of one table may share an id,
//    never a narrow one or another table's. Prep counts those collisions exactly.
// The table in the top byte keeps tables apart by construction and lets an export split
// rows by table; placing ids on PS shards mixes the whole id again.
#pragma once

#include <cstdint>

namespace ember::data {

inline constexpr unsigned kHashedTableShift = 56;
inline constexpr std::uint64_t kHashedWideBit = std::uint64_t{1} << 55;
inline constexpr std::uint64_t kHashedValueMask = kHashedWideBit - 1;  // 55 bits
inline constexpr int kMaxHashedTables = 256;

// A bijection of [0, 2^55): xorshifts and odd multiplications modulo 2^55.
inline std::uint64_t mix55(std::uint64_t x) {
  x &= kHashedValueMask;
  x ^= x >> 28;
  x = (x * 0xbf58476d1ce4e5b9ULL) & kHashedValueMask;
  x ^= x >> 27;
  x = (x * 0x94d049bb133111ebULL) & kHashedValueMask;
  x ^= x >> 31;
  return x;
}

// A wide key's 55 bits before mixing: the key's high bits xor-folded into its low ones.
inline std::uint64_t fold55(std::uint64_t key) { return (key ^ (key >> 55) * 0x9e3779b97f4a7c15ULL) & kHashedValueMask; }

inline bool is_wide_key(std::uint64_t key) { return key > kHashedValueMask; }

// The id of value key `key` (LineParser's raw key, kMissingKey for an empty field) of
// table `table` (< kMaxHashedTables).
inline std::uint64_t hashed_id(unsigned table, std::uint64_t key) {
  const std::uint64_t top = static_cast<std::uint64_t>(table) << kHashedTableShift;
  if (!is_wide_key(key)) return top | mix55(key);
  return top | kHashedWideBit | mix55(fold55(key));
}

// The table an id belongs to.
inline unsigned hashed_id_table(std::uint64_t id) { return static_cast<unsigned>(id >> kHashedTableShift); }

}  // namespace ember::data
