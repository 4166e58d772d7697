// The RDMA protocol (rdma.h) over the verbs interface: one Conn per queue pair holds
// the registered pool, the credits and the frames that arrived; RdmaServer and
// RdmaClient drive it.
#include "ember/transport/rdma.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/process.h"

namespace ember::transport {

static_assert(std::endian::native == std::endian::little, "the RDMA frame and connect formats are little-endian");

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint32_t kFrameMagic = 0x46424d45;   // "EMBF"
constexpr std::uint32_t kConnectMagic = 0x43424d45; // "EMBC"
constexpr std::uint16_t kConnectVersion = 1;
constexpr std::uint32_t kImmTag = 0xeb000000;       // immediate = tag | slot
constexpr std::uint16_t kNoSlot = 0xffff;
constexpr std::uint32_t kFrameHeaderBytes = 16;
constexpr std::size_t kAlign = 64;

enum FrameKind : std::uint16_t { kData = 1, kCredit = 2 };

struct FrameHeader {
  std::uint32_t magic;
  std::uint16_t kind;
  std::uint16_t recv_credits;  // RECVs the sender re-posted since its last report
  std::uint32_t length;        // message bytes after this header
  std::uint16_t slot_credits;  // ring slots the sender freed since its last report
  std::uint16_t reply_slot;    // requests: the requester's slot reserved for the reply
};
static_assert(sizeof(FrameHeader) == kFrameHeaderBytes);

// What each side tells the other when connecting (rdma_cm private data, <= 56 bytes).
struct ConnInfo {
  std::uint32_t magic = kConnectMagic;
  std::uint16_t version = kConnectVersion;
  std::uint16_t recv_depth = 0;
  std::uint64_t token = 0;
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0;
  std::uint32_t slots = 0;
  std::uint32_t slot_bytes = 0;
  std::uint32_t recv_bytes = 0;
};
static_assert(sizeof(ConnInfo) == 40);

std::vector<std::uint8_t> encode_info(const ConnInfo& c) {
  std::vector<std::uint8_t> out(sizeof(ConnInfo));
  std::memcpy(out.data(), &c, sizeof(c));
  return out;
}

ConnInfo decode_info(const std::vector<std::uint8_t>& in, const std::string& peer) {
  ConnInfo c;
  if (in.size() < sizeof(ConnInfo)) throw ProtocolError("RDMA peer " + peer + ": connect data of " + std::to_string(in.size()) + " bytes");
  std::memcpy(&c, in.data(), sizeof(c));
  if (c.magic != kConnectMagic) throw ProtocolError("RDMA peer " + peer + ": not an Ember connection (bad magic)");
  if (c.version != kConnectVersion) throw ProtocolError("RDMA peer " + peer + ": connect version " + std::to_string(c.version));
  if (c.recv_depth < 2 || c.slots == 0 || c.slots >= kNoSlot || c.slot_bytes < 4096 || c.recv_bytes < 128 ||
      c.slot_bytes % kAlign != 0 || c.recv_bytes % kAlign != 0) {
    throw ProtocolError("RDMA peer " + peer + ": unusable pool geometry in its connect data");
  }
  return c;
}

class PeerClosed : public IoError {
 public:
  using IoError::IoError;
};

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

RdmaOptions checked(RdmaOptions o) {
  o.inline_bytes = static_cast<std::uint32_t>(round_up(std::max<std::uint32_t>(o.inline_bytes, 128)));
  o.slot_bytes = static_cast<std::uint32_t>(round_up(std::max<std::uint32_t>(o.slot_bytes, 4096)));
  if (o.recv_depth < 4 || o.recv_depth > 4096) throw ConfigError("RDMA receive depth must be in [4, 4096]");
  if (o.slots < 2 || o.slots > 1024) throw ConfigError("RDMA slots must be in [2, 1024]");
  return o;
}

// A message that arrived: in a RECV buffer, in a ring slot, or copied out (`owned`).
struct Frame {
  const std::uint8_t* msg = nullptr;
  std::uint32_t length = 0;
  std::uint16_t reply_slot = kNoSlot;
  int recv_index = -1;  // RECV buffer to re-post on release
  int slot = -1;        // ring slot to free on release
  std::vector<std::uint64_t> owned;
};

constexpr std::uint64_t kSendTag = 1ull << 63, kBulkTag = 1ull << 62;

// One connection's protocol state. Used by one thread at a time.
class Conn {
 public:
  // `requester`: this side sends requests and reserves its ring slots for their replies;
  // otherwise its ring takes requests and is credited to the peer.
  Conn(std::unique_ptr<verbs::Endpoint> ep, const RdmaOptions& o, bool requester)
      : ep_(std::move(ep)), opt_(checked(o)), requester_(requester), peer_name_(ep_->peer()) {
    const std::size_t R = opt_.recv_depth, in = opt_.inline_bytes, M = opt_.slots, S = opt_.slot_bytes;
    recv_off_ = 0;
    ring_off_ = recv_off_ + R * in;
    small_off_ = ring_off_ + M * S;
    bulk_off_ = small_off_ + R * in;
    total_ = bulk_off_ + kBulkStaging * S;
    pool_ = static_cast<std::uint8_t*>(std::aligned_alloc(4096, round_up(total_ + 4095) / 4096 * 4096));
    if (pool_ == nullptr) throw IoError("RDMA: cannot allocate a " + std::to_string(total_ >> 20) + " MiB connection pool");
    mr_ = ep_->register_memory(pool_, total_);  // the one registration of this pool (send regions: see send_lkey)
    max_sges_ = std::min(ep_->max_send_sges(), verbs::kMaxSendSges);
    for (std::uint32_t i = 0; i < R; ++i) post_recv(i);
    for (std::uint32_t i = 0; i < R; ++i) free_small_.push_back(i);
    for (std::uint32_t i = 0; i < kBulkStaging; ++i) free_bulk_.push_back(i);
    if (requester_) {
      for (std::uint32_t i = 0; i < M; ++i) free_slots_.push_back(static_cast<std::uint16_t>(i));
    }
  }
  ~Conn() {
    ep_.reset();  // disconnect before the registered memory goes away
    std::free(pool_);
  }

