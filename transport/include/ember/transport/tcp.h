// TCP data plane (Boost.Asio): framed messages (message.h) between workers and PS shards.
//
// Server: an acceptor and a pool of I/O threads; on each connection the server sends a
// challenge (a fresh nonce), the client must answer with a kHello proving it knows the job
// token (auth.h; the token never crosses the wire), and the server proves it knows it
// too in its reply. Then the client sends requests that the handler answers in
// order (a client may pipeline several). Each connection is full duplex: requests are
// read ahead while a reply is still going out (up to max_payload_bytes of them), so a
// client may send large requests before reading a large reply. A peer that sends a
// malformed, oversized or unauthenticated message is logged and dropped; every other
// connection keeps working. Before a connection's hello is checked nothing but a hello
// header is read from it, and it has hello_timeout to send it; connections are capped
// (max_connections), and accept failures (the descriptor limit) back off.
//
// Client: blocking calls with a timeout, pipelining through send() / receive().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/transport/channel.h"

namespace ember::transport {

struct TcpServerOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port (see TcpServer::port())
  int io_threads = 2;
  std::string token;                             // proven in every connection's kHello
  std::uint64_t max_payload_bytes = 256u << 20;  // per request; also a connection's read-ahead
  // Send and receive buffer of every connection; 0 leaves them to the kernel's
  // autotuning (which grows them up to net.ipv4.tcp_wmem/tcp_rmem's maximum). A fixed
  // size turns autotuning off and is capped by net.core.wmem_max/rmem_max (logged).
  std::uint32_t socket_buffer_bytes = 0;
  // Until its hello is checked a connection is anyone's: it is closed when it has not
  // authenticated within hello_timeout, and its first header must be a hello (nothing
  // else is read or allocated for it).
  std::chrono::milliseconds hello_timeout{10000};
  // A request whose payload stops arriving for this long closes its connection. An idle
  // authenticated connection (a worker between iterations) is never closed.
  std::chrono::milliseconds stall_timeout{60000};
  // Open connections, authenticated or not; more are closed at accept (logged at most
  // once per 10 s). A job needs workers x --ps-connections per shard.
  std::uint32_t max_connections = 1024;
};

class TcpServer final : public Server {
 public:
  TcpServer(TcpServerOptions options, ServerHandler handler);
  ~TcpServer();  // stops accepting, closes connections, joins threads
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  std::uint16_t port() const override;
  std::uint64_t connections_dropped() const override;
  std::uint64_t requests_served() const override;
  std::uint32_t connections_open() const override;
  void drain(std::chrono::milliseconds grace) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpClient final : public Client {
 public:
  // Connects and authenticates; throws IoError (unreachable, timeout, refused: the
  // server closes the connection) or ProtocolError (a server that does not prove it
  // knows the token, or speaks another protocol version).
  // `socket_buffer_bytes`: as TcpServerOptions'.
  TcpClient(const std::string& host, std::uint16_t port, const std::string& token,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(10000), std::uint32_t socket_buffer_bytes = 0);
  ~TcpClient();
  TcpClient(const TcpClient&) = delete;
  TcpClient& operator=(const TcpClient&) = delete;

  std::uint64_t send(OutMessage request) override;
  Message receive() override;
  Message receive_rows(std::span<float* const> rows, std::uint32_t row_floats) override;
  const std::string& peer() const override;
  std::uint64_t bytes_sent() const override;
  std::uint64_t bytes_received() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::transport
