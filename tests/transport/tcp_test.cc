// The TCP data plane over loopback: round trips, pipelining, and peers that misbehave.
#include "ember/transport/tcp.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "../data/test_util.h"
#include "echo_handler.h"
#include "ember/common/error.h"
#include "ember/transport/auth.h"

namespace ember::transport {
namespace {

const std::string kToken = "job-secret";

// A server answering with test::echo (echo_handler.h).
std::unique_ptr<TcpServer> echo_server() {
  TcpServerOptions o;
  o.token = kToken;
  o.max_payload_bytes = 1 << 20;
  return std::make_unique<TcpServer>(o, test::echo);
}

bool read_all(int fd, void* p, std::size_t n) { return ::recv(fd, p, n, MSG_WAITALL) == static_cast<ssize_t>(n); }

// The client's side of the hello on a raw socket, as TcpClient does it: reads the
// server's challenge, answers with a proof of `token`, reads the reply. True when the
// server answered with a hello reply proving the token. `sent`: the hello's bytes.
bool raw_hello(int fd, const std::string& token, std::vector<std::uint8_t>* sent = nullptr) {
  std::uint8_t challenge[kHeaderBytes + 16];
  if (!read_all(fd, challenge, sizeof challenge)) return false;
  const MessageHeader ch = decode_header(challenge, 16);
  if (ch.type != MessageType::kHello || ch.key_count != kChallengeKeys) return false;
  auth::Nonce server_nonce, client_nonce = auth::random_nonce();
  std::memcpy(server_nonce.data(), challenge + kHeaderBytes, 16);
  const auth::Digest proof = auth::proof(token, auth::kTcpClient, server_nonce, client_nonce);
  MessageHeader h;
  h.type = MessageType::kHello;
  h.key_count = kClientHelloKeys;
  std::vector<std::uint8_t> b(kHeaderBytes + 8 * kClientHelloKeys);
  encode_header(h, b.data());
  std::memcpy(b.data() + kHeaderBytes, client_nonce.data(), 16);
  std::memcpy(b.data() + kHeaderBytes + 16, proof.data(), 32);
  if (sent) *sent = b;
  if (::write(fd, b.data(), b.size()) != static_cast<ssize_t>(b.size())) return false;
  std::uint8_t reply[kHeaderBytes + 32];
  if (!read_all(fd, reply, sizeof reply)) return false;
  const MessageHeader r = decode_header(reply, 32);
  const auth::Digest expected = auth::proof(token, auth::kTcpServer, server_nonce, client_nonce);
  return r.type == MessageType::kHelloReply && r.key_count == kProofKeys &&
         std::equal(expected.begin(), expected.end(), reply + kHeaderBytes);
}

// Opens a raw socket, says hello first if `hello_first`, sends `bytes`, and reports
// whether the server then closed it.
bool raw_peer_gets_closed(std::uint16_t port, const std::vector<std::uint8_t>& bytes, bool close_early = false, bool hello_first = false) {
  const int fd = ember::test::connect_loopback(port);
  if (fd < 0) return false;
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (hello_first && !raw_hello(fd, kToken)) {
    ::close(fd);
    return false;
  }
  ssize_t w = ::write(fd, bytes.data(), bytes.size());
  (void)w;
  if (close_early) {
    ::close(fd);
    return true;
  }
  char buf[256];
  bool closed = false;
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) {
      closed = true;
      break;
    }
    if (n < 0) {
      closed = errno == ECONNRESET;  // closed with our bytes unread: a reset
      break;                         // otherwise a timeout: still open
    }
  }
  ::close(fd);
  return closed;
}

// A server answering with test::echo through 32 KiB socket buffers (autotuning off): far
// smaller than the messages these tests send.
std::unique_ptr<TcpServer> small_buffer_server(std::uint64_t max_payload_bytes) {
  TcpServerOptions o;
  o.token = kToken;
  o.max_payload_bytes = max_payload_bytes;
  o.socket_buffer_bytes = 32 << 10;
  return std::make_unique<TcpServer>(o, test::echo);
}

