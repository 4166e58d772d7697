#include "ember/transport/transport.h"

#include "ember/common/error.h"
#include "ember/transport/tcp.h"

namespace ember::transport {

TransportKind parse_transport(const std::string& name) {
  if (name == "tcp") return TransportKind::kTcp;
  if (name == "rdma") return TransportKind::kRdma;
  throw ConfigError("--transport '" + name + "': choose tcp or rdma");
}

const char* transport_name(TransportKind kind) { return kind == TransportKind::kRdma ? "rdma" : "tcp"; }

Transport::Transport(TransportOptions options)
    : Transport(options, options.kind == TransportKind::kRdma ? std::shared_ptr<verbs::Fabric>(verbs::make_ibverbs_fabric()) : nullptr) {}

Transport::Transport(TransportOptions options, std::shared_ptr<verbs::Fabric> fabric)
    : options_(std::move(options)), fabric_(options_.kind == TransportKind::kRdma ? std::move(fabric) : nullptr) {
  if (options_.kind == TransportKind::kRdma && fabric_ == nullptr) throw ConfigError("an RDMA transport without a fabric");
}

namespace {

// The RDMA options both sides take from TransportOptions (the rest keep rdma.h's defaults).
RdmaOptions rdma_options(const TransportOptions& o) {
  RdmaOptions r;
  r.slot_bytes = o.rdma_slot_bytes;
  r.timeout = o.timeout;
  return r;
}

}  // namespace

std::unique_ptr<Server> Transport::make_server(ServerHandler handler) const {
  if (options_.kind == TransportKind::kTcp) {
    TcpServerOptions to;
    to.address = options_.address;
    to.port = options_.port;
    to.io_threads = options_.io_threads;
    to.token = options_.token;
    to.socket_buffer_bytes = options_.socket_buffer_bytes;
    to.max_connections = options_.max_connections;
    to.hello_timeout = options_.hello_timeout;
    return std::make_unique<TcpServer>(std::move(to), std::move(handler));
  }
  RdmaServerOptions ro;
  ro.address = options_.address;
  ro.port = options_.port;
  ro.token = options_.token;
  ro.hello_timeout = options_.hello_timeout;
  ro.rdma = rdma_options(options_);
  ro.rdma.send_regions = options_.send_regions;
  return std::make_unique<RdmaServer>(fabric_, std::move(ro), std::move(handler));
}

std::unique_ptr<Client> Transport::connect(const std::string& host, std::uint16_t port) const {
  if (options_.kind == TransportKind::kTcp) {
    return std::make_unique<TcpClient>(host, port, options_.token, options_.timeout, options_.socket_buffer_bytes);
  }
  return std::make_unique<RdmaClient>(fabric_, host, port, options_.token, rdma_options(options_));
}

Connector Transport::make_connector() const {
  return [transport = *this](const std::string& host, std::uint16_t port) { return transport.connect(host, port); };
}

}  // namespace ember::transport