  verbs::Endpoint& endpoint() { return *ep_; }
  const std::string& peer() const { return peer_name_; }

  ConnInfo local_info(std::uint64_t token) const {
    ConnInfo c;
    c.recv_depth = static_cast<std::uint16_t>(opt_.recv_depth);
    c.token = token;
    c.ring_addr = reinterpret_cast<std::uintptr_t>(pool_ + ring_off_);
    c.ring_rkey = mr_.rkey;
    c.slots = opt_.slots;
    c.slot_bytes = opt_.slot_bytes;
    c.recv_bytes = opt_.inline_bytes;
    return c;
  }

  void set_peer(const ConnInfo& p) {
    peer_ = p;
    send_credits_ = p.recv_depth;
    ring_credits_ = p.slots;
  }

  // Whether a message of `bytes` (header + payload) can be sent; ProtocolError if not.
  void check_fits(std::uint64_t bytes) const {
    const std::uint64_t frame = kFrameHeaderBytes + bytes;
    const std::uint64_t limit = std::min<std::uint64_t>(opt_.slot_bytes, peer_.slot_bytes);
    if (frame > limit) {
      throw ProtocolError("message of " + std::to_string(bytes) + " bytes exceeds the RDMA slot size (" + std::to_string(limit) +
                          " bytes; raise the slot size on both sides)");
    }
  }

  // A slot of this side's ring for the reply to the next request (requester only).
  std::uint16_t reserve_reply_slot(Clock::time_point deadline) {
    wait_until([&] { return !free_slots_.empty(); }, deadline, "waiting for a free reply slot");
    std::uint16_t s = free_slots_.front();
    free_slots_.pop_front();
    reserved_.push_back(s);
    return s;
  }