// A push-value of one key and `floats` values (the echo answers with as many).
OutMessage push_value(const Key& key, const float* values, std::size_t floats) {
  OutMessage m;
  m.header.type = MessageType::kPushValue;
  m.keys = &key;
  m.key_count = 1;
  m.values = values;
  m.value_count = static_cast<std::uint32_t>(floats);
  return m;
}

TEST(Tcp, RoundTripsAndPipelining) {
  auto server = echo_server();
  TcpClient c("127.0.0.1", server->port(), kToken);
  Key keys[3] = {1, 2, 1ull << 40};
  float vals[6] = {1, 2, 3, 4, 5, 6};
  OutMessage m;
  m.header.type = MessageType::kPushGrad;
  m.header.iteration = 5;
  m.keys = keys;
  m.key_count = 3;
  m.values = vals;
  m.value_count = 6;
  Message r = c.call(m);
  EXPECT_EQ(r.header.type, MessageType::kAck);
  EXPECT_EQ(r.header.iteration, 5u);
  ASSERT_EQ(r.header.key_count, 3u);
  EXPECT_EQ(r.keys[2], 1ull << 40);
  ASSERT_EQ(r.header.value_count, 6u);
  EXPECT_EQ(r.values[5], 12.0f);
  // 50 requests in flight on one connection; replies come back in order.
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 50; ++i) {
    vals[0] = static_cast<float>(i);
    ids.push_back(c.send(m));
  }
  for (int i = 0; i < 50; ++i) {
    Message x = c.receive();
    ASSERT_EQ(x.header.request_id, ids[static_cast<std::size_t>(i)]);
    ASSERT_EQ(x.values[0], 2.0f * static_cast<float>(i));
  }
  EXPECT_EQ(server->requests_served(), 51u);
}

// Fixed socket buffers far smaller than a message (autotuning off) still carry it whole,
// both ways, in either order of sizes.
TEST(Tcp, FixedSocketBuffersCarryMessagesLargerThanThem) {
  auto server = small_buffer_server(16 << 20);
  TcpClient c("127.0.0.1", server->port(), kToken, std::chrono::milliseconds(10000), 32 << 10);
  for (std::size_t floats : {std::size_t{1} << 20, std::size_t{3}, std::size_t{777777}}) {
    std::vector<float> vals(floats);
    for (std::size_t i = 0; i < floats; ++i) vals[i] = static_cast<float>(i % 1000);
    const Key key = floats;
    Message r = c.call(push_value(key, vals.data(), floats));
    ASSERT_EQ(r.header.value_count, floats);
    EXPECT_EQ(r.keys[0], floats);
    for (std::size_t i = 0; i < floats; i += 4099) ASSERT_EQ(r.values[i], 2.0f * vals[i]) << i;
    EXPECT_EQ(r.values[floats - 1], 2.0f * vals[floats - 1]);
  }
}

// A client that sends several large requests before reading any reply: the server reads
// them while its first large reply waits for the client, instead of both ends blocking in
// their sends until the client's timeout (socket buffers far smaller than the messages).
TEST(Tcp, LargeRequestsPipelinedBehindALargeReplyDoNotStall) {
  auto server = small_buffer_server(16 << 20);
  TcpClient c("127.0.0.1", server->port(), kToken, std::chrono::milliseconds(3000), 32 << 10);
  const std::size_t floats = std::size_t{1} << 20;  // 4 MiB each way per request
  std::vector<std::vector<float>> vals(3, std::vector<float>(floats));
  const Key keys[3] = {10, 11, 12};
  std::vector<std::uint64_t> ids;
  for (std::size_t r = 0; r < vals.size(); ++r) {
    for (std::size_t i = 0; i < floats; ++i) vals[r][i] = static_cast<float>((i + r) % 977);
    ASSERT_NO_THROW(ids.push_back(c.send(push_value(keys[r], vals[r].data(), floats)))) << "request " << r;
  }
  for (std::size_t r = 0; r < vals.size(); ++r) {
    Message x = c.receive();
    ASSERT_EQ(x.header.request_id, ids[r]);
    ASSERT_EQ(x.header.value_count, floats);
    EXPECT_EQ(x.keys[0], keys[r]);
    for (std::size_t i = 0; i < floats; i += 4099) ASSERT_EQ(x.values[i], 2.0f * vals[r][i]) << r << " " << i;
  }
  EXPECT_EQ(server->connections_dropped(), 0u);
}

