// One RDMA connection's protocol over its queue pair (rdma.h: frames, credits, slots,
// sending in place): what Conn does once connected. Listening, accepting, connecting
// and the handshake are in rdma.cc.
#include "rdma_connection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace ember::transport::rdma_detail {

namespace {

using std::chrono::milliseconds;

constexpr std::uint32_t kFrameMagic = 0x46424d45;  // "EMBF"
constexpr std::uint32_t kImmTag = 0xeb000000;      // immediate = tag | slot
constexpr std::uint32_t kFrameHeaderBytes = 16;

struct FrameHeader {
  std::uint32_t magic;
  std::uint16_t kind;
  std::uint16_t recv_credits;  // RECVs the sender re-posted since its last report
  std::uint32_t length;        // message bytes after this header
  std::uint16_t slot_credits;  // ring slots the sender freed since its last report
  std::uint16_t reply_slot;    // requests: the requester's slot reserved for the reply
};
static_assert(sizeof(FrameHeader) == kFrameHeaderBytes);

constexpr std::uint64_t kSendTag = 1ull << 63, kBulkTag = 1ull << 62;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

RdmaOptions checked(RdmaOptions o) {
  o.inline_bytes = static_cast<std::uint32_t>(round_up(std::max<std::uint32_t>(o.inline_bytes, 128)));
  o.slot_bytes = static_cast<std::uint32_t>(round_up(std::max<std::uint32_t>(o.slot_bytes, 4096)));
  if (o.recv_depth < 4 || o.recv_depth > 4096) throw ConfigError("RDMA receive depth must be in [4, 4096]");
  if (o.slots < 2 || o.slots > 1024) throw ConfigError("RDMA slots must be in [2, 1024]");
  return o;
}

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

Conn::Conn(std::unique_ptr<verbs::Endpoint> ep, const RdmaOptions& o, bool requester)
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

Conn::~Conn() {
  ep_.reset();  // disconnect before the registered memory goes away
  std::free(pool_);
}

ConnInfo Conn::local_info(const auth::Nonce& nonce) const {
  ConnInfo c;
  c.recv_depth = static_cast<std::uint16_t>(opt_.recv_depth);
  c.nonce = nonce;
  c.ring_addr = reinterpret_cast<std::uintptr_t>(pool_ + ring_off_);
  c.ring_rkey = mr_.rkey;
  c.slots = opt_.slots;
  c.slot_bytes = opt_.slot_bytes;
  c.recv_bytes = opt_.inline_bytes;
  return c;
}

void Conn::set_peer(const ConnInfo& p) {
  peer_ = p;
  send_credits_ = p.recv_depth;
  ring_credits_ = p.slots;
}

void Conn::check_fits(std::uint64_t bytes) const {
  const std::uint64_t frame = kFrameHeaderBytes + bytes;
  const std::uint64_t limit = std::min<std::uint64_t>(opt_.slot_bytes, peer_.slot_bytes);
  if (frame > limit) {
    throw ProtocolError("message of " + std::to_string(bytes) + " bytes exceeds the RDMA slot size (" + std::to_string(limit) +
                        " bytes; raise the slot size on both sides)");
  }
}

std::uint16_t Conn::reserve_reply_slot(Clock::time_point deadline) {
  wait_until([&] { return !free_slots_.empty(); }, deadline, "waiting for a free reply slot");
  std::uint16_t s = free_slots_.front();
  free_slots_.pop_front();
  reserved_.push_back(s);
  return s;
}

bool Conn::can_send_now(const OutMessage& reply) const {
  const std::uint64_t frame = kFrameHeaderBytes + kHeaderBytes + 8ull * reply.key_count + 4ull * reply.value_count;
  return has_credits(frame > std::min(opt_.inline_bytes, peer_.recv_bytes), false);
}

bool Conn::has_credits(bool bulk, bool to_ring) const {
  return send_credits_ >= 2 && (!to_ring || ring_credits_ > 0) && !(bulk ? free_bulk_ : free_small_).empty();
}

void Conn::send_message(const OutMessage& m, std::uint16_t reply_slot, std::uint16_t target_slot, Clock::time_point deadline) {
  const std::uint64_t bytes = kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count;
  check_fits(bytes);
  const std::uint32_t frame = static_cast<std::uint32_t>(kFrameHeaderBytes + bytes);
  const bool bulk = frame > std::min(opt_.inline_bytes, peer_.recv_bytes);
  const bool to_ring = bulk && target_slot == kNoSlot;  // a bulk request takes a slot of the peer's ring
  wait_until([&] { return has_credits(bulk, to_ring); }, deadline, "waiting for the peer's credits");
  std::uint32_t staging = take(bulk ? free_bulk_ : free_small_);
  std::uint8_t* buf =
      pool_ + (bulk ? bulk_off_ + std::size_t{staging} * opt_.slot_bytes : small_off_ + std::size_t{staging} * opt_.inline_bytes);
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

std::optional<Frame> Conn::next(Clock::time_point deadline) {
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

void Conn::release(Frame& f) {
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

void Conn::fail(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  throw IoError("RDMA peer " + peer_name_ + ": " + why);
}

void Conn::fail_if_broken() {
  if (broken_.empty()) return;
  // A peer that went away ends the connection: not an error of the peer's making.
  if (peer_closed_) throw PeerClosed("RDMA peer " + peer_name_ + ": " + broken_);
  throw IoError("RDMA peer " + peer_name_ + ": connection failed earlier (" + broken_ + ")");
}

bool Conn::gather_in_place(const OutMessage& m, verbs::SendRequest& w) {
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

std::optional<std::uint32_t> Conn::send_lkey(const void* p, std::size_t bytes) {
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

std::uint32_t Conn::take(std::deque<std::uint32_t>& q) {
  std::uint32_t v = q.front();
  q.pop_front();
  return v;
}

void Conn::post_recv(std::uint32_t i) {
  verbs::RecvRequest r;
  r.wr_id = i;
  r.sge = {pool_ + recv_off_ + std::size_t{i} * opt_.inline_bytes, opt_.inline_bytes, mr_.lkey};
  ep_->post_recv(r);
}

void Conn::write_frame_header(std::uint8_t* buf, FrameKind kind, std::uint32_t length, std::uint16_t reply_slot) {
  FrameHeader fh{kFrameMagic, kind, static_cast<std::uint16_t>(owed_recv_), length, static_cast<std::uint16_t>(owed_slots_), reply_slot};
  owed_recv_ = 0;
  owed_slots_ = 0;
  std::memcpy(buf, &fh, sizeof(fh));
}

void Conn::maybe_send_credits() {
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

void Conn::park_arrived() {
  for (Frame& f : arrived_) {
    if (f.recv_index < 0 && f.slot < 0) continue;
    f.owned.resize((f.length + 7) / 8);
    std::memcpy(f.owned.data(), f.msg, f.length);
    f.msg = reinterpret_cast<const std::uint8_t*>(f.owned.data());
    release(f);
  }
}

template <typename Ready>
void Conn::wait_until(Ready ready, Clock::time_point deadline, const char* what) {
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

void Conn::progress(std::chrono::milliseconds wait) {
  verbs::Completion cs[32];
  std::size_t n = ep_->poll(cs);
  if (n == 0 && wait.count() > 0) {
    ep_->wait(wait);
    n = ep_->poll(cs);
  }
  for (std::size_t i = 0; i < n; ++i) on_completion(cs[i]);
  maybe_send_credits();
}

void Conn::on_completion(const verbs::Completion& c) {
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
    if (f.slot >= 0 && f.slot != expected)
      fail("reply written into slot " + std::to_string(f.slot) + ", reserved " + std::to_string(expected));
    f.slot = expected;
  } else if (fh.reply_slot >= peer_.slots) {
    fail("request without a valid reply slot");
  }
  f.msg = data + kFrameHeaderBytes;
  f.length = fh.length;
  f.reply_slot = fh.reply_slot;
  arrived_.push_back(std::move(f));
}

}  // namespace ember::transport::rdma_detail
