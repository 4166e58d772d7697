// The data plane a job runs on, chosen by name (--transport tcp|rdma) in this one place:
// a Transport opens what its kind needs (over RDMA the ibverbs fabric) and makes servers
// and client connections of that kind from one set of options, so that a daemon or a
// worker never branches on the name itself. Servers and clients are the interfaces of
// channel.h; tcp.h and rdma.h hold the implementations and their finer options.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ember/transport/channel.h"
#include "ember/transport/rdma.h"
#include "ember/transport/verbs.h"

namespace ember::transport {

enum class TransportKind { kTcp, kRdma };

// "tcp" or "rdma"; ConfigError "--transport 'NAME': choose tcp or rdma" otherwise.
TransportKind parse_transport(const std::string& name);
// "tcp" or "rdma" (what parse_transport reads back).
const char* transport_name(TransportKind kind);

struct TransportOptions {
  TransportKind kind = TransportKind::kTcp;
  std::string token;  // the job token: servers require it of every connection, clients present it
  // Clients: connecting and every send or receive; RDMA servers: sending a reply.
  std::chrono::milliseconds timeout{10000};
  // TCP: send and receive buffer of every connection (0: the kernel's autotuning;
  // TcpServerOptions).
  std::uint32_t socket_buffer_bytes = 0;
  // RDMA: the largest message either side takes (a slot of the receive ring; RdmaOptions).
  std::uint32_t rdma_slot_bytes = 4u << 20;

  // Servers only.
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port (Server::port() says which)
  int io_threads = 2;      // TCP
  // TCP: open connections at most, and the time a connection has to say hello
  // (TcpServerOptions).
  std::uint32_t max_connections = 1024;
  std::chrono::milliseconds hello_timeout{10000};
  // RDMA: memory whose values replies send in place (rdma.h); none: every reply is copied.
  std::shared_ptr<const SendRegions> send_regions;
};

// Opens the data connection to one server (host, port). A connector from
// Transport::make_connector() keeps the transport's fabric alive while it, or any
// client it made, lives.
using Connector = std::function<std::unique_ptr<Client>(const std::string& host, std::uint16_t port)>;

class Transport {
 public:
  // Opens what options.kind needs: over RDMA the ibverbs fabric, which throws ConfigError
  // with one line ending "; use --transport tcp" when this machine has no RDMA device
  // (rdma_unavailable_reason()). Nothing to open over TCP.
  explicit Transport(TransportOptions options);
  // The same over `fabric` instead of the ibverbs one (tests: verbs::FakeFabric); the
  // fabric is not used over TCP.
  Transport(TransportOptions options, std::shared_ptr<verbs::Fabric> fabric);

  TransportKind kind() const { return options_.kind; }
  const char* name() const { return transport_name(options_.kind); }
  const TransportOptions& options() const { return options_; }
  // The RDMA fabric (null over TCP): a Transport with other options on the same fabric is
  // Transport(options, fabric()).
  const std::shared_ptr<verbs::Fabric>& fabric() const { return fabric_; }

  // A server listening at options().address and port, answering with `handler`.
  std::unique_ptr<Server> make_server(ServerHandler handler) const;
  // A connection to host:port, authenticated with the token; throws IoError
  // (unreachable, timeout) or ProtocolError (refused), as TcpClient and RdmaClient do.
  std::unique_ptr<Client> connect(const std::string& host, std::uint16_t port) const;
  // connect() as a function to hand to whoever opens connections (ps::PsClient).
  Connector make_connector() const;

 private:
  TransportOptions options_;
  std::shared_ptr<verbs::Fabric> fabric_;  // RDMA; servers and clients made share it
};

}  // namespace ember::transport