// The read-ahead is bounded: a client that keeps sending and never reads its replies is
// held back by TCP once max_payload_bytes are queued (its send times out), and the server
// keeps serving others.
TEST(Tcp, ReadAheadIsBoundedForAClientThatNeverReads) {
  auto server = small_buffer_server(1 << 20);
  TcpClient greedy("127.0.0.1", server->port(), kToken, std::chrono::milliseconds(1000), 32 << 10);
  std::vector<float> vals((1 << 20) / 4 - 2);  // one key: a payload of exactly 1 MiB
  const Key key = 1;
  const OutMessage m = push_value(key, vals.data(), vals.size());
  int sent = 0;
  try {
    for (; sent < 100; ++sent) greedy.send(m);
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("send timed out"), std::string::npos) << e.what();
  }
  // One reply waits in the socket, about one request is queued, the rest sits in buffers.
  EXPECT_LT(sent, 8) << "the server read far ahead of a client that never reads";
  TcpClient other("127.0.0.1", server->port(), kToken);
  EXPECT_EQ(other.call(push_value(key, vals.data(), 4)).values[3], 2.0f * vals[3]);
}

// A handler may keep a request's payload (lend_payload): it stays as received while the
// connection reads later requests into other memory, and once let go it comes back for
// the connection's next requests.
TEST(Tcp, LentPayloadsOutliveLaterRequestsAndComeBack) {
  struct Kept {
    std::shared_ptr<const void> owner;
    const float* values;
  };
  std::mutex mu;
  std::vector<Kept> kept;
  bool keep = true;
  TcpServerOptions o;
  o.token = kToken;
  TcpServer server(o, [&](const Message& req, OutMessage& reply, Scratch&) {
    ASSERT_TRUE(req.lend_payload) << "TCP lends request payloads";
    std::shared_ptr<const void> owner = req.lend_payload();
    EXPECT_EQ(owner, req.lend_payload()) << "asked twice, the same owner";
    std::lock_guard<std::mutex> lock(mu);
    if (keep) kept.push_back({std::move(owner), req.values});
    reply.header.type = MessageType::kAck;
  });
  TcpClient c("127.0.0.1", server.port(), kToken);
  constexpr std::size_t kFloats = 4096;
  std::vector<float> vals(kFloats);
  const Key key = 1;
  for (int r = 0; r < 6; ++r) {
    for (std::size_t i = 0; i < kFloats; ++i) vals[i] = static_cast<float>(r * 10000 + static_cast<int>(i % 1000));
    c.call(push_value(key, vals.data(), kFloats));
  }
  std::set<const float*> lent;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(kept.size(), 6u);
    for (std::size_t r = 0; r < kept.size(); ++r) {
      for (std::size_t i = 0; i < kFloats; i += 97) {
        ASSERT_EQ(kept[r].values[i], static_cast<float>(static_cast<int>(r) * 10000 + static_cast<int>(i % 1000)))
            << "request " << r << " overwritten";
      }
      lent.insert(kept[r].values);
    }
    EXPECT_EQ(lent.size(), 6u) << "requests read into a payload still lent";
    kept.clear();  // let go: the buffers go back to the connection
    keep = false;
  }
  // Later requests are read into buffers given back (none allocated while some wait).
  for (int r = 0; r < 3; ++r) c.call(push_value(key, vals.data(), kFloats));
  {
    std::lock_guard<std::mutex> lock(mu);
    keep = true;
  }
  c.call(push_value(key, vals.data(), kFloats));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(lent.count(kept[0].values), 1u) << "a payload given back was not used again";
}

