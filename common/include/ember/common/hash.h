// Fast, stable hashes. Stable across runs and machines: used for ids and row placement.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <string_view>

namespace ember {

// Bijective 64-bit finalizer (splitmix64): well-mixed bits for open addressing.
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline std::uint64_t hash_bytes(std::string_view s, std::uint64_t seed = 0) { return XXH3_64bits_withSeed(s.data(), s.size(), seed); }

// Checksum of a byte range, as stored in Ember's binary files.
inline std::uint64_t checksum64(const void* data, std::size_t len) { return XXH3_64bits(data, len); }

}  // namespace ember
