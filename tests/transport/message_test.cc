#include "ember/transport/message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ember/common/error.h"

namespace ember::transport {
namespace {

MessageHeader sample() {
  MessageHeader h;
  h.type = MessageType::kPushGrad;
  h.request_id = 0x1122334455667788ULL;
  h.iteration = 42;
  h.key_count = 3;
  h.value_count = 3 * 16;
  h.flags = 7;
  return h;
}

TEST(Message, HeaderRoundTripIsLittleEndian) {
  std::uint8_t b[kHeaderBytes];
  encode_header(sample(), b);
  EXPECT_EQ(b[0], 'E');
  EXPECT_EQ(b[3], 'R');
  EXPECT_EQ(b[8], 0x88);  // request id, least significant byte first
  MessageHeader h = decode_header(b, 1 << 20);
  EXPECT_EQ(h.type, MessageType::kPushGrad);
  EXPECT_EQ(h.request_id, 0x1122334455667788ULL);
  EXPECT_EQ(h.iteration, 42u);
  EXPECT_EQ(h.key_count, 3u);
  EXPECT_EQ(h.value_count, 48u);
  EXPECT_EQ(h.flags, 7u);
  EXPECT_EQ(h.payload_bytes(), 3u * 8 + 48u * 4);
}

void expect_refused(const std::uint8_t* b, const std::string& why, std::uint64_t limit = 1 << 20) {
  try {
    decode_header(b, limit);
    ADD_FAILURE() << "accepted; expected: " << why;
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(Message, EveryBadHeaderIsRefusedWithItsReason) {
  std::uint8_t good[kHeaderBytes];
  encode_header(sample(), good);
  std::uint8_t b[kHeaderBytes];
  std::memcpy(b, good, kHeaderBytes);
  b[0] = 'X';
  expect_refused(b, "bad magic");
  std::memcpy(b, good, kHeaderBytes);
  b[20] ^= 1;  // iteration changed in transit
  expect_refused(b, "checksum");
  expect_refused(good, "exceeds the limit", 100);
  // Forged headers with valid checksums: re-encode then patch and re-checksum.
  MessageHeader h = sample();
  h.type = static_cast<MessageType>(77);
  encode_header(h, b);
  expect_refused(b, "unknown message type 77");
}

TEST(Message, RandomBytesNeverCrashTheDecoder) {
  std::mt19937_64 rng(3);
  std::uint8_t b[kHeaderBytes];
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    for (auto& x : b) x = static_cast<std::uint8_t>(rng());
    if (i % 2 == 0) {  // half of them with a valid magic, to get past the first check
      b[0] = 'E';
      b[1] = 'M';
      b[2] = 'B';
      b[3] = 'R';
    }
    try {
      decode_header(b, 1 << 20);
      ++accepted;
    } catch (const ProtocolError&) {
    }
  }
  EXPECT_EQ(accepted, 0);
}

}  // namespace
}  // namespace ember::transport
