#include "ember/transport/message.h"

#include <cstring>

#include "ember/common/error.h"
#include "ember/common/hash.h"

namespace ember::transport {
namespace {

// Explicit little-endian stores and loads: the wire format does not depend on the host.
template <typename T>
void put(std::uint8_t* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i));
}
template <typename T>
T get(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

std::uint32_t header_checksum(const std::uint8_t* p) { return static_cast<std::uint32_t>(checksum64(p, 44)); }

}  // namespace

bool known_type(std::uint16_t t) { return t >= 1 && t <= 10; }

const char* type_name(MessageType t) {
  switch (t) {
    case MessageType::kHello:
      return "hello";
    case MessageType::kHelloReply:
      return "hello-reply";
    case MessageType::kPull:
      return "pull";
    case MessageType::kPullReply:
      return "pull-reply";
    case MessageType::kPushGrad:
      return "push-grad";
    case MessageType::kPushValue:
      return "push-value";
    case MessageType::kCommit:
      return "commit";
    case MessageType::kAck:
      return "ack";
    case MessageType::kError:
      return "error";
    case MessageType::kResetRows:
      return "reset-rows";
  }
  return "unknown";
}

void encode_header(const MessageHeader& h, std::uint8_t out[kHeaderBytes]) {
  put<std::uint32_t>(out + 0, kMagic);
  put<std::uint16_t>(out + 4, kVersion);
  put<std::uint16_t>(out + 6, static_cast<std::uint16_t>(h.type));
  put<std::uint64_t>(out + 8, h.request_id);
  put<std::uint64_t>(out + 16, h.iteration);
  put<std::uint32_t>(out + 24, h.key_count);
  put<std::uint32_t>(out + 28, h.value_count);
  put<std::uint64_t>(out + 32, h.payload_bytes());
  put<std::uint32_t>(out + 40, h.flags);
  put<std::uint32_t>(out + 44, header_checksum(out));
}

MessageHeader decode_header(const std::uint8_t in[kHeaderBytes], std::uint64_t max_payload_bytes) {
  if (get<std::uint32_t>(in + 0) != kMagic) throw ProtocolError("bad magic (not an Ember message)");
  if (get<std::uint32_t>(in + 44) != header_checksum(in)) throw ProtocolError("header checksum mismatch");
  std::uint16_t version = get<std::uint16_t>(in + 4);
  if (version != kVersion) {
    throw ProtocolError("protocol version " + std::to_string(version) + " (this build speaks " + std::to_string(kVersion) + ")");
  }
  std::uint16_t type = get<std::uint16_t>(in + 6);
  if (!known_type(type)) throw ProtocolError("unknown message type " + std::to_string(type));
  MessageHeader h;
  h.type = static_cast<MessageType>(type);
  h.request_id = get<std::uint64_t>(in + 8);
  h.iteration = get<std::uint64_t>(in + 16);
  h.key_count = get<std::uint32_t>(in + 24);
  h.value_count = get<std::uint32_t>(in + 28);
  h.flags = get<std::uint32_t>(in + 40);
  std::uint64_t payload = get<std::uint64_t>(in + 32);
  if (payload != h.payload_bytes()) {
    throw ProtocolError("payload of " + std::to_string(payload) + " bytes does not match " + std::to_string(h.key_count) + " keys and " +
                        std::to_string(h.value_count) + " values");
  }
  if (payload > max_payload_bytes) {
    throw ProtocolError(std::string(type_name(h.type)) + " payload of " + std::to_string(payload) + " bytes exceeds the limit of " +
                        std::to_string(max_payload_bytes));
  }
  return h;
}

}  // namespace ember::transport
