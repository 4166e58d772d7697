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
// Sending in place: bulk frames whose values lie in SendRegions (a PS's row chunks) are
// not copied into send staging: the device gathers them where they are (the frame and
// message headers and the keys from staging, then each value segment), each region
// registered with a connection the first time that connection sends from it. Values
// elsewhere, or in more segments than the queue pair gathers, are copied into staging.
//
// Failures: a completion error or a malformed frame fails that connection (the client's
// pending requests throw IoError naming the peer); the server logs, drops it, and keeps
// serving every other connection.
//
// Authentication: the connect data carries each side's nonce (never the token); the
// client's first message must be a kHello proving it knows the job token over both
// nonces (auth.h), answered by a kHelloReply carrying the server's own proof. Before that
// nothing but the hello is read; a connection has hello_timeout to send it, and at most
// kRdmaMaxAuthenticating connections wait for theirs at a time (more wait to be accepted).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>

#include "ember/transport/channel.h"
#include "ember/transport/verbs.h"

namespace ember::transport {

// Empty when ibverbs lists at least one device; otherwise why not, ending in
// "; use --transport tcp" (no device, ibverbs unsupported by the kernel, or Ember built
// without libibverbs).
std::string rdma_unavailable_reason();

// Long-lived memory that sends may gather from in place. Whoever adds a region keeps it
// allocated and in place while any connection given these regions lives (the device reads
// it after a send returns, until its completion); what it holds while a reply from it is
// in flight is what arrives. Thread-safe.
class SendRegions {
 public:
  struct Region {
    const std::uint8_t* addr = nullptr;
    std::size_t bytes = 0;
    std::uint32_t id = 0;  // registrations are cached by it, per connection
  };
  // Adds [addr, addr + bytes); ConfigError if it overlaps a region added before.
  void add(const void* addr, std::size_t bytes);
  // The region that holds all of [p, p + bytes), if one does.
  std::optional<Region> find(const void* p, std::size_t bytes) const;
  std::size_t size() const;

 private:
  mutable std::shared_mutex mu_;
  std::map<std::uintptr_t, Region> by_start_;
};

struct RdmaOptions {
  std::uint32_t recv_depth = 32;        // RECVs posted per connection (the peer's credits)
  std::uint32_t inline_bytes = 4096;    // RECV buffer size: frames up to this go by SEND
  std::uint32_t slots = 4;              // bulk ring slots (also: client requests in flight)
  std::uint32_t slot_bytes = 4u << 20;  // largest frame; larger messages are refused
  std::chrono::milliseconds timeout{10000};
  // Values in these regions are sent in place (see above); none: every send copies.
  std::shared_ptr<const SendRegions> send_regions;
};

// Connections accepted and not yet authenticated, at most (each holds its pool).
inline constexpr std::uint32_t kRdmaMaxAuthenticating = 16;

struct RdmaServerOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port
  std::string token;       // proven by every connection's hello
  RdmaOptions rdma;
  std::chrono::milliseconds hello_timeout{10000};  // from accepting a connection to its hello
};

class RdmaServer final : public Server {
 public:
  // Listens on `fabric` (which must outlive the server) and serves each connection on
  // its own thread.
  RdmaServer(verbs::Fabric& fabric, RdmaServerOptions options, ServerHandler handler);
  // The same on a fabric the server keeps alive while it lives.
  RdmaServer(std::shared_ptr<verbs::Fabric> fabric, RdmaServerOptions options, ServerHandler handler);
  ~RdmaServer() override;  // stops listening, disconnects, joins threads
  RdmaServer(const RdmaServer&) = delete;
  RdmaServer& operator=(const RdmaServer&) = delete;

  std::uint16_t port() const override;
  std::uint64_t connections_dropped() const override;
  std::uint64_t requests_served() const override;
  std::uint32_t connections_open() const override;
  void drain(std::chrono::milliseconds grace) override;
  // Reply bytes the device gathered from SendRegions instead of a copy.
  std::uint64_t bytes_sent_in_place() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class RdmaClient final : public Client {
 public:
  // Connects with the job token; throws IoError (unreachable, refused, timeout).
  RdmaClient(verbs::Fabric& fabric, const std::string& host, std::uint16_t port, const std::string& token, RdmaOptions options = {});
  // The same on a fabric the client keeps alive while it lives.
  RdmaClient(std::shared_ptr<verbs::Fabric> fabric, const std::string& host, std::uint16_t port, const std::string& token,
             RdmaOptions options = {});
  ~RdmaClient() override;
  RdmaClient(const RdmaClient&) = delete;
  RdmaClient& operator=(const RdmaClient&) = delete;

  std::uint64_t send(OutMessage request) override;
  Message receive() override;
  const std::string& peer() const override;
  std::uint64_t bytes_sent() const override;
  std::uint64_t bytes_received() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::transport
