// The transport factory (transport.h): the one mapping of --transport names to data
// planes, and servers and clients of either kind made from one set of options.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "echo_handler.h"
#include "ember/common/error.h"
#include "ember/transport/rdma.h"
#include "ember/transport/transport.h"
#include "ember/transport/verbs_fake.h"

namespace ember::transport {
namespace {

const std::string kToken = "factory-token";

TEST(TransportFactory, ParsesTheTwoNamesAndRefusesOthers) {
  EXPECT_EQ(parse_transport("tcp"), TransportKind::kTcp);
  EXPECT_EQ(parse_transport("rdma"), TransportKind::kRdma);
  EXPECT_STREQ(transport_name(TransportKind::kTcp), "tcp");
  EXPECT_STREQ(transport_name(TransportKind::kRdma), "rdma");
  for (const std::string bad : {"udp", "TCP", ""}) {
    try {
      parse_transport(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "--transport '" + bad + "': choose tcp or rdma");
    }
  }
}

TEST(TransportFactory, RdmaWithoutADeviceSaysSoInOneLine) {
  const std::string why = rdma_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "this machine has an RDMA device";
  TransportOptions o;
  o.kind = TransportKind::kRdma;
  try {
    Transport t(o);
    ADD_FAILURE() << "an RDMA transport opened without a device";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), why);
    EXPECT_NE(why.find("; use --transport tcp"), std::string::npos);
    EXPECT_EQ(why.find('\n'), std::string::npos);
  }
}

// A request of a few keys and values, answered by test::echo (keys back, values doubled).
void expect_round_trip(Client& c) {
  std::vector<Key> keys = {3, 1, 4};
  std::vector<float> values = {1.5f, 2.5f};
  OutMessage m;
  m.header.type = MessageType::kPushGrad;
  m.keys = keys.data();
  m.key_count = static_cast<std::uint32_t>(keys.size());
  m.values = values.data();
  m.value_count = static_cast<std::uint32_t>(values.size());
  const Message r = c.call(m);
  ASSERT_EQ(r.header.key_count, keys.size());
  ASSERT_EQ(r.header.value_count, values.size());
  EXPECT_EQ(std::vector<Key>(r.keys, r.keys + keys.size()), keys);
  EXPECT_EQ(r.values[0], 3.0f);
  EXPECT_EQ(r.values[1], 5.0f);
}

TransportOptions options(TransportKind kind) {
  TransportOptions o;
  o.kind = kind;
  o.token = kToken;
  o.timeout = std::chrono::milliseconds(5000);
  return o;
}

class TransportFactoryKinds : public ::testing::TestWithParam<TransportKind> {};

TEST_P(TransportFactoryKinds, ServerAndConnectorOfOneOptionsTalk) {
  const Transport t(options(GetParam()), std::make_shared<verbs::FakeFabric>());
  EXPECT_EQ(t.kind(), GetParam());
  EXPECT_EQ(t.fabric() != nullptr, GetParam() == TransportKind::kRdma);
  const auto server = t.make_server(test::echo);
  EXPECT_EQ(dynamic_cast<RdmaServer*>(server.get()) != nullptr, GetParam() == TransportKind::kRdma);
  const Connector connect = t.make_connector();
  auto client = connect("127.0.0.1", server->port());
  expect_round_trip(*client);
  expect_round_trip(*t.connect("127.0.0.1", server->port()));
  // The token of the options is the one checked.
  TransportOptions other = t.options();
  other.token = "another job";
  EXPECT_ANY_THROW(Transport(other, t.fabric()).connect("127.0.0.1", server->port())->call(OutMessage{}));
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportFactoryKinds, ::testing::Values(TransportKind::kTcp, TransportKind::kRdma),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

// The RDMA slot size of the options bounds a message on both sides.
TEST(TransportFactory, RdmaSlotBytesBoundAMessage) {
  TransportOptions o = options(TransportKind::kRdma);
  o.rdma_slot_bytes = 64 << 10;
  const Transport t(o, std::make_shared<verbs::FakeFabric>());
  const auto server = t.make_server(test::echo);
  auto client = t.connect("127.0.0.1", server->port());
  std::vector<float> values(32 << 10, 1.0f);  // 128 KiB
  OutMessage m;
  m.header.type = MessageType::kPushGrad;
  m.values = values.data();
  m.value_count = static_cast<std::uint32_t>(values.size());
  try {
    client->send(m);
    ADD_FAILURE() << "a message larger than a slot was sent";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the RDMA slot size"), std::string::npos) << e.what();
  }
  expect_round_trip(*client);
}

// A connector, and every client and server made, keep the fabric alive: a worker may
// drop its Transport once it has its connector.
TEST(TransportFactory, ConnectorsClientsAndServersKeepTheFabricAlive) {
  auto fabric = std::make_shared<verbs::FakeFabric>();
  const std::weak_ptr<verbs::FakeFabric> watch = fabric;
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client;
  {
    Connector connect;
    {
      const Transport t(options(TransportKind::kRdma), std::move(fabric));
      server = t.make_server(test::echo);
      connect = t.make_connector();
    }
    client = connect("127.0.0.1", server->port());
  }
  EXPECT_FALSE(watch.expired());
  expect_round_trip(*client);
  client.reset();
  EXPECT_FALSE(watch.expired());  // the server's
  server.reset();
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace ember::transport
