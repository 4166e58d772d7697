#include "ember/common/binary_header.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "ember/common/error.h"

namespace ember {
namespace {

constexpr BinaryFormat kFormat{{'E', 'M', 'B', 'R', 'T', 'E', 'S', 'T'}, "test file", 3, 2};

std::string message(const std::string& head) {
  try {
    read_binary_header(kFormat, "f", head);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(BinaryHeader, WritesMagicThenLittleEndianVersion) {
  char out[kBinaryHeaderBytes] = {};
  write_binary_header(kFormat, out);
  EXPECT_EQ(std::string(out, 8), "EMBRTEST");
  const unsigned char version[4] = {3, 0, 0, 0};
  EXPECT_EQ(std::memcmp(out + 8, version, 4), 0);
  EXPECT_EQ(read_binary_header(kFormat, "f", std::string(out, sizeof out) + "rest"), 3u);
}

TEST(BinaryHeader, ReadsVersionsFromOldestAndNamesWhatIsWrong) {
  std::string head(kBinaryHeaderBytes, '\0');
  write_binary_header(kFormat, head.data());
  for (std::uint32_t v : {0u, 1u, 2u, 3u, 4u}) {
    std::memcpy(head.data() + 8, &v, 4);
    if (v == 2 || v == 3) {
      EXPECT_EQ(read_binary_header(kFormat, "f", head), v);
    } else {
      EXPECT_EQ(message(head), "f: test file version " + std::to_string(v) + " is not supported");
    }
  }
  head[0] = 'X';
  EXPECT_EQ(message(head), "f: not an Ember test file");
  EXPECT_EQ(message("EMBR"), "f: truncated test file");
}

}  // namespace
}  // namespace ember
