// RDMA data plane: the same requests and replies as TCP (channel.h), carried over one RC
// queue pair per connection through the thin verbs interface (verbs.h).
//
// Memory: each side registers one pool per connection at connect time, never per
// message: RECV buffers, a ring of bulk slots the peer writes into, and send staging.
//
// Frames: every message travels as a 16-byte frame header (credits returned, length,
// reply slot) plus the message. Frames that fit the peer's RECV buffers go by SEND; larger
// ones by RDMA WRITE with immediate into a slot of the peer's ring, the immediate naming
// the slot. Every request reserves one of the client's slots for its reply, so bulk
// replies (pulled rows) are written straight into the requester's registered buffer and
// receive() hands out a view of them without a copy.
//
// Flow control: a frame consumes one of the peer's posted RECVs and, for a bulk request,
// one slot of the server's ring; the sender spends credits for both and the receiver
// returns them in the headers of its own frames, or in a credit-only frame when many are
// owed. One RECV credit is kept back for credit-only frames so both sides cannot stall.
//
// Failures: a completion error or a malformed frame fails that connection (the client's
// pending requests throw IoError naming the peer); the server logs, drops it, and keeps
// serving every other connection. The job token is checked when the connection is made.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "ember/transport/channel.h"
#include "ember/transport/verbs.h"

namespace ember::transport {

// Empty when ibverbs lists at least one device; otherwise why not, ending in
// "; use --transport tcp" (no device, ibverbs unsupported by the kernel, or Ember built
// without libibverbs).
std::string rdma_unavailable_reason();

struct RdmaOptions {
  std::uint32_t recv_depth = 32;          // RECVs posted per connection (the peer's credits)
  std::uint32_t inline_bytes = 4096;      // RECV buffer size: frames up to this go by SEND
  std::uint32_t slots = 4;                // bulk ring slots (also: client requests in flight)
  std::uint32_t slot_bytes = 4u << 20;    // largest frame; larger messages are refused
  std::chrono::milliseconds timeout{10000};
};

struct RdmaServerOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port
  std::string token;       // checked at every connection request
  RdmaOptions rdma;
};

class RdmaServer final : public Server {
 public:
  // Listens on `fabric` (which must outlive the server) and serves each connection on
  // its own thread.
  RdmaServer(verbs::Fabric& fabric, RdmaServerOptions options, RequestHandler handler);
  ~RdmaServer() override;  // stops listening, disconnects, joins threads
  RdmaServer(const RdmaServer&) = delete;
  RdmaServer& operator=(const RdmaServer&) = delete;

  std::uint16_t port() const override;
  std::uint64_t connections_dropped() const override;
  std::uint64_t requests_served() const override;
  void drain(std::chrono::milliseconds grace) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class RdmaClient final : public Client {
 public:
  // Connects with the job token; throws IoError (unreachable, refused, timeout).
  RdmaClient(verbs::Fabric& fabric, const std::string& host, std::uint16_t port, const std::string& token,
             RdmaOptions options = {});
  ~RdmaClient() override;
  RdmaClient(const RdmaClient&) = delete;
  RdmaClient& operator=(const RdmaClient&) = delete;

  std::uint64_t send(OutMessage request) override;
  Message receive() override;
  const std::string& peer() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::transport
