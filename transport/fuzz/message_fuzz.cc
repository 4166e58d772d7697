// libFuzzer target: arbitrary bytes through the message decoder. Any input must either
// be refused with ProtocolError or decode to a header whose lengths are consistent.
// Half the inputs get a valid header checksum patched in, so that the fuzzer also
// reaches the checks behind it (version, type, lengths, limit).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ember/common/error.h"
#include "ember/common/hash.h"
#include "ember/transport/message.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ember::transport;
  if (size < kHeaderBytes) return 0;
  std::uint8_t h[kHeaderBytes];
  std::memcpy(h, data, kHeaderBytes);
  if (size > kHeaderBytes && (data[kHeaderBytes] & 1)) {
    const auto sum = static_cast<std::uint32_t>(ember::checksum64(h, 44));
    for (int i = 0; i < 4; ++i) h[44 + i] = static_cast<std::uint8_t>(sum >> (8 * i));
  }
  try {
    MessageHeader m = decode_header(h, 1 << 20);
    if (m.payload_bytes() > (1 << 20)) std::abort();  // the limit was not enforced
    // Re-encoding a decoded header gives the same bytes.
    std::uint8_t again[kHeaderBytes];
    encode_header(m, again);
    if (std::memcmp(again, h, kHeaderBytes) != 0) std::abort();
  } catch (const ember::ProtocolError&) {
  }
  return 0;
}
