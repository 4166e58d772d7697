// The RDMA data plane's connections (rdma.h): send regions, the server (listening,
// the handshake, a thread per connection serving requests) and the client (connecting,
// requests and replies). Each connection's protocol over its queue pair is Conn
// (rdma_connection.h).
#include "ember/transport/rdma.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/log.h"
#include "ember/common/process.h"
#include "ember/transport/auth.h"
#include "rdma_connection.h"

namespace ember::transport {

using rdma_detail::checked;
using rdma_detail::Clock;
using rdma_detail::Conn;
using rdma_detail::ConnInfo;
using rdma_detail::Frame;
using rdma_detail::kNoSlot;
using rdma_detail::PeerClosed;
using rdma_detail::view;
using std::chrono::milliseconds;

namespace {

// The handshake: each side's ConnInfo travels as the connection's private data.
std::vector<std::uint8_t> encode_info(const ConnInfo& c) {
  std::vector<std::uint8_t> out(sizeof(ConnInfo));
  std::memcpy(out.data(), &c, sizeof(c));
  return out;
}

ConnInfo decode_info(const std::vector<std::uint8_t>& in, const std::string& peer) {
  using rdma_detail::kAlign;
  ConnInfo c;
  if (in.size() < sizeof(ConnInfo)) throw ProtocolError("RDMA peer " + peer + ": connect data of " + std::to_string(in.size()) + " bytes");
  std::memcpy(&c, in.data(), sizeof(c));
  if (c.magic != rdma_detail::kConnectMagic) throw ProtocolError("RDMA peer " + peer + ": not an Ember connection (bad magic)");
  if (c.version != rdma_detail::kConnectVersion)
    throw ProtocolError("RDMA peer " + peer + ": connect version " + std::to_string(c.version));
  if (c.recv_depth < 2 || c.slots == 0 || c.slots >= kNoSlot || c.slot_bytes < 4096 || c.recv_bytes < 128 || c.slot_bytes % kAlign != 0 ||
      c.recv_bytes % kAlign != 0) {
    throw ProtocolError("RDMA peer " + peer + ": unusable pool geometry in its connect data");
  }
  return c;
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
  std::shared_ptr<verbs::Fabric> fabric;  // held when the server keeps it alive: goes last
  RdmaServerOptions opt;
  ServerHandler handler;
  std::unique_ptr<verbs::Listener> listener;
  std::atomic<bool> stop{false}, draining{false};
  std::atomic<std::uint32_t> authenticating{0};  // accepted, hello not checked yet
  LogLimiter unauthenticated_log;                // anyone can cause these
  std::atomic<std::uint64_t> dropped{0}, served{0}, sent_in_place{0};
  std::atomic<std::uint32_t> open{0};  // sessions serving
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
      auth::Nonce nonce;
      try {
        ConnInfo info = decode_info(req->private_data, req->endpoint->peer());
        nonce = auth::random_nonce();
        conn = std::make_shared<Conn>(std::move(req->endpoint), opt.rdma, /*requester=*/false);
        conn->set_peer(info);
        conn->endpoint().accept(encode_info(conn->local_info(nonce)));
      } catch (const std::exception& e) {
        spdlog::warn("rdma server: refusing a connection: {}", e.what());
        ++dropped;
        if (req->endpoint) req->endpoint->reject(e.what());
        continue;
      }
      sessions.emplace_back();
      Session& s = sessions.back();
      ++open;
      ++authenticating;
      s.thread = std::thread([this, conn, nonce, &s] {
        name_this_thread("rdma-conn");
        const bool ok = authenticate(*conn, nonce);
        --authenticating;
        if (ok) serve(*conn);
        --open;
        s.done = true;
      });
      // Unauthenticated connections hold pools: at most so many at a time; further
      // connection requests wait in the listener meanwhile.
      while (authenticating.load() >= kRdmaMaxAuthenticating && !stop.load() && !draining.load())
        std::this_thread::sleep_for(milliseconds(5));
    }
  }