  // Whether a reply (to a slot the requester reserved) could be sent now without waiting
  // for credits, by what the completions seen so far say.
  bool can_send_now(const OutMessage& reply) const {
    const std::uint64_t frame = kFrameHeaderBytes + kHeaderBytes + 8ull * reply.key_count + 4ull * reply.value_count;
    return has_credits(frame > std::min(opt_.inline_bytes, peer_.recv_bytes), false);
  }
  // Keep one RECV credit back for credit-only frames.
  bool has_credits(bool bulk, bool to_ring) const {
    return send_credits_ >= 2 && (!to_ring || ring_credits_ > 0) && !(bulk ? free_bulk_ : free_small_).empty();
  }

  // Sends one message as a data frame. `reply_slot`: a request's reserved reply slot;
  // `target_slot`: a reply's destination slot at the requester.
  void send_message(const OutMessage& m, std::uint16_t reply_slot, std::uint16_t target_slot, Clock::time_point deadline) {
    const std::uint64_t bytes = kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count;
    check_fits(bytes);
    const std::uint32_t frame = static_cast<std::uint32_t>(kFrameHeaderBytes + bytes);
    const bool bulk = frame > std::min(opt_.inline_bytes, peer_.recv_bytes);
    const bool to_ring = bulk && target_slot == kNoSlot;  // a bulk request takes a slot of the peer's ring
    wait_until([&] { return has_credits(bulk, to_ring); }, deadline, "waiting for the peer's credits");
    std::uint32_t staging = take(bulk ? free_bulk_ : free_small_);
    std::uint8_t* buf = pool_ + (bulk ? bulk_off_ + std::size_t{staging} * opt_.slot_bytes : small_off_ + std::size_t{staging} * opt_.inline_bytes);
    write_frame_header(buf, kData, static_cast<std::uint32_t>(bytes), reply_slot);
    MessageHeader h = m.header;
    h.key_count = m.key_count;
    h.value_count = m.value_count;
    encode_header(h, buf + kFrameHeaderBytes);
    std::uint8_t* p = buf + kFrameHeaderBytes + kHeaderBytes;
    if (m.key_count) std::memcpy(p, m.keys, 8ull * m.key_count);
    p += 8ull * m.key_count;
    verbs::SendRequest w;
    if (bulk && gather_in_place(m, w)) {
      // The headers and keys from staging, the values where they lie.
      w.sges[0] = {buf, static_cast<std::uint32_t>(p - buf), mr_.lkey};
      in_place_bytes_ += 4ull * m.value_count;
    } else {
      if (m.value_segments != nullptr) {
        for (std::uint32_t i = 0; i < m.segment_count; ++i) {
          std::memcpy(p, m.value_segments[i].data, 4ull * m.value_segments[i].floats);
          p += 4ull * m.value_segments[i].floats;
        }
      } else if (m.value_count) {
        std::memcpy(p, m.values, 4ull * m.value_count);
      }
      w.sges[0] = {buf, frame, mr_.lkey};
      w.sge_count = 1;
    }
    w.wr_id = kSendTag | (bulk ? kBulkTag : 0) | staging;
    if (!bulk) {
      w.opcode = verbs::Opcode::kSend;
    } else {
      std::uint32_t slot = target_slot;
      if (to_ring) {
        slot = ring_next_++ % peer_.slots;
        --ring_credits_;
      } else if (slot >= peer_.slots) {
        throw ProtocolError("reply slot " + std::to_string(slot) + " out of the requester's " + std::to_string(peer_.slots));
      }
      w.opcode = verbs::Opcode::kWriteWithImm;
      w.remote_addr = peer_.ring_addr + std::uint64_t{slot} * peer_.slot_bytes;
      w.rkey = peer_.ring_rkey;
      w.imm = kImmTag | slot;
    }
    --send_credits_;
    ep_->post_send(w);
  }

