// libFuzzer target: arbitrary bytes through the message decoder. Any input must either
// be refused with ProtocolError or decode to a header whose lengths are consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ember/common/error.h"
#include "ember/transport/message.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ember::transport;
  if (size < kHeaderBytes) return 0;
  try {
    MessageHeader h = decode_header(data, 1 << 20);
    if (h.payload_bytes() > (1 << 20)) std::abort();  // the limit was not enforced
    // Re-encoding a decoded header gives the same bytes.
    std::uint8_t again[kHeaderBytes];
    encode_header(h, again);
    for (std::size_t i = 0; i < kHeaderBytes; ++i) {
      if (again[i] != data[i]) std::abort();
    }
  } catch (const ember::ProtocolError&) {
  }
  return 0;
}
