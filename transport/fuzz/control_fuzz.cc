// libFuzzer target: arbitrary bytes through the control plane's decoders (both
// directions). Any input must either be refused with ProtocolError or decode to a
// message that encodes and decodes again to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "control_codec.h"
#include "ember/common/error.h"

namespace codec = ember::transport::control_codec;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  try {
    const codec::ToCoordinator m = codec::decode_to_coordinator(frame);
    if (codec::encode(codec::decode_to_coordinator(codec::encode(m))) != codec::encode(m)) std::abort();
  } catch (const ember::ProtocolError&) {
  }
  try {
    const codec::FromCoordinator m = codec::decode_from_coordinator(frame);
    if (codec::encode(codec::decode_from_coordinator(codec::encode(m))) != codec::encode(m)) std::abort();
  } catch (const ember::ProtocolError&) {
  }
  return 0;
}