  // The next data frame in arrival order, or nothing at the deadline.
  std::optional<Frame> next(Clock::time_point deadline) {
    for (;;) {
      if (!arrived_.empty()) {
        Frame f = std::move(arrived_.front());
        arrived_.pop_front();
        return f;
      }
      fail_if_broken();
      auto now = Clock::now();
      if (now >= deadline) return std::nullopt;
      progress(std::min(std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1), milliseconds(50)));
    }
  }

  // Gives a frame's RECV buffer and slot back (and tells the peer when many are owed).
  void release(Frame& f) {
    if (!broken_.empty()) {  // nothing to give back to a queue pair that is gone
      f.recv_index = -1;
      f.slot = -1;
      return;
    }
    if (f.recv_index >= 0) {
      post_recv(static_cast<std::uint32_t>(f.recv_index));
      ++owed_recv_;
      f.recv_index = -1;
    }
    if (f.slot >= 0) {
      if (requester_) {
        free_slots_.push_back(static_cast<std::uint16_t>(f.slot));
      } else {
        ++owed_slots_;
      }
      f.slot = -1;
    }
    maybe_send_credits();
  }

  [[noreturn]] void fail(const std::string& why) {
    if (broken_.empty()) broken_ = why;
    throw IoError("RDMA peer " + peer_name_ + ": " + why);
  }

  // Reply bytes sent in place since the last call.
  std::uint64_t take_in_place_bytes() { return std::exchange(in_place_bytes_, 0); }

  void fail_if_broken() {
    if (broken_.empty()) return;
    // A peer that went away ends the connection: not an error of the peer's making.
    if (peer_closed_) throw PeerClosed("RDMA peer " + peer_name_ + ": " + broken_);
    throw IoError("RDMA peer " + peer_name_ + ": connection failed earlier (" + broken_ + ")");
  }

 private:
  static constexpr std::uint32_t kBulkStaging = 2;

  // Points w.sges[1...] at the message's values where they lie, when every piece is in a
  // send region and they fit the queue pair's gather list; false (w's pieces beyond the
  // first unused) otherwise.
  bool gather_in_place(const OutMessage& m, verbs::SendRequest& w) {
    if (!opt_.send_regions || m.value_count == 0) return false;
    const Segment whole{m.values, m.value_count};
    const Segment* pieces = m.value_segments != nullptr ? m.value_segments : &whole;
    const std::uint32_t count = m.value_segments != nullptr ? m.segment_count : 1;
    std::uint32_t n = 1;
    for (std::uint32_t i = 0; i < count; ++i) {
      if (pieces[i].floats == 0) continue;
      if (n == max_sges_) return false;
      const std::uint32_t bytes = 4u * pieces[i].floats;
      const std::optional<std::uint32_t> lkey = send_lkey(pieces[i].data, bytes);
      if (!lkey) return false;
      w.sges[n++] = {pieces[i].data, bytes, *lkey};
    }
    w.sge_count = n;
    return true;
  }

  // The lkey of the send region that holds [p, p + bytes), registered with this
  // connection the first time; none if no region holds it or it cannot be registered.
  std::optional<std::uint32_t> send_lkey(const void* p, std::size_t bytes) {
    const std::optional<SendRegions::Region> region = opt_.send_regions->find(p, bytes);
    if (!region) return std::nullopt;
    auto it = send_mrs_.find(region->id);
    if (it == send_mrs_.end()) {
      std::optional<std::uint32_t> lkey;
      try {
        lkey = ep_->register_for_sends(region->addr, region->bytes).lkey;
      } catch (const IoError& e) {
        // Pinned memory is limited (RLIMIT_MEMLOCK): sends from this region copy instead.
        spdlog::warn("rdma {}: sending a {} MiB region with copies: {}", peer_name_, region->bytes >> 20, e.what());
      }
      it = send_mrs_.emplace(region->id, lkey).first;
    }
    return it->second;
  }

  static std::uint32_t take(std::deque<std::uint32_t>& q) {
    std::uint32_t v = q.front();
    q.pop_front();
    return v;
  }