// A refused request keeping its connection: Conformance.RefusedRequestKeepsTheConnection/tcp.

TEST(Tcp, BadPeersAreDroppedWhileOthersKeepWorking) {
  auto server = echo_server();
  const std::uint16_t port = server->port();
  TcpClient good("127.0.0.1", port, kToken);
  // Wrong token.
  EXPECT_THROW(TcpClient("127.0.0.1", port, "not-the-token"), Error);
  // Random bytes.
  EXPECT_TRUE(raw_peer_gets_closed(port, std::vector<std::uint8_t>(100, 0x5a)));
  // A request before hello.
  {
    MessageHeader h;
    h.type = MessageType::kPull;
    std::vector<std::uint8_t> b(kHeaderBytes);
    encode_header(h, b.data());
    EXPECT_TRUE(raw_peer_gets_closed(port, b));
  }
  // Oversized payload announced by a well-formed header.
  {
    MessageHeader h;
    h.type = MessageType::kPushGrad;
    h.value_count = 1u << 24;  // 64 MiB > the 1 MiB limit
    std::vector<std::uint8_t> big(kHeaderBytes);
    encode_header(h, big.data());
    EXPECT_TRUE(raw_peer_gets_closed(port, big, false, true));
  }
  // A truncated message: the header promises 400 bytes, 10 arrive, the peer leaves.
  {
    MessageHeader h;
    h.type = MessageType::kPushGrad;
    h.value_count = 100;
    std::vector<std::uint8_t> t(kHeaderBytes + 10);
    encode_header(h, t.data());
    raw_peer_gets_closed(port, t, true, true);
  }
  Key k = 3;
  OutMessage m;
  m.header.type = MessageType::kPull;
  m.keys = &k;
  m.key_count = 1;
  EXPECT_EQ(good.call(m).keys[0], 3u);
  for (int i = 0; i < 100 && server->connections_dropped() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server->connections_dropped(), 5u);
}

// Forwards one connection between a client and `server_port`, recording what crosses
// the wire each way, until either side closes.
struct Tap {
  int listener = -1;
  std::uint16_t port = 0;
  std::vector<std::uint8_t> to_server, to_client;
  std::thread thread;

  explicit Tap(std::uint16_t server_port) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listener, 1) != 0) return;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this, server_port] {
      const int c = ::accept(listener, nullptr, nullptr);
      const int s = ember::test::connect_loopback(server_port);
      pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
      char buf[65536];
      while (c >= 0 && s >= 0 && ::poll(p, 2, 5000) > 0) {
        const bool from_client = p[0].revents != 0;
        const int in = from_client ? c : s, out = from_client ? s : c;
        const ssize_t n = ::read(in, buf, sizeof buf);
        if (n <= 0) break;
        (from_client ? to_server : to_client).insert((from_client ? to_server : to_client).end(), buf, buf + n);
        if (::write(out, buf, static_cast<std::size_t>(n)) != n) break;
      }
      if (c >= 0) ::close(c);
      if (s >= 0) ::close(s);
    });
  }
  ~Tap() {
    if (thread.joinable()) thread.join();
    ::close(listener);
  }
};

bool contains(const std::vector<std::uint8_t>& bytes, const std::string& s) {
  return std::search(bytes.begin(), bytes.end(), s.begin(), s.end()) != bytes.end();
}

