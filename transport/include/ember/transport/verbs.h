// The few verbs the RDMA data plane needs, behind a thin interface: memory registration,
// posting SEND / RDMA WRITE with immediate / RECV on one RC queue pair, polling and
// waiting on its completion queue, and connection setup with private data (rdma_cm).
//
// Two implementations: `make_ibverbs_fabric()` (libibverbs + librdmacm, verbs_ibv.cc)
// and `FakeFabric` (verbs_fake.h), an in-process fabric with the same semantics against
// which the protocol (slots, credits, ordering, completion errors) is tested on machines
// without an RDMA device.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ember::transport::verbs {

struct MemoryRegion {
  std::uint8_t* addr = nullptr;
  std::size_t length = 0;
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
};

enum class Opcode : std::uint8_t {
  kSend,          // post_send: two-sided, consumes one posted RECV at the peer
  kWriteWithImm,  // post_send: one-sided write into the peer's memory + a 32-bit immediate
                  // that consumes one posted RECV there (its completion carries the imm)
  kRecv,          // completion of a RECV filled by a SEND
  kRecvWithImm,   // completion of a RECV consumed by a WRITE with immediate
};

struct Sge {
  const void* addr = nullptr;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
};

// The most pieces one send gathers (an endpoint may take fewer: max_send_sges()).
inline constexpr std::uint32_t kMaxSendSges = 16;

struct SendRequest {
  std::uint64_t wr_id = 0;
  Opcode opcode = Opcode::kSend;
  // The bytes sent: sges[0, sge_count) read in order, each within memory registered on
  // this endpoint under its lkey.
  std::array<Sge, kMaxSendSges> sges{};
  std::uint32_t sge_count = 1;
  std::uint64_t remote_addr = 0;  // kWriteWithImm
  std::uint32_t rkey = 0;         // kWriteWithImm
  std::uint32_t imm = 0;          // kWriteWithImm
};

struct RecvRequest {
  std::uint64_t wr_id = 0;
  Sge sge;
};

struct Completion {
  std::uint64_t wr_id = 0;
  Opcode opcode = Opcode::kSend;
  bool ok = true;
  bool flushed = false;        // !ok because the queue pair was disconnected or failed
  std::string status;          // why, when !ok (e.g. "remote access error")
  std::uint32_t byte_len = 0;  // received bytes (RECV completions)
  std::uint32_t imm = 0;       // kRecvWithImm
};

// One reliable-connected queue pair with its own completion queue and protection domain.
// Every call may throw IoError (the device refused it).
class Endpoint {
 public:
  virtual ~Endpoint() = default;  // disconnects: the peer's outstanding RECVs fail

  // Registers memory for local access and remote writes. Done once per pool.
  virtual MemoryRegion register_memory(void* addr, std::size_t bytes) = 0;
  // Registers memory that sends only read (gathered in place): the peer can never write
  // it, nor can a RECV land in it.
  virtual MemoryRegion register_for_sends(const void* addr, std::size_t bytes) = 0;
  // How many pieces one post_send may gather (1 to kMaxSendSges).
  virtual std::uint32_t max_send_sges() const = 0;
  virtual void post_recv(const RecvRequest& r) = 0;
  virtual void post_send(const SendRequest& s) = 0;  // always signaled
  // Up to out.size() completions, without blocking.
  virtual std::size_t poll(std::span<Completion> out) = 0;
  // Blocks until a completion may be ready or the timeout passes.
  virtual void wait(std::chrono::milliseconds timeout) = 0;

  // Client side, after resolve() and registration: connects, sending `private_data`
  // (at most 56 bytes); returns the server's. Throws IoError when refused (with the
  // server's reason) or after `timeout`.
  virtual std::vector<std::uint8_t> connect(std::span<const std::uint8_t> private_data, std::chrono::milliseconds timeout) = 0;
  // Server side, for an endpoint from Listener::next().
  virtual void accept(std::span<const std::uint8_t> private_data) = 0;
  virtual void reject(const std::string& why) = 0;

  virtual const std::string& peer() const = 0;
};

struct ConnectRequest {
  std::unique_ptr<Endpoint> endpoint;
  std::vector<std::uint8_t> private_data;
};

class Listener {
 public:
  virtual ~Listener() = default;
  virtual std::uint16_t port() const = 0;
  // The next connection request, or nothing after `timeout`.
  virtual std::optional<ConnectRequest> next(std::chrono::milliseconds timeout) = 0;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual std::unique_ptr<Listener> listen(const std::string& address, std::uint16_t port) = 0;
  // An endpoint whose route to host:port is resolved; register memory, then connect().
  virtual std::unique_ptr<Endpoint> resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) = 0;
};

// The ibverbs + rdma_cm fabric; throws ConfigError with rdma_unavailable_reason() when
// this machine has no RDMA device (or Ember was built without libibverbs).
std::unique_ptr<Fabric> make_ibverbs_fabric();

}  // namespace ember::transport::verbs
