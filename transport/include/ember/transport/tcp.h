// TCP data plane (Boost.Asio): framed messages (message.h) between workers and PS shards.
//
// Server: an acceptor and a pool of I/O threads; each connection must start with a
// kHello carrying the job token's hash, then sends requests that the handler answers in
// order (a client may pipeline several). A peer that sends a malformed, oversized or
// unauthenticated message is logged and dropped; every other connection keeps working.
//
// Client: blocking calls with a timeout, pipelining through send() / receive().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/transport/message.h"

namespace ember::transport {

// A received message: header and payload segments (views into the connection's buffer).
struct Message {
  MessageHeader header;
  const Key* keys = nullptr;
  const float* values = nullptr;
};

// An outgoing message: header (counts are filled from the segments) and segments the
// caller owns until the send returns; sent scatter-gather, without copies.
struct OutMessage {
  MessageHeader header;
  const Key* keys = nullptr;
  std::uint32_t key_count = 0;
  const float* values = nullptr;
  std::uint32_t value_count = 0;
};

// Hash of a job token as carried by kHello (the token itself never crosses the wire).
std::uint64_t token_hash(const std::string& token);

struct TcpServerOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;               // 0: any free port (see TcpServer::port())
  int io_threads = 2;
  std::string token;                    // required in every connection's kHello
  std::uint64_t max_payload_bytes = 256u << 20;
};

// Answers one request: fills `reply` (its segments must stay valid until the handler is
// called again on this connection; `scratch` is a per-connection buffer for that).
// Throwing ProtocolError sends kError and keeps the connection; other exceptions drop it.
using RequestHandler = std::function<void(const Message& request, OutMessage& reply, std::vector<float>& scratch)>;

class TcpServer {
 public:
  TcpServer(TcpServerOptions options, RequestHandler handler);
  ~TcpServer();  // stops accepting, closes connections, joins threads
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  std::uint16_t port() const;
  std::uint64_t connections_dropped() const;
  std::uint64_t requests_served() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpClient {
 public:
  // Connects and authenticates; throws IoError (unreachable, timeout) or ProtocolError
  // (refused).
  TcpClient(const std::string& host, std::uint16_t port, const std::string& token,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  ~TcpClient();
  TcpClient(const TcpClient&) = delete;
  TcpClient& operator=(const TcpClient&) = delete;

  // Sends a request (the request id is assigned here and returned).
  std::uint64_t send(OutMessage request);
  // Receives the next reply into buffers this client owns (valid until the next call).
  // A kError reply is thrown as ProtocolError with the server's reason.
  Message receive();
  // send + receive.
  Message call(OutMessage request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::transport