// What a listener on the job's network sees of a connection carries no token: the hello
// proves it over a fresh nonce. A recorded hello, sent again, answers no new challenge.
TEST(Tcp, TheTokenNeverCrossesTheWireAndARecordedHelloIsRefused) {
  auto server = echo_server();
  std::vector<std::uint8_t> to_server, to_client;
  {
    Tap tap(server->port());
    ASSERT_NE(tap.port, 0);
    {
      TcpClient c("127.0.0.1", tap.port, kToken);
      Key k = 11;
      OutMessage m;
      m.header.type = MessageType::kPull;
      m.keys = &k;
      m.key_count = 1;
      EXPECT_EQ(c.call(m).keys[0], 11u);
    }
    tap.thread.join();
    to_server = tap.to_server;
    to_client = tap.to_client;
  }
  ASSERT_GE(to_client.size(), kHeaderBytes + 16 + kHeaderBytes + 32u);  // the challenge and the hello reply
  ASSERT_GE(to_server.size(), kHeaderBytes + 48u);                      // the hello
  EXPECT_FALSE(contains(to_server, kToken)) << "the token crossed the wire";
  EXPECT_FALSE(contains(to_client, kToken)) << "the token crossed the wire";
  // The recorded hello, replayed on a new connection (a new challenge): refused.
  const std::vector<std::uint8_t> recorded(to_server.begin(), to_server.begin() + kHeaderBytes + 48);
  const std::uint64_t dropped = server->connections_dropped();
  EXPECT_TRUE(raw_peer_gets_closed(server->port(), recorded));
  for (int i = 0; i < 100 && server->connections_dropped() == dropped; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server->connections_dropped(), dropped + 1);
  // Each connection's challenge is fresh.
  const int a = ember::test::connect_loopback(server->port()), b = ember::test::connect_loopback(server->port());
  std::uint8_t ca[kHeaderBytes + 16], cb[kHeaderBytes + 16];
  ASSERT_TRUE(read_all(a, ca, sizeof ca));
  ASSERT_TRUE(read_all(b, cb, sizeof cb));
  EXPECT_FALSE(std::equal(ca + kHeaderBytes, ca + sizeof ca, cb + kHeaderBytes));
  ::close(a);
  ::close(b);
  // The raw hello with the token works; with another token the server closes.
  const int good = ember::test::connect_loopback(server->port());
  EXPECT_TRUE(raw_hello(good, kToken));
  ::close(good);
  const int bad = ember::test::connect_loopback(server->port());
  EXPECT_FALSE(raw_hello(bad, "not-the-token"));
  ::close(bad);
}

// A server that does not know the token (an impostor taking any hello) is refused by
// the client.
TEST(Tcp, ClientRefusesAServerThatDoesNotProveTheToken) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), len), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread impostor([listener] {
    const int fd = ::accept(listener, nullptr, nullptr);
    std::uint8_t out[kHeaderBytes + 32] = {};
    MessageHeader h;
    h.type = MessageType::kHello;
    h.key_count = kChallengeKeys;
    encode_header(h, out);  // a challenge of zeros
    (void)!::write(fd, out, kHeaderBytes + 16);
    std::uint8_t hello[kHeaderBytes + 48];
    if (read_all(fd, hello, sizeof hello)) {
      h = decode_header(hello, 48);
      MessageHeader r;
      r.type = MessageType::kHelloReply;
      r.request_id = h.request_id;
      r.key_count = kProofKeys;
      std::memset(out, 0, sizeof out);
      encode_header(r, out);  // a "proof" of zeros
      (void)!::write(fd, out, sizeof out);
    }
    char c;
    (void)!::read(fd, &c, 1);
    ::close(fd);
  });
  try {
    TcpClient c("127.0.0.1", ntohs(a.sin_port), kToken, std::chrono::milliseconds(2000));
    ADD_FAILURE() << "connected to a server that does not know the token";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("does not prove it knows the job token"), std::string::npos) << e.what();
  }
  impostor.join();
  ::close(listener);
}

TEST(Tcp, CallsTimeOutAndUnreachableServersFailClearly) {
  auto server = echo_server();
  TcpClient c("127.0.0.1", server->port(), kToken, std::chrono::milliseconds(200));
  OutMessage m = test::slow_commit();
  try {
    c.call(m);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  const std::uint16_t port = server->port();
  server.reset();
  try {
    TcpClient gone("127.0.0.1", port, kToken);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("connect"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ember::transport
