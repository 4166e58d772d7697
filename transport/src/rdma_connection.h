// Inside the RDMA data plane (rdma.h): one connection's protocol over its queue pair
// (Conn: the registered pool, frames, credits and slots; rdma_connection.cc), and what
// connection setup (rdma.cc: listen, accept, connect and the handshake) shares with it.
#pragma once

#include <bit>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/common/error.h"
#include "ember/transport/auth.h"
#include "ember/transport/channel.h"
#include "ember/transport/rdma.h"
#include "ember/transport/verbs.h"

namespace ember::transport::rdma_detail {

static_assert(std::endian::native == std::endian::little, "the RDMA frame and connect formats are little-endian");

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kConnectMagic = 0x43424d45;  // "EMBC"
constexpr std::uint16_t kConnectVersion = 2;         // 2: a nonce instead of the token's hash
constexpr std::uint16_t kNoSlot = 0xffff;
constexpr std::size_t kAlign = 64;  // pool pieces (RECV buffers, slots) are multiples of it

enum FrameKind : std::uint16_t { kData = 1, kCredit = 2 };

// What each side tells the other when connecting (rdma_cm private data, <= 56 bytes).
struct ConnInfo {
  std::uint32_t magic = kConnectMagic;
  std::uint16_t version = kConnectVersion;
  std::uint16_t recv_depth = 0;
  auth::Nonce nonce{};  // this side's, for the proofs of the hello (auth.h)
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0;
  std::uint32_t slots = 0;
  std::uint32_t slot_bytes = 0;
  std::uint32_t recv_bytes = 0;
};
static_assert(sizeof(ConnInfo) == 48);

// The connection ended because the peer went away: not an error of the peer's making.
class PeerClosed : public IoError {
 public:
  using IoError::IoError;
};

// `o` with its sizes rounded up to what the pool takes; ConfigError for depths or slot
// counts out of range.
RdmaOptions checked(RdmaOptions o);

// A message that arrived: in a RECV buffer, in a ring slot, or copied out (`owned`).
struct Frame {
  const std::uint8_t* msg = nullptr;
  std::uint32_t length = 0;
  std::uint16_t reply_slot = kNoSlot;
  int recv_index = -1;  // RECV buffer to re-post on release
  int slot = -1;        // ring slot to free on release
  std::vector<std::uint64_t> owned;
};

// A message view of a frame, its lengths validated.
Message view(const Frame& f, std::uint64_t max_payload, const std::string& peer);

// One connection's protocol state. Used by one thread at a time.
class Conn {
 public:
  // `requester`: this side sends requests and reserves its ring slots for their replies;
  // otherwise its ring takes requests and is credited to the peer.
  Conn(std::unique_ptr<verbs::Endpoint> ep, const RdmaOptions& o, bool requester);
  ~Conn();

  verbs::Endpoint& endpoint() { return *ep_; }
  const std::string& peer() const { return peer_name_; }

  // What this side tells the peer when connecting.
  ConnInfo local_info(const auth::Nonce& nonce) const;
  // What the peer told (its pool and credits).
  void set_peer(const ConnInfo& p);
  const ConnInfo& peer_info() const { return peer_; }

  // Whether a message of `bytes` (header + payload) can be sent; ProtocolError if not.
  void check_fits(std::uint64_t bytes) const;

  // A slot of this side's ring for the reply to the next request (requester only).
  std::uint16_t reserve_reply_slot(Clock::time_point deadline);

  // Whether a reply (to a slot the requester reserved) could be sent now without waiting
  // for credits, by what the completions seen so far say.
  bool can_send_now(const OutMessage& reply) const;
  // Keep one RECV credit back for credit-only frames.
  bool has_credits(bool bulk, bool to_ring) const;

  // Sends one message as a data frame. `reply_slot`: a request's reserved reply slot;
  // `target_slot`: a reply's destination slot at the requester.
  void send_message(const OutMessage& m, std::uint16_t reply_slot, std::uint16_t target_slot, Clock::time_point deadline);

  // The next data frame in arrival order, or nothing at the deadline.
  std::optional<Frame> next(Clock::time_point deadline);

  // Gives a frame's RECV buffer and slot back (and tells the peer when many are owed).
  void release(Frame& f);

  [[noreturn]] void fail(const std::string& why);

  // Reply bytes sent in place since the last call.
  std::uint64_t take_in_place_bytes() { return std::exchange(in_place_bytes_, 0); }

  void fail_if_broken();

 private:
  static constexpr std::uint32_t kBulkStaging = 2;

  // Points w.sges[1...] at the message's values where they lie, when every piece is in a
  // send region and they fit the queue pair's gather list; false (w's pieces beyond the
  // first unused) otherwise.
  bool gather_in_place(const OutMessage& m, verbs::SendRequest& w);

  // The lkey of the send region that holds [p, p + bytes), registered with this
  // connection the first time; none if no region holds it or it cannot be registered.
  std::optional<std::uint32_t> send_lkey(const void* p, std::size_t bytes);

  static std::uint32_t take(std::deque<std::uint32_t>& q);

  void post_recv(std::uint32_t i);

  void write_frame_header(std::uint8_t* buf, FrameKind kind, std::uint32_t length, std::uint16_t reply_slot);

  // Credits go back by themselves once half a window is owed and no data frame carried
  // them. Never blocks: without a credit or a buffer it tries again on the next call.
  void maybe_send_credits();

  // While blocked: copy arrived frames out so their buffers and slots go back to the
  // peer, which may itself be waiting for them.
  void park_arrived();

  template <typename Ready>
  void wait_until(Ready ready, Clock::time_point deadline, const char* what);

  void progress(std::chrono::milliseconds wait);

  void on_completion(const verbs::Completion& c);

  std::unique_ptr<verbs::Endpoint> ep_;
  RdmaOptions opt_;
  bool requester_;
  std::string peer_name_;
  ConnInfo peer_;
  std::uint8_t* pool_ = nullptr;
  std::size_t recv_off_ = 0, ring_off_ = 0, small_off_ = 0, bulk_off_ = 0, total_ = 0;
  verbs::MemoryRegion mr_;
  std::uint32_t max_sges_ = 1;                                                // the queue pair's gather list
  std::unordered_map<std::uint32_t, std::optional<std::uint32_t>> send_mrs_;  // send region id -> lkey (none: copy)
  std::uint64_t in_place_bytes_ = 0;
  std::deque<std::uint32_t> free_small_, free_bulk_;
  std::deque<std::uint16_t> free_slots_, reserved_;  // requester: reply slots
  std::uint32_t send_credits_ = 0, ring_credits_ = 0, ring_next_ = 0;
  std::uint32_t owed_recv_ = 0, owed_slots_ = 0;
  std::deque<Frame> arrived_;
  std::string broken_;
  bool peer_closed_ = false;
};

}  // namespace ember::transport::rdma_detail