  void post_recv(std::uint32_t i) {
    verbs::RecvRequest r;
    r.wr_id = i;
    r.sge = {pool_ + recv_off_ + std::size_t{i} * opt_.inline_bytes, opt_.inline_bytes, mr_.lkey};
    ep_->post_recv(r);
  }

  void write_frame_header(std::uint8_t* buf, FrameKind kind, std::uint32_t length, std::uint16_t reply_slot) {
    FrameHeader fh{kFrameMagic, kind, static_cast<std::uint16_t>(owed_recv_), length, static_cast<std::uint16_t>(owed_slots_), reply_slot};
    owed_recv_ = 0;
    owed_slots_ = 0;
    std::memcpy(buf, &fh, sizeof(fh));
  }

  // Credits go back by themselves once half a window is owed and no data frame carried
  // them. Never blocks: without a credit or a buffer it tries again on the next call.
  void maybe_send_credits() {
    if (owed_recv_ < opt_.recv_depth / 2 && owed_slots_ < std::max<std::uint32_t>(1, opt_.slots / 2)) return;
    if (send_credits_ < 1 || free_small_.empty()) return;
    std::uint32_t staging = take(free_small_);
    std::uint8_t* buf = pool_ + small_off_ + std::size_t{staging} * opt_.inline_bytes;
    write_frame_header(buf, kCredit, 0, kNoSlot);
    verbs::SendRequest w;
    w.wr_id = kSendTag | staging;
    w.opcode = verbs::Opcode::kSend;
    w.sges[0] = {buf, kFrameHeaderBytes, mr_.lkey};
    --send_credits_;
    ep_->post_send(w);
  }

  // While blocked: copy arrived frames out so their buffers and slots go back to the
  // peer, which may itself be waiting for them.
  void park_arrived() {
    for (Frame& f : arrived_) {
      if (f.recv_index < 0 && f.slot < 0) continue;
      f.owned.resize((f.length + 7) / 8);
      std::memcpy(f.owned.data(), f.msg, f.length);
      f.msg = reinterpret_cast<const std::uint8_t*>(f.owned.data());
      release(f);
    }
  }

