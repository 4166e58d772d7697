// Ember's wire format between workers and parameter servers: a fixed 48-byte
// little-endian header, then the payload segments (keys uint64[], then values float[]),
// sent scatter-gather and received into buffers the caller owns.
//
//   offset  size  field
//        0     4  magic "EMBR"
//        4     2  version
//        6     2  type (MessageType)
//        8     8  request id (echoed by replies)
//       16     8  iteration
//       24     4  key count
//       28     4  value count (floats)
//       32     8  payload bytes (= 8 x keys + 4 x values)
//       40     4  flags
//       44     4  checksum of bytes 0..43
//
// Every length is validated before any payload is read (decode_header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ember/common/types.h"

namespace ember::transport {

inline constexpr std::size_t kHeaderBytes = 48;
inline constexpr std::uint32_t kMagic = 0x52424d45;  // "EMBR" little-endian
// 2: the hello proves knowledge of the job token (auth.h) instead of carrying its hash.
inline constexpr std::uint16_t kVersion = 2;

enum class MessageType : std::uint16_t {
  // Connecting (TCP): the server speaks first, a kHello whose 2 keys are its nonce; the
  // client answers with a kHello of 6 keys: its nonce (2), then its proof (4, auth.h);
  // the kHelloReply carries the server's proof (4 keys). RDMA exchanges the nonces in its
  // connect data and sends the proofs the same way (4 keys each).
  kHello = 1,
  kHelloReply = 2,
  kPull = 3,        // keys -> rows
  kPullReply = 4,   // values = rows (dim floats each), in key order
  kPushGrad = 5,    // keys + gradients (dim floats each)
  kPushValue = 6,   // keys + values and optimizer state
  kCommit = 7,      // end of a worker's sync phase for `iteration`
  kAck = 8,         // reply to push and commit
  kError = 9,       // reply: the request was refused (reason in the payload as bytes)
  kResetRows = 10,  // dynamic tables: slots + the ids they now hold, reset at a commit
};

// Keys of the hellos (TCP: the challenge, the client's hello; both: a proof).
inline constexpr std::uint32_t kChallengeKeys = 2;
inline constexpr std::uint32_t kClientHelloKeys = 6;
inline constexpr std::uint32_t kProofKeys = 4;

// Whether `t` is a type this version knows.
bool known_type(std::uint16_t t);
const char* type_name(MessageType t);

struct MessageHeader {
  MessageType type = MessageType::kAck;
  std::uint64_t request_id = 0;
  std::uint64_t iteration = 0;
  std::uint32_t key_count = 0;
  std::uint32_t value_count = 0;
  std::uint32_t flags = 0;

  std::uint64_t payload_bytes() const { return 8ull * key_count + 4ull * value_count; }
};

// Writes the header's 48 bytes (checksum included).
void encode_header(const MessageHeader& h, std::uint8_t out[kHeaderBytes]);

// Reads and validates 48 bytes: magic, version, known type, checksum, payload length
// consistent with the counts and at most `max_payload_bytes`. Throws ProtocolError
// saying which check failed.
MessageHeader decode_header(const std::uint8_t in[kHeaderBytes], std::uint64_t max_payload_bytes);

}  // namespace ember::transport
