// SHA-256 (FIPS 180-4 examples), HMAC-SHA256 (RFC 4231's test cases), and the proofs
// the hellos and the join carry (auth.h).
#include "ember/transport/auth.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ember::transport::auth {
namespace {

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::vector<std::uint8_t> repeat(std::uint8_t b, std::size_t n) { return std::vector<std::uint8_t>(n, b); }

TEST(Auth, Sha256MatchesTheStandardsExamples) {
  EXPECT_EQ(to_hex(sha256(bytes(""))), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256(bytes("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(to_hex(sha256(repeat('a', 1000000))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary (55, 56, 63, 64 bytes) all hash distinctly.
  std::set<std::string> seen;
  for (std::size_t n : {55, 56, 57, 63, 64, 65}) seen.insert(to_hex(sha256(repeat('x', n))));
  EXPECT_EQ(seen.size(), 6u);
}

// RFC 4231, section 4: test cases 1 to 7.
TEST(Auth, HmacSha256MatchesRfc4231) {
  std::vector<std::uint8_t> key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<std::uint8_t>(i));
  struct Case {
    std::vector<std::uint8_t> key, data;
    std::string mac;
  };
  const std::vector<Case> cases = {
      {repeat(0x0b, 20), bytes("Hi There"), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {bytes("Jefe"), bytes("what do ya want for nothing?"), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {repeat(0xaa, 20), repeat(0xdd, 50), "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, repeat(0xcd, 50), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {repeat(0x0c, 20), bytes("Test With Truncation"), "a3b6167473100ee06e0c796c2955552b"},  // truncated to 128 bits
      {repeat(0xaa, 131), bytes("Test Using Larger Than Block-Size Key - Hash Key First"),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {repeat(0xaa, 131),
       bytes("This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed "
             "before being used by the HMAC algorithm."),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(to_hex(hmac_sha256(cases[i].key, cases[i].data)).substr(0, cases[i].mac.size()), cases[i].mac) << "test case " << i + 1;
}

TEST(Auth, ProofsDependOnTokenNoncesContextAndIdentity) {
  const Nonce s = random_nonce(), c = random_nonce();
  EXPECT_NE(s, c) << "getrandom gave the same 16 bytes twice";
  const Digest p = proof("job-secret", kTcpClient, s, c);
  EXPECT_TRUE(equal(p, proof("job-secret", kTcpClient, s, c)));
  EXPECT_FALSE(equal(p, proof("job-secreT", kTcpClient, s, c)));
  EXPECT_FALSE(equal(p, proof("job-secret", kTcpServer, s, c)));  // the other direction
  EXPECT_FALSE(equal(p, proof("job-secret", kTcpClient, random_nonce(), c)));
  EXPECT_FALSE(equal(p, proof("job-secret", kTcpClient, s, random_nonce())));
  EXPECT_FALSE(equal(p, proof("job-secret", kTcpClient, c, s)));
  EXPECT_FALSE(equal(proof("t", kJoinMember, s, c, "worker\n0\n"), proof("t", kJoinMember, s, c, "worker\n1\n")));
}

TEST(Auth, HexIsStrict) {
  const std::vector<std::uint8_t> b = {0x00, 0x7f, 0xff, 0xa5};
  EXPECT_EQ(to_hex(b), "007fffa5");
  std::array<std::uint8_t, 4> out{};
  EXPECT_TRUE(from_hex("007fffa5", out));
  EXPECT_EQ(std::vector<std::uint8_t>(out.begin(), out.end()), b);
  EXPECT_FALSE(from_hex("007FFFA5", out));    // uppercase
  EXPECT_FALSE(from_hex("007fffa", out));     // short
  EXPECT_FALSE(from_hex("007fffa5aa", out));  // long
  EXPECT_FALSE(from_hex("007fffg5", out));
  std::uint8_t x[3] = {1, 2, 3}, y[3] = {1, 2, 3};
  EXPECT_TRUE(equal(x, y, 3));
  y[2] = 4;
  EXPECT_FALSE(equal(x, y, 3));
}

}  // namespace
}  // namespace ember::transport::auth
