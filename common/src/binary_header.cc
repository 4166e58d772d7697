#include "ember/common/binary_header.h"

#include <cstring>

#include "ember/common/error.h"

namespace ember {

void write_binary_header(const BinaryFormat& f, void* out) {
  auto* p = static_cast<char*>(out);
  std::memcpy(p, f.magic.data(), f.magic.size());
  std::memcpy(p + f.magic.size(), &f.version, sizeof f.version);
}

std::uint32_t read_binary_header(const BinaryFormat& f, const std::string& name, std::string_view head) {
  const std::string what(f.what);
  if (head.size() < kBinaryHeaderBytes) throw DataError(name + ": truncated " + what);
  if (std::memcmp(head.data(), f.magic.data(), f.magic.size()) != 0) throw DataError(name + ": not an Ember " + what);
  std::uint32_t version;
  std::memcpy(&version, head.data() + f.magic.size(), sizeof version);
  if (version < f.oldest || version > f.version) {
    throw DataError(name + ": " + what + " version " + std::to_string(version) + " is not supported");
  }
  return version;
}

}  // namespace ember
