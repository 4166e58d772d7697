// The transport conformance suite: every data plane built (TCP over loopback, RDMA over
// the in-process verbs fake) must pass the same tests of the Server / Client contract
// (channel.h). RDMA-only tests below cover what TCP has no equivalent of: registration
// once per connection, credits, slots and completion errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "echo_handler.h"
#include "ember/common/error.h"
#include "ember/transport/rdma.h"
#include "ember/transport/tcp.h"
#include "ember/transport/verbs_fake.h"

namespace ember::transport {
namespace {

const std::string kToken = "job-secret";
using std::chrono::milliseconds;

using test::echo;

// Small RDMA pools, so that credits run out and slots are reused all the time.
RdmaOptions tight_rdma(milliseconds timeout = milliseconds(5000)) {
  RdmaOptions o;
  o.recv_depth = 4;
  o.inline_bytes = 256;
  o.slots = 2;
  o.slot_bytes = 256 << 10;
  o.timeout = timeout;
  return o;
}

RdmaServerOptions tight_server() {
  RdmaServerOptions o;
  o.token = kToken;
  o.rdma = tight_rdma();
  return o;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  bool rdma() const { return GetParam() == "rdma_fake"; }

  std::unique_ptr<Server> make_server(RequestHandler h = echo) {
    if (rdma()) return std::make_unique<RdmaServer>(fabric_, tight_server(), std::move(h));
    TcpServerOptions o;
    o.token = kToken;
    o.max_payload_bytes = 1 << 20;
    return std::make_unique<TcpServer>(o, std::move(h));
  }

  std::unique_ptr<Client> make_client(std::uint16_t port, const std::string& token = kToken, milliseconds timeout = milliseconds(5000)) {
    if (rdma()) return std::make_unique<RdmaClient>(fabric_, "127.0.0.1", port, token, tight_rdma(timeout));
    return std::make_unique<TcpClient>("127.0.0.1", port, token, timeout);
  }

  verbs::FakeFabric fabric_;
};

// A request of `n` keys (k_i = seed + i) and 2n values (v_j = seed + j / 4).
struct Request {
  std::vector<Key> keys;
  std::vector<float> values;
  OutMessage msg(std::uint64_t iteration = 1) const {
    OutMessage m;
    m.header.type = MessageType::kPushGrad;
    m.header.iteration = iteration;
    m.keys = keys.data();
    m.key_count = static_cast<std::uint32_t>(keys.size());
    m.values = values.data();
    m.value_count = static_cast<std::uint32_t>(values.size());
    return m;
  }
};

Request make_request(std::size_t n, std::uint64_t seed) {
  Request r;
  for (std::size_t i = 0; i < n; ++i) r.keys.push_back(seed + i);
  for (std::size_t j = 0; j < 2 * n; ++j) r.values.push_back(static_cast<float>(seed) + static_cast<float>(j) / 4);
  return r;
}

void expect_echo(const Message& got, const Request& sent) {
  ASSERT_EQ(got.header.type, MessageType::kAck);
  ASSERT_EQ(got.header.key_count, sent.keys.size());
  ASSERT_EQ(got.header.value_count, sent.values.size());
  for (std::size_t i = 0; i < sent.keys.size(); ++i) ASSERT_EQ(got.keys[i], sent.keys[i]) << "key " << i;
  for (std::size_t j = 0; j < sent.values.size(); ++j) ASSERT_EQ(got.values[j], 2 * sent.values[j]) << "value " << j;
}

TEST_P(Conformance, SmallAndLargeMessagesRoundTrip) {
  auto server = make_server();
  auto c = make_client(server->port());
  for (std::size_t n : {0u, 1u, 3u, 100u, 5000u, 10000u}) {  // up to 240 KB: SEND and bulk writes
    Request r = make_request(n, 1000 + n);
    Message m = c->call(r.msg(7));
    EXPECT_EQ(m.header.iteration, 7u);
    expect_echo(m, r);
  }
  EXPECT_EQ(server->requests_served(), 6u);
}

TEST_P(Conformance, ManyRequestsInFlightComeBackInOrder) {
  auto server = make_server();
  auto c = make_client(server->port());
  std::mt19937 rng(5);
  std::vector<Request> sent;
  std::vector<std::uint64_t> ids;
  // 200 requests before the first receive: far more than any window of credits or slots.
  for (int i = 0; i < 200; ++i) {
    sent.push_back(make_request(rng() % 3 == 0 ? 2000 + rng() % 3000 : rng() % 20, 10 * static_cast<std::uint64_t>(i)));
    ids.push_back(c->send(sent.back().msg()));
  }
  for (int i = 0; i < 200; ++i) {
    Message m = c->receive();
    ASSERT_EQ(m.header.request_id, ids[static_cast<std::size_t>(i)]);
    expect_echo(m, sent[static_cast<std::size_t>(i)]);
  }
}

TEST_P(Conformance, RefusedRequestKeepsTheConnection) {
  auto server = make_server();
  auto c = make_client(server->port());
  Key bad = 666;
  OutMessage m;
  m.header.type = MessageType::kPull;
  m.keys = &bad;
  m.key_count = 1;
  try {
    c->call(m);
    ADD_FAILURE() << "the refused request returned";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("key 666 is unknown"), std::string::npos) << e.what();
  }
  Key good = 7;
  m.keys = &good;
  EXPECT_EQ(c->call(m).keys[0], 7u);
}

TEST_P(Conformance, WrongTokenIsRefusedWhileOthersKeepWorking) {
  auto server = make_server();
  auto good = make_client(server->port());
  try {
    auto bad = make_client(server->port(), "not-the-token", milliseconds(2000));
    Key k = 1;
    OutMessage m;
    m.header.type = MessageType::kPull;
    m.keys = &k;
    m.key_count = 1;
    bad->call(m);  // TCP refuses at hello, RDMA at connect: either way, no reply
    ADD_FAILURE() << "a client with the wrong token was served";
  } catch (const Error&) {
  }
  Request r = make_request(50, 3);
  expect_echo(good->call(r.msg()), r);
  for (int i = 0; i < 100 && server->connections_dropped() < 1; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server->connections_dropped(), 1u);
}

TEST_P(Conformance, ConcurrentClientsAreServedIndependently) {
  auto server = make_server();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto c = make_client(server->port());
        for (int i = 0; i < 50; ++i) {
          Request r = make_request(static_cast<std::size_t>((i * 37 + t) % 3000), static_cast<std::uint64_t>(t * 100000 + i));
          Message m = c->call(r.msg());
          if (m.header.value_count != r.values.size() || (!r.values.empty() && m.values[r.values.size() - 1] != 2 * r.values.back()))
            ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(server->requests_served(), 200u);
}

TEST_P(Conformance, SlowRepliesTimeOutAndGoneServersFailClearly) {
  auto server = make_server();
  auto c = make_client(server->port(), kToken, milliseconds(200));
  OutMessage m = test::slow_commit();
  try {
    c->call(m);
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  // A request in flight when the server goes away fails; so does connecting again.
  auto d = make_client(server->port(), kToken, milliseconds(2000));
  d->send(m);
  const std::uint16_t port = server->port();
  server.reset();
  EXPECT_THROW(d->receive(), IoError);
  try {
    make_client(port, kToken, milliseconds(500));
    ADD_FAILURE();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST_P(Conformance, DrainFinishesTheRequestInFlightThenRefusesMore) {
  auto server = make_server();
  auto c = make_client(server->port(), kToken, milliseconds(3000));
  OutMessage m = test::slow_commit();
  const std::uint64_t id = c->send(m);
  std::this_thread::sleep_for(milliseconds(100));  // the server is inside the handler
  std::thread drainer([&] { server->drain(milliseconds(3000)); });
  try {
    Message r = c->receive();  // the reply still comes
    EXPECT_EQ(r.header.request_id, id);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  drainer.join();
  EXPECT_EQ(server->requests_served(), 1u);
  m.header.iteration = 1;
  EXPECT_THROW(c->call(m), IoError);                                              // no more requests on the old connection
  EXPECT_THROW(make_client(server->port(), kToken, milliseconds(500)), IoError);  // nor new connections
}

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::Values(std::string("tcp"), std::string("rdma_fake")),
                         [](const auto& info) { return info.param; });

// ----------------------------------------------------------------- RDMA protocol only

// An echo server on a fake fabric with small pools.
class RdmaFake : public ::testing::Test {
 protected:
  std::unique_ptr<RdmaClient> client() { return std::make_unique<RdmaClient>(fabric, "127.0.0.1", server.port(), kToken, tight_rdma()); }

  verbs::FakeFabric fabric;
  RdmaServer server{fabric, tight_server(), echo};
};

TEST_F(RdmaFake, MemoryIsRegisteredOncePerConnectionNotPerMessage) {
  auto c = client();
  const std::uint64_t after_connect = fabric.registrations();
  EXPECT_EQ(after_connect, 2u);  // one pool per side
  for (int i = 0; i < 300; ++i) {
    Request r = make_request(static_cast<std::size_t>(i * 31 % 4000), static_cast<std::uint64_t>(i));
    expect_echo(c->call(r.msg()), r);
  }
  EXPECT_EQ(fabric.registrations(), after_connect);
  EXPECT_GT(fabric.bytes_moved(), 300u * 1000u);
}

TEST_F(RdmaFake, OversizedMessagesAreRefusedAndTheConnectionStaysUsable) {
  auto c = client();
  Request big = make_request(40000, 1);  // 960 KB > the 256 KiB slots
  try {
    c->send(big.msg());
    ADD_FAILURE();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("slot size"), std::string::npos) << e.what();
  }
  Request r = make_request(10, 1);
  expect_echo(c->call(r.msg()), r);
}

TEST_F(RdmaFake, CompletionErrorFailsThatConnectionOnly) {
  auto victim = client(), other = client();
  Request r = make_request(2000, 9);
  expect_echo(victim->call(r.msg()), r);
  std::this_thread::sleep_for(milliseconds(100));  // let the server's credit frame, if any, go out first
  // The next post_send on the fabric (the victim's request) fails with a completion
  // error; its own and its later requests throw, the server drops it, the other
  // connection keeps working.
  fabric.inject_send_error(1);
  EXPECT_THROW(
      {
        victim->send(r.msg());
        victim->send(r.msg());
        victim->receive();
      },
      IoError);
  EXPECT_THROW(victim->call(r.msg()), IoError);
  for (int i = 0; i < 5; ++i) expect_echo(other->call(r.msg()), r);
  EXPECT_EQ(server.requests_served(), 6u);
}

TEST_F(RdmaFake, RoguePeersAreDroppedWhileOthersKeepWorking) {
  auto good = client();

  // Connect data that is not Ember's: refused at connect.
  {
    auto ep = fabric.resolve("127.0.0.1", server.port(), milliseconds(1000));
    std::vector<std::uint8_t> junk(40, 0x5a);
    EXPECT_THROW(ep->connect(junk, milliseconds(2000)), IoError);
  }
  // A peer that connects properly (a real client), then sends frames of garbage over its
  // queue pair: the server drops it.
  auto send_raw = [&](const std::vector<std::uint8_t>& bytes, bool as_write, std::uint32_t imm) {
    auto ep = fabric.resolve("127.0.0.1", server.port(), milliseconds(1000));
    std::vector<std::uint8_t> buf(1 << 16);
    auto mr = ep->register_memory(buf.data(), buf.size());
    // Valid connect data (the layout of rdma.cc's ConnInfo: a nonce, no token); the
    // garbage then comes where the hello should.
    std::vector<std::uint8_t> info(48, 0);
    std::uint32_t magic = 0x43424d45;
    std::uint16_t version = 2, depth = 4;
    std::uint64_t addr = reinterpret_cast<std::uintptr_t>(buf.data());
    std::uint32_t slots = 2, slot_bytes = 4096, recv_bytes = 256;
    std::memcpy(&info[0], &magic, 4);
    std::memcpy(&info[4], &version, 2);
    std::memcpy(&info[6], &depth, 2);
    std::memset(&info[8], 0x17, 16);
    std::memcpy(&info[24], &addr, 8);
    std::memcpy(&info[32], &mr.rkey, 4);
    std::memcpy(&info[36], &slots, 4);
    std::memcpy(&info[40], &slot_bytes, 4);
    std::memcpy(&info[44], &recv_bytes, 4);
    auto reply = ep->connect(info, milliseconds(2000));
    ASSERT_GE(reply.size(), 48u);
    std::memcpy(buf.data(), bytes.data(), bytes.size());
    verbs::SendRequest w;
    w.sges[0] = {buf.data(), static_cast<std::uint32_t>(bytes.size()), mr.lkey};
    if (as_write) {
      std::uint64_t ring;
      std::uint32_t rkey;
      std::memcpy(&ring, &reply[24], 8);
      std::memcpy(&rkey, &reply[32], 4);
      w.opcode = verbs::Opcode::kWriteWithImm;
      w.remote_addr = ring;
      w.rkey = rkey;
      w.imm = imm;
    }
    ep->post_send(w);
    std::this_thread::sleep_for(milliseconds(100));
  };
  send_raw(std::vector<std::uint8_t>(100, 0x5a), false, 0);           // random bytes
  send_raw(std::vector<std::uint8_t>(16, 0), false, 0);               // a frame header of zeros
  send_raw(std::vector<std::uint8_t>(64, 0), true, 0xeb000000 | 77);  // a write "into" slot 77 of 2
  {
    // A well-formed frame whose message header announces more payload than it carries.
    std::vector<std::uint8_t> f(16 + kHeaderBytes, 0);
    std::uint32_t fm = 0x46424d45, len = kHeaderBytes;
    std::uint16_t kind = 1, reply_slot = 0;
    std::memcpy(&f[0], &fm, 4);
    std::memcpy(&f[4], &kind, 2);
    std::memcpy(&f[8], &len, 4);
    std::memcpy(&f[14], &reply_slot, 2);
    MessageHeader h;
    h.type = MessageType::kPushGrad;
    h.value_count = 1000;
    encode_header(h, &f[16]);
    send_raw(f, false, 0);
  }
  Request r = make_request(3000, 4);
  expect_echo(good->call(r.msg()), r);
  for (int i = 0; i < 100 && server.connections_dropped() < 5; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server.connections_dropped(), 5u);
}

// Replies whose values lie in send regions leave from there: the device gathers the
// headers and keys from staging, then each value segment in place. Values elsewhere, or
// in more segments than the queue pair gathers, are copied. Each region is registered
// once per connection, when first sent from.
TEST(RdmaSendRegions, RepliesAreGatheredInPlaceOrElseCopied) {
  constexpr std::uint32_t kRow = 64;  // floats per piece: 256 B
  std::vector<float> a(kRow * 512), b(kRow * 512), elsewhere(kRow * 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i), b[i] = -static_cast<float>(i);
  for (std::size_t i = 0; i < elsewhere.size(); ++i) elsewhere[i] = 0.5f + static_cast<float>(i);
  auto regions = std::make_shared<SendRegions>();
  regions->add(a.data(), a.size() * sizeof(float));
  regions->add(b.data(), b.size() * sizeof(float));
  EXPECT_THROW(regions->add(a.data() + 10, 100), ConfigError);          // overlaps
  EXPECT_FALSE(regions->find(a.data() + a.size() - 1, 8).has_value());  // runs past its region
  // A request's keys name its reply's pieces: row r of a (r < 512), of b (512 + r), or of
  // `elsewhere` (1000 + r): one value segment each.
  auto piece = [&](Key k) -> const float* {
    return k < 512 ? &a[k * kRow] : k < 1000 ? &b[(k - 512) * kRow] : &elsewhere[(k - 1000) * kRow];
  };
  auto handler = [&](const Message& req, OutMessage& reply, Scratch& scratch) {
    scratch.segments.clear();
    for (std::uint32_t i = 0; i < req.header.key_count; ++i) scratch.segments.push_back({piece(req.keys[i]), kRow});
    reply.header.type = MessageType::kPullReply;
    reply.value_segments = scratch.segments.data();
    reply.segment_count = static_cast<std::uint32_t>(scratch.segments.size());
    reply.value_count = kRow * req.header.key_count;
  };
  verbs::FakeFabric fabric(4);  // 4 pieces per send: headers and keys, then up to 3 segments
  RdmaServerOptions so = tight_server();
  so.rdma.send_regions = regions;
  RdmaServer server(fabric, so, handler);
  RdmaClient c(fabric, "127.0.0.1", server.port(), kToken, tight_rdma());
  ASSERT_EQ(fabric.registrations(), 2u);  // the two pools
  std::uint64_t expected_in_place = 0;
  auto pull = [&](std::vector<Key> keys, bool in_place) {
    OutMessage m;
    m.header.type = MessageType::kPull;
    m.keys = keys.data();
    m.key_count = static_cast<std::uint32_t>(keys.size());
    const std::uint64_t gathered = fabric.gathered_sends();
    Message r = c.call(m);
    ASSERT_EQ(r.header.value_count, kRow * keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      for (std::uint32_t j = 0; j < kRow; ++j) ASSERT_EQ(r.values[i * kRow + j], piece(keys[i])[j]) << "key " << keys[i] << " float " << j;
    }
    EXPECT_EQ(fabric.gathered_sends() - gathered, in_place ? 1u : 0u);
    if (in_place) expected_in_place += 4ull * kRow * keys.size();
    // Counted once the send is posted: the reply may be read before.
    for (int i = 0; i < 200 && server.bytes_sent_in_place() != expected_in_place; ++i) std::this_thread::sleep_for(milliseconds(1));
    EXPECT_EQ(server.bytes_sent_in_place(), expected_in_place);
  };
  for (int round = 0; round < 20; ++round) {
    const Key r = static_cast<Key>(round * 7 % 500);
    pull({r, r + 3, r + 1}, true);          // three pieces of a
    pull({r + 512, r, 700}, true);          // of b and of a
    pull({r, r + 1, r + 2, r + 3}, false);  // four pieces: more than the gather list takes
    pull({r, 1001, r + 2}, false);          // one piece not in any region
  }
  pull({5}, true);                        // one piece
  EXPECT_EQ(fabric.registrations(), 4u);  // + a and b, once each for all 41 replies sent from them
}

// Memory registered for sends only is read by the device, never written: a peer that
// writes to it with its key (or a RECV posted into it) fails, the memory unchanged.
TEST(RdmaSendRegions, SendOnlyMemoryCannotBeWritten) {
  verbs::FakeFabric fabric;
  auto listener = fabric.listen("127.0.0.1", 0);
  auto client = fabric.resolve("127.0.0.1", listener->port(), milliseconds(1000));
  std::vector<std::uint8_t> pool(4096, 0), table(4096, 7), source(64, 1), inbox(64, 0);
  const verbs::MemoryRegion pool_mr = client->register_memory(pool.data(), pool.size());
  const verbs::MemoryRegion src_mr = client->register_memory(source.data(), source.size());
  std::thread accept([&] {
    auto req = listener->next(milliseconds(2000));
    ASSERT_TRUE(req.has_value());
    auto server = std::move(req->endpoint);
    const verbs::MemoryRegion ro = server->register_for_sends(table.data(), table.size());
    EXPECT_THROW(server->post_recv({1, {table.data(), 64, ro.lkey}}), IoError);
    const verbs::MemoryRegion rw = server->register_memory(inbox.data(), inbox.size());
    server->post_recv({2, {inbox.data(), 64, rw.lkey}});  // for the write's immediate
    std::vector<std::uint8_t> key(8);
    std::memcpy(key.data(), &ro.rkey, 4);
    server->accept(key);
    std::this_thread::sleep_for(milliseconds(300));  // the client's write lands (or fails) meanwhile
  });
  std::vector<std::uint8_t> reply = client->connect({}, milliseconds(2000));
  std::uint32_t rkey = 0;
  std::memcpy(&rkey, reply.data(), 4);
  verbs::SendRequest w;
  w.opcode = verbs::Opcode::kWriteWithImm;
  w.sges[0] = {source.data(), 64, src_mr.lkey};
  w.remote_addr = reinterpret_cast<std::uintptr_t>(table.data());
  w.rkey = rkey;
  client->post_send(w);
  verbs::Completion done[4];
  std::size_t n = 0;
  for (int i = 0; i < 100 && n == 0; ++i) n = client->poll(done), std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(n, 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].status, "remote access error");
  accept.join();
  EXPECT_EQ(table, std::vector<std::uint8_t>(4096, 7));
  (void)pool_mr;
}

TEST(Rdma, WithoutADeviceTheFabricSaysSoInOneLine) {
  std::string why = rdma_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "this machine has an RDMA device";
  try {
    verbs::make_ibverbs_fabric();
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), why);
    EXPECT_NE(why.find("use --transport tcp"), std::string::npos);
    EXPECT_EQ(why.find('\n'), std::string::npos);
  }
}

// With a device, the real fabric passes a round trip over loopback (skipped here).
TEST(Rdma, RealDeviceRoundTrip) {
  std::string why = rdma_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  auto fabric = verbs::make_ibverbs_fabric();
  RdmaServerOptions so;
  so.token = kToken;
  RdmaServer server(*fabric, so, echo);
  RdmaClient c(*fabric, "127.0.0.1", server.port(), kToken);
  Request r = make_request(20000, 2);
  expect_echo(c.call(r.msg()), r);
}

}  // namespace
}  // namespace ember::transport