  template <typename Ready>
  void wait_until(Ready ready, Clock::time_point deadline, const char* what) {
    for (;;) {
      fail_if_broken();
      if (ready()) return;
      auto now = Clock::now();
      if (now >= deadline) fail(std::string(what) + ": timed out");
      park_arrived();
      if (ready()) return;
      progress(std::min(std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1), milliseconds(50)));
    }
  }

  void progress(milliseconds wait) {
    verbs::Completion cs[32];
    std::size_t n = ep_->poll(cs);
    if (n == 0 && wait.count() > 0) {
      ep_->wait(wait);
      n = ep_->poll(cs);
    }
    for (std::size_t i = 0; i < n; ++i) on_completion(cs[i]);
    maybe_send_credits();
  }

  void on_completion(const verbs::Completion& c) {
    if (!c.ok && c.flushed) {
      // The peer went away: frames that arrived before still get delivered (next()).
      if (broken_.empty()) {
        broken_ = "connection closed (" + c.status + ")";
        peer_closed_ = true;
      }
      return;
    }
    if (!c.ok) fail("completion error: " + c.status);
    if (c.wr_id & kSendTag) {
      auto idx = static_cast<std::uint32_t>(c.wr_id & 0xffffffff);
      ((c.wr_id & kBulkTag) ? free_bulk_ : free_small_).push_back(idx);
      return;
    }
    const auto idx = static_cast<std::uint32_t>(c.wr_id);
    if (idx >= opt_.recv_depth) fail("completion for an unknown RECV");
    Frame f;
    const std::uint8_t* data = nullptr;
    std::uint32_t capacity = 0;
    if (c.opcode == verbs::Opcode::kRecv) {
      data = pool_ + recv_off_ + std::size_t{idx} * opt_.inline_bytes;
      capacity = opt_.inline_bytes;
      f.recv_index = static_cast<int>(idx);
    } else if (c.opcode == verbs::Opcode::kRecvWithImm) {
      post_recv(idx);  // the RECV only carried the immediate: re-post it at once
      ++owed_recv_;
      std::uint32_t slot = c.imm & 0xffffff;
      if ((c.imm & 0xff000000) != kImmTag || slot >= opt_.slots) fail("write into an unknown slot (immediate " + std::to_string(c.imm) + ")");
      data = pool_ + ring_off_ + std::size_t{slot} * opt_.slot_bytes;
      capacity = opt_.slot_bytes;
      f.slot = static_cast<int>(slot);
    } else {
      fail("unexpected completion");
    }
    FrameHeader fh;
    if (c.byte_len < kFrameHeaderBytes || c.byte_len > capacity) fail("frame of " + std::to_string(c.byte_len) + " bytes");
    std::memcpy(&fh, data, sizeof(fh));
    if (fh.magic != kFrameMagic) fail("frame with a bad magic");
    if (fh.length + kFrameHeaderBytes != c.byte_len) fail("frame length " + std::to_string(fh.length) + " disagrees with the bytes received");
    send_credits_ += fh.recv_credits;
    ring_credits_ += fh.slot_credits;
    if (send_credits_ > peer_.recv_depth || ring_credits_ > peer_.slots) fail("the peer returned more credits than it was given");
    if (fh.kind == kCredit) {
      if (f.slot >= 0 || fh.length != 0) fail("malformed credit frame");
      release(f);
      return;
    }
    if (fh.kind != kData) fail("unknown frame kind " + std::to_string(fh.kind));
    if (requester_) {
      // Replies come in request order, each into (or on behalf of) its reserved slot.
      if (reserved_.empty()) fail("a reply to no request");
      std::uint16_t expected = reserved_.front();
      reserved_.pop_front();
      if (f.slot >= 0 && f.slot != expected) fail("reply written into slot " + std::to_string(f.slot) + ", reserved " + std::to_string(expected));
      f.slot = expected;
    } else if (fh.reply_slot >= peer_.slots) {
      fail("request without a valid reply slot");
    }
    f.msg = data + kFrameHeaderBytes;
    f.length = fh.length;
    f.reply_slot = fh.reply_slot;
    arrived_.push_back(std::move(f));
  }

  std::unique_ptr<verbs::Endpoint> ep_;
  RdmaOptions opt_;
  bool requester_;
  std::string peer_name_;
  ConnInfo peer_;
  std::uint8_t* pool_ = nullptr;
  std::size_t recv_off_ = 0, ring_off_ = 0, small_off_ = 0, bulk_off_ = 0, total_ = 0;
  verbs::MemoryRegion mr_;
  std::uint32_t max_sges_ = 1;  // the queue pair's gather list
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

