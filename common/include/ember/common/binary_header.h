// The opening of Ember's binary files (vocabularies, checkpoints): 8 bytes of magic that
// name the kind of file, then the file's format version as a uint32 in host byte order
// (little-endian on every host Ember builds for). The rest of each file's header follows
// these 12 bytes and belongs to that file's format: a header struct opens with
// `char magic[8]; std::uint32_t version;` and the functions below fill or check them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ember {

inline constexpr std::size_t kBinaryHeaderBytes = 12;

struct BinaryFormat {
  std::array<char, 8> magic;
  std::string_view what;  // the kind of file, in messages: "vocabulary", "checkpoint"
  std::uint32_t version;  // the version written
  std::uint32_t oldest;   // the oldest version read (<= version)
};

// Writes f's magic and version into out[0, kBinaryHeaderBytes).
void write_binary_header(const BinaryFormat& f, void* out);

// The version of the file `name` whose first bytes are `head`, after checking them.
// DataError "NAME: truncated WHAT" when `head` is shorter than kBinaryHeaderBytes,
// "NAME: not an Ember WHAT" for another magic, "NAME: WHAT version V is not supported"
// for a version outside [f.oldest, f.version].
std::uint32_t read_binary_header(const BinaryFormat& f, const std::string& name, std::string_view head);

}  // namespace ember