  // The connection's first message must be a hello proving the token over both nonces
  // (auth.h), sent (not written into the ring), within hello_timeout; nothing else is
  // read before. Answers it with this server's proof; false if the peer was dropped.
  bool authenticate(Conn& conn, const auth::Nonce& nonce) {
    const auto deadline = Clock::now() + opt.hello_timeout;
    try {
      std::optional<Frame> f;
      while (!f) {
        if (stop.load() || draining.load()) return false;
        if (Clock::now() >= deadline) {
          ++dropped;
          unauthenticated_log.warn("rdma server: dropping peer " + conn.peer() + ": no hello within " +
                                   std::to_string(opt.hello_timeout.count()) + " ms");
          return false;
        }
        f = conn.next(std::min(deadline, Clock::now() + milliseconds(50)));
      }
      if (f->slot >= 0) throw ProtocolError("refused before its hello: a write into the ring");
      Message m = view(*f, 8ull * kProofKeys, conn.peer());
      if (m.header.type != MessageType::kHello || m.header.key_count != kProofKeys || m.header.value_count != 0)
        throw ProtocolError("refused: the first message must be a hello proving this job's token");
      auth::Digest claimed;
      std::memcpy(claimed.data(), m.keys, claimed.size());
      const auth::Nonce& client_nonce = conn.peer_info().nonce;
      OutMessage reply;
      std::vector<Key> error_storage;
      Key proof_keys[kProofKeys];
      const bool ok = auth::equal(claimed, auth::proof(opt.token, auth::kRdmaClient, nonce, client_nonce));
      if (!ok) {
        spdlog::warn("rdma server: refusing {}: wrong job token", conn.peer());
        ++dropped;
        make_error_reply("wrong job token", reply, error_storage);
      } else {
        const auth::Digest mine = auth::proof(opt.token, auth::kRdmaServer, nonce, client_nonce);
        std::memcpy(proof_keys, mine.data(), mine.size());
        reply.header.type = MessageType::kHelloReply;
        reply.keys = proof_keys;
        reply.key_count = kProofKeys;
      }
      reply.header.request_id = m.header.request_id;
      conn.send_message(reply, kNoSlot, f->reply_slot, Clock::now() + opt.rdma.timeout);
      conn.release(*f);
      return ok;
    } catch (const PeerClosed& e) {
      spdlog::debug("rdma server: {}", e.what());
    } catch (const std::exception& e) {
      if (!stop.load()) {
        ++dropped;
        unauthenticated_log.warn("rdma server: dropping peer " + conn.peer() + ": " + e.what());
      }
    }
    return false;
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
          handler.handle(m, reply, scratch);
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
        // The handler's own work for after its reply runs once the reply is posted;
        // first if the send might wait for credits (a reader on another thread may be
        // waiting for that work).
        const std::function<void()>& after = handler.after_reply;
        const bool after_first = after && !conn.can_send_now(reply);
        if (after_first) after();
        conn.send_message(reply, kNoSlot, f->reply_slot, deadline);
        sent_in_place += conn.take_in_place_bytes();
        if (after && !after_first) after();
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

RdmaServer::RdmaServer(verbs::Fabric& fabric, RdmaServerOptions options, ServerHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->opt.rdma = checked(impl_->opt.rdma);
  impl_->handler = std::move(handler);
  impl_->listener = fabric.listen(impl_->opt.address, impl_->opt.port);
  impl_->acceptor = std::thread([this] {
    name_this_thread("rdma-accept");
    impl_->accept_loop();
  });
}

RdmaServer::RdmaServer(std::shared_ptr<verbs::Fabric> fabric, RdmaServerOptions options, ServerHandler handler)
    : RdmaServer(*fabric, std::move(options), std::move(handler)) {
  impl_->fabric = std::move(fabric);
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
std::uint32_t RdmaServer::connections_open() const { return impl_->open.load(); }
std::uint64_t RdmaServer::requests_served() const { return impl_->served.load(); }
std::uint64_t RdmaServer::bytes_sent_in_place() const { return impl_->sent_in_place.load(); }

// ---------------------------------------------------------------------------- client

struct RdmaClient::Impl {
  std::shared_ptr<verbs::Fabric> fabric;  // held when the client keeps it alive: goes last
  std::unique_ptr<Conn> conn;
  RdmaOptions opt;
  std::string peer;
  std::uint64_t next_id = 1;
  std::optional<Frame> held;  // the frame behind the last receive()'s view
  // Message bytes posted and delivered once the hello is done (Client::bytes_sent).
  bool counting = false;
  std::uint64_t sent = 0, received = 0;
};

RdmaClient::RdmaClient(verbs::Fabric& fabric, const std::string& host, std::uint16_t port, const std::string& token, RdmaOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->opt = checked(options);
  impl_->peer = host + ":" + std::to_string(port);
  auto ep = fabric.resolve(host, port, impl_->opt.timeout);
  impl_->conn = std::make_unique<Conn>(std::move(ep), impl_->opt, /*requester=*/true);
  const auth::Nonce client_nonce = auth::random_nonce();
  auto reply = impl_->conn->endpoint().connect(encode_info(impl_->conn->local_info(client_nonce)), impl_->opt.timeout);
  impl_->conn->set_peer(decode_info(reply, impl_->peer));
  // The hello: this side's proof over both nonces; the reply carries the server's.
  const auth::Nonce& server_nonce = impl_->conn->peer_info().nonce;
  const auth::Digest mine = auth::proof(token, auth::kRdmaClient, server_nonce, client_nonce);
  Key keys[kProofKeys];
  std::memcpy(keys, mine.data(), mine.size());
  OutMessage hello;
  hello.header.type = MessageType::kHello;
  hello.keys = keys;
  hello.key_count = kProofKeys;
  Message r = call(hello);  // a refusal (kError "wrong job token") throws ProtocolError
  auth::Digest theirs{};
  if (r.header.type == MessageType::kHelloReply && r.header.key_count == kProofKeys) std::memcpy(theirs.data(), r.keys, theirs.size());
  if (r.header.type != MessageType::kHelloReply || r.header.key_count != kProofKeys ||
      !auth::equal(theirs, auth::proof(token, auth::kRdmaServer, server_nonce, client_nonce)))
    throw ProtocolError("PS " + impl_->peer + ": the server does not prove it knows the job token");
  impl_->counting = true;
}

RdmaClient::RdmaClient(std::shared_ptr<verbs::Fabric> fabric, const std::string& host, std::uint16_t port, const std::string& token,
                       RdmaOptions options)
    : RdmaClient(*fabric, host, port, token, std::move(options)) {
  impl_->fabric = std::move(fabric);
}

RdmaClient::~RdmaClient() = default;

std::uint64_t RdmaClient::send(OutMessage m) {
  const auto deadline = Clock::now() + impl_->opt.timeout;
  m.header.request_id = impl_->next_id++;
  impl_->conn->check_fits(kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count);
  std::uint16_t slot = impl_->conn->reserve_reply_slot(deadline);
  impl_->conn->send_message(m, slot, kNoSlot, deadline);
  if (impl_->counting) impl_->sent += kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count;
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
  if (impl_->counting) impl_->received += kHeaderBytes + m.header.payload_bytes();
  if (m.header.type == MessageType::kError) throw ProtocolError("PS " + impl_->peer + " refused the request: " + error_reply_text(m));
  return m;
}

const std::string& RdmaClient::peer() const { return impl_->peer; }
std::uint64_t RdmaClient::bytes_sent() const { return impl_->sent; }
std::uint64_t RdmaClient::bytes_received() const { return impl_->received; }

}  // namespace ember::transport
