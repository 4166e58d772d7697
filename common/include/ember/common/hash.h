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

// Dynamic tables: the PS shard of a hashed id. The workers' directories place ids by it,
// and a shard restoring a checkpoint of another shard count re-places them by it.
inline std::uint32_t shard_of_id(std::uint64_t id, std::uint32_t shards) {
  return static_cast<std::uint32_t>(mix64(id ^ 0x5d1a7e5c0ffee123ULL) % shards);
}

inline std::uint64_t hash_bytes(std::string_view s, std::uint64_t seed = 0) { return XXH3_64bits_withSeed(s.data(), s.size(), seed); }

// FNV-1a, 64 bits: the identity of a file's contents that processes of a job compare
// (a plan file, a model file, a dataset's checksums). Not a defence against forgery.
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

// Checksum of a byte range, as stored in Ember's binary files.
inline std::uint64_t checksum64(const void* data, std::size_t len) { return XXH3_64bits(data, len); }
// checksum64 of bytes given in pieces (a file written as it is made).
class Checksum64 {
 public:
  Checksum64() : s_(XXH3_createState()) { XXH3_64bits_reset(s_); }
  ~Checksum64() { XXH3_freeState(s_); }
  Checksum64(const Checksum64&) = delete;
  Checksum64& operator=(const Checksum64&) = delete;
  void update(const void* data, std::size_t len) { XXH3_64bits_update(s_, data, len); }
  std::uint64_t digest() const { return XXH3_64bits_digest(s_); }

 private:
  XXH3_state_t* s_;
};

}  // namespace ember