// A message view of a frame, its lengths validated.
Message view(const Frame& f, std::uint64_t max_payload, const std::string& peer) {
  if (f.length < kHeaderBytes) throw ProtocolError("RDMA peer " + peer + ": frame too short for a message header");
  Message m;
  m.header = decode_header(f.msg, max_payload);
  if (kHeaderBytes + m.header.payload_bytes() != f.length) {
    throw ProtocolError("RDMA peer " + peer + ": message length disagrees with its frame");
  }
  m.keys = reinterpret_cast<const Key*>(f.msg + kHeaderBytes);
  m.values = reinterpret_cast<const float*>(f.msg + kHeaderBytes + 8ull * m.header.key_count);
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------- send regions

void SendRegions::add(const void* addr, std::size_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(addr);
  std::unique_lock lock(mu_);
  auto next = by_start_.lower_bound(start);
  const bool overlaps_next = next != by_start_.end() && next->first < start + bytes;
  const bool overlaps_prev = next != by_start_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > start;
  if (bytes == 0) throw ConfigError("a send region of 0 bytes");
  if (overlaps_next || overlaps_prev) throw ConfigError("a send region of " + std::to_string(bytes) + " bytes overlaps one added before");
  by_start_[start] = {static_cast<const std::uint8_t*>(addr), bytes, static_cast<std::uint32_t>(by_start_.size())};
}

std::optional<SendRegions::Region> SendRegions::find(const void* p, std::size_t bytes) const {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lock(mu_);
  auto it = by_start_.upper_bound(at);  // the first region starting after p
  if (it == by_start_.begin()) return std::nullopt;
  --it;
  if (at + bytes > it->first + it->second.bytes) return std::nullopt;
  return it->second;
}

std::size_t SendRegions::size() const {
  std::shared_lock lock(mu_);
  return by_start_.size();
}

// ---------------------------------------------------------------------------- server

struct RdmaServer::Impl {
  RdmaServerOptions opt;
  RequestHandler handler;
  std::unique_ptr<verbs::Listener> listener;
  std::uint64_t token = 0;
  std::atomic<bool> stop{false}, draining{false};
  std::atomic<std::uint64_t> dropped{0}, served{0}, sent_in_place{0};
  std::thread acceptor;
  struct Session {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Session> sessions;  // touched by the acceptor thread only, then by the destructor

  void accept_loop() {
    while (!stop.load() && !draining.load()) {
      std::optional<verbs::ConnectRequest> req;
      try {
        req = listener->next(milliseconds(50));
      } catch (const std::exception& e) {
        spdlog::warn("rdma server: listener: {}", e.what());
        continue;
      }
      if (!req) continue;
      reap();
      std::shared_ptr<Conn> conn;
      try {
        ConnInfo info = decode_info(req->private_data, req->endpoint->peer());
        if (info.token != token) {
          spdlog::warn("rdma server: refusing {}: wrong job token", req->endpoint->peer());
          ++dropped;
          req->endpoint->reject("wrong job token");
          continue;
        }
        conn = std::make_shared<Conn>(std::move(req->endpoint), opt.rdma, /*requester=*/false);
        conn->set_peer(info);
        conn->endpoint().accept(encode_info(conn->local_info(token)));
      } catch (const std::exception& e) {
        spdlog::warn("rdma server: refusing a connection: {}", e.what());
        ++dropped;
        if (req->endpoint) req->endpoint->reject(e.what());
        continue;
      }
      sessions.emplace_back();
      Session& s = sessions.back();
      s.thread = std::thread([this, conn, &s] {
        name_this_thread("rdma-conn");
        serve(*conn);
        s.done = true;
      });
    }
  }

  void reap() {
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (it->done.load()) {
        it->thread.join();
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(Conn& conn) {
    Scratch scratch;
    std::vector<Key> error_storage;
    try {
      while (!stop.load() && !draining.load()) {  // draining: the request in hand is finished first
        auto f = conn.next(Clock::now() + milliseconds(50));
        if (!f) continue;
        Message m = view(*f, opt.rdma.slot_bytes, conn.peer());
        OutMessage reply;
        try {
          handler(m, reply, scratch);
          ++served;
        } catch (const ProtocolError& e) {
          make_error_reply(e.what(), reply, error_storage);
        }
        if (stop.load()) break;  // stopping: no more replies (as TCP closes its sockets)
        reply.header.request_id = m.header.request_id;
        reply.header.iteration = reply.header.iteration ? reply.header.iteration : m.header.iteration;
        const auto deadline = Clock::now() + opt.rdma.timeout;
        try {
          conn.check_fits(kHeaderBytes + 8ull * reply.key_count + 4ull * reply.value_count);
        } catch (const ProtocolError& e) {
          make_error_reply(e.what(), reply, error_storage);
          reply.header.request_id = m.header.request_id;
        }
        // The handler's work for after its reply (a commit's apply) runs once the reply
        // is posted; first if the send might wait for credits (a reader on another
        // thread may be waiting for that work).
        std::function<void()> after = take_after_reply(scratch);
        if (after && !conn.can_send_now(reply)) std::exchange(after, nullptr)();
        conn.send_message(reply, kNoSlot, f->reply_slot, deadline);
        sent_in_place += conn.take_in_place_bytes();
        if (after) after();
        conn.release(*f);
      }
    } catch (const PeerClosed& e) {
      spdlog::debug("rdma server: {}", e.what());
    } catch (const std::exception& e) {
      if (!stop.load()) {
        spdlog::warn("rdma server: dropping peer {}: {}", conn.peer(), e.what());
        ++dropped;
      }
    }
  }
};

RdmaServer::RdmaServer(verbs::Fabric& fabric, RdmaServerOptions options, RequestHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->opt.rdma = checked(impl_->opt.rdma);
  impl_->handler = std::move(handler);
  impl_->token = token_hash(impl_->opt.token);
  impl_->listener = fabric.listen(impl_->opt.address, impl_->opt.port);
  impl_->acceptor = std::thread([this] {
    name_this_thread("rdma-accept");
    impl_->accept_loop();
  });
}

void RdmaServer::drain(std::chrono::milliseconds grace) {
  impl_->draining = true;
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  const auto deadline = Clock::now() + grace;
  for (auto& s : impl_->sessions) {
    while (!s.done.load() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  }
}

RdmaServer::~RdmaServer() {
  impl_->stop = true;
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  for (auto& s : impl_->sessions) s.thread.join();
  impl_->listener.reset();
}

std::uint16_t RdmaServer::port() const { return impl_->listener->port(); }
std::uint64_t RdmaServer::connections_dropped() const { return impl_->dropped.load(); }
std::uint64_t RdmaServer::requests_served() const { return impl_->served.load(); }
std::uint64_t RdmaServer::bytes_sent_in_place() const { return impl_->sent_in_place.load(); }

// ---------------------------------------------------------------------------- client

struct RdmaClient::Impl {
  std::unique_ptr<Conn> conn;
  RdmaOptions opt;
  std::string peer;
  std::uint64_t next_id = 1;
  std::optional<Frame> held;  // the frame behind the last receive()'s view
};

RdmaClient::RdmaClient(verbs::Fabric& fabric, const std::string& host, std::uint16_t port, const std::string& token, RdmaOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->opt = checked(options);
  impl_->peer = host + ":" + std::to_string(port);
  auto ep = fabric.resolve(host, port, impl_->opt.timeout);
  impl_->conn = std::make_unique<Conn>(std::move(ep), impl_->opt, /*requester=*/true);
  auto reply = impl_->conn->endpoint().connect(encode_info(impl_->conn->local_info(token_hash(token))), impl_->opt.timeout);
  impl_->conn->set_peer(decode_info(reply, impl_->peer));
}

RdmaClient::~RdmaClient() = default;

std::uint64_t RdmaClient::send(OutMessage m) {
  const auto deadline = Clock::now() + impl_->opt.timeout;
  m.header.request_id = impl_->next_id++;
  impl_->conn->check_fits(kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count);
  std::uint16_t slot = impl_->conn->reserve_reply_slot(deadline);
  impl_->conn->send_message(m, slot, kNoSlot, deadline);
  return m.header.request_id;
}

Message RdmaClient::receive() {
  if (impl_->held) {
    impl_->conn->release(*impl_->held);
    impl_->held.reset();
  }
  auto f = impl_->conn->next(Clock::now() + impl_->opt.timeout);
  if (!f) impl_->conn->fail("receive timed out after " + std::to_string(impl_->opt.timeout.count()) + " ms");
  impl_->held = std::move(f);
  Message m = view(*impl_->held, impl_->opt.slot_bytes, impl_->peer);
  if (m.header.type == MessageType::kError) throw ProtocolError("PS " + impl_->peer + " refused the request: " + error_reply_text(m));
  return m;
}

const std::string& RdmaClient::peer() const { return impl_->peer; }

}  // namespace ember::transport
