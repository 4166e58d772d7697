#include "ember/transport/verbs_fake.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "ember/common/error.h"

namespace ember::transport::verbs {

namespace {
class FakeEndpoint;
class FakeListener;

struct Handshake {
  bool done = false;
  std::string rejected;  // non-empty: refused with this reason
  std::vector<std::uint8_t> reply;
};
}  // namespace

// One mutex for the whole fabric: the fake favours obvious correctness over speed.
struct FakeFabric::State {
  std::mutex mu;
  std::condition_variable cv;  // any change: completions, connection requests, handshakes
  std::map<std::uint16_t, FakeListener*> listeners;
  std::uint16_t next_port = 18515;
  struct Region {
    std::uint8_t* addr;
    std::size_t length;
    const void* owner;
    bool writable;  // false: registered for sends only
  };
  std::map<std::uint32_t, Region> regions;  // key (lkey == rkey) -> region
  std::uint32_t next_key = 1;
  std::uint32_t max_send_sges = kMaxSendSges;
  std::uint64_t registrations = 0, sends = 0, gathered = 0, bytes = 0;
  std::uint64_t fail_at = 0;  // sends number at which a post_send fails (0: never)

  bool covers(std::uint32_t key, const void* owner, const void* addr, std::size_t len, bool write) const {
    auto it = regions.find(key);
    if (it == regions.end() || it->second.owner != owner || (write && !it->second.writable)) return false;
    auto* p = static_cast<const std::uint8_t*>(addr);
    return p >= it->second.addr && p + len <= it->second.addr + it->second.length;
  }
};

namespace {

using State = FakeFabric::State;

class FakeEndpoint final : public Endpoint {
 public:
  FakeEndpoint(std::shared_ptr<State> s, std::string peer) : s_(std::move(s)), peer_(std::move(peer)) {}

  ~FakeEndpoint() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (remote_ != nullptr) {
      remote_->remote_ = nullptr;
      remote_->fail_locked("disconnected by the peer");
    }
    if (handshake_ && !handshake_->done) {
      handshake_->done = true;
      handshake_->rejected = "the server went away";
    }
    for (auto it = s_->regions.begin(); it != s_->regions.end();) {
      it = it->second.owner == this ? s_->regions.erase(it) : std::next(it);
    }
    s_->cv.notify_all();
  }

  MemoryRegion register_memory(void* addr, std::size_t bytes) override { return add_region(addr, bytes, true); }
  MemoryRegion register_for_sends(const void* addr, std::size_t bytes) override {
    return add_region(const_cast<void*>(addr), bytes, false);
  }
  std::uint32_t max_send_sges() const override { return s_->max_send_sges; }

  MemoryRegion add_region(void* addr, std::size_t bytes, bool writable) {
    std::lock_guard<std::mutex> lock(s_->mu);
    std::uint32_t key = s_->next_key++;
    s_->regions[key] = {static_cast<std::uint8_t*>(addr), bytes, this, writable};
    ++s_->registrations;
    return {static_cast<std::uint8_t*>(addr), bytes, key, key};
  }

  void post_recv(const RecvRequest& r) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (error_) {
      cq_.push_back({r.wr_id, Opcode::kRecv, false, true, "work request flushed (queue pair in error state)", 0, 0});
    } else if (!s_->covers(r.sge.lkey, this, r.sge.addr, r.sge.length, true)) {
      throw IoError("post_recv: buffer outside registered memory");
    } else {
      recvs_.push_back(r);
    }
    s_->cv.notify_all();
  }

  void post_send(const SendRequest& w) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->sends;
    auto done = [&](bool ok, const std::string& why, bool flushed = false) {
      cq_.push_back({w.wr_id, w.opcode, ok, flushed, why, 0, 0});
      if (!ok) fail_locked(why);
      s_->cv.notify_all();
    };
    if (error_ || remote_ == nullptr) return done(false, "work request flushed (queue pair in error state)", true);
    if (s_->fail_at != 0 && s_->sends == s_->fail_at) {
      s_->fail_at = 0;
      remote_->fail_locked("disconnected by the peer");
      return done(false, "transport retry counter exceeded (injected)");
    }
    if (w.sge_count == 0 || w.sge_count > s_->max_send_sges)
      return done(false, "local length error (gather list of " + std::to_string(w.sge_count) + ")");
    std::size_t length = 0;
    for (std::uint32_t i = 0; i < w.sge_count; ++i) {
      const Sge& g = w.sges[i];
      if (!s_->covers(g.lkey, this, g.addr, g.length, false)) return done(false, "local protection error");
      length += g.length;
    }
    s_->gathered += w.sge_count > 1;
    FakeEndpoint* r = remote_;
    if (r->recvs_.empty()) {
      r->fail_locked("disconnected by the peer");
      return done(false, "receiver not ready: RNR retry counter exceeded (no RECV posted)");
    }
    RecvRequest recv = r->recvs_.front();
    std::uint8_t* dst = nullptr;
    if (w.opcode == Opcode::kSend) {
      if (length > recv.sge.length) {
        r->recvs_.pop_front();
        r->cq_.push_back({recv.wr_id, Opcode::kRecv, false, false, "local length error", 0, 0});
        r->fail_locked("local length error");
        return done(false, "remote invalid request error");
      }
      dst = static_cast<std::uint8_t*>(const_cast<void*>(recv.sge.addr));
    } else if (w.opcode == Opcode::kWriteWithImm) {
      void* target = reinterpret_cast<void*>(static_cast<std::uintptr_t>(w.remote_addr));
      if (!s_->covers(w.rkey, r, target, length, true)) {
        r->fail_locked("remote access error");
        return done(false, "remote access error");
      }
      dst = static_cast<std::uint8_t*>(target);
    } else {
      return done(false, "unsupported opcode");
    }
    r->recvs_.pop_front();
    for (std::uint32_t i = 0, at = 0; i < w.sge_count; at += w.sges[i].length, ++i) {
      if (w.sges[i].length > 0) std::memcpy(dst + at, w.sges[i].addr, w.sges[i].length);
    }
    s_->bytes += length;
    r->cq_.push_back({recv.wr_id, w.opcode == Opcode::kSend ? Opcode::kRecv : Opcode::kRecvWithImm, true, false, "",
                      static_cast<std::uint32_t>(length), w.opcode == Opcode::kSend ? 0 : w.imm});
    done(true, "");
  }

  std::size_t poll(std::span<Completion> out) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    std::size_t n = 0;
    while (n < out.size() && !cq_.empty()) {
      out[n++] = std::move(cq_.front());
      cq_.pop_front();
    }
    return n;
  }

  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait_for(lock, timeout, [&] { return !cq_.empty(); });
  }

  std::vector<std::uint8_t> connect(std::span<const std::uint8_t> private_data, std::chrono::milliseconds timeout) override;

  void accept(std::span<const std::uint8_t> private_data) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!handshake_ || handshake_->done || pending_client_ == nullptr) throw IoError("accept: the client went away");
    remote_ = pending_client_;
    remote_->remote_ = this;
    pending_client_ = nullptr;
    handshake_->reply.assign(private_data.begin(), private_data.end());
    handshake_->done = true;
    s_->cv.notify_all();
  }

  void reject(const std::string& why) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (handshake_ && !handshake_->done) {
      handshake_->done = true;
      handshake_->rejected = why.substr(0, 56);
    }
    pending_client_ = nullptr;
    s_->cv.notify_all();
  }

  const std::string& peer() const override { return peer_; }

  // Error state: later work fails, posted RECVs flush.
  void fail_locked(const std::string& why) {
    if (error_) return;
    error_ = true;
    for (auto& r : recvs_) cq_.push_back({r.wr_id, Opcode::kRecv, false, true, "work request flushed (" + why + ")", 0, 0});
    recvs_.clear();
    s_->cv.notify_all();
  }

  std::shared_ptr<State> s_;
  std::string peer_;
  FakeEndpoint* remote_ = nullptr;
  bool error_ = false;
  std::deque<RecvRequest> recvs_;
  std::deque<Completion> cq_;
  std::uint16_t target_port_ = 0;
  // Server side during the handshake.
  std::shared_ptr<Handshake> handshake_;
  FakeEndpoint* pending_client_ = nullptr;
};

class FakeListener final : public Listener {
 public:
  FakeListener(std::shared_ptr<State> s, std::uint16_t port) : s_(std::move(s)), port_(port) {}
  ~FakeListener() override {
    std::vector<ConnectRequest> drop;  // destroyed last, after the lock is released
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->listeners.erase(port_);
    for (auto& r : queue_) {
      auto* ep = static_cast<FakeEndpoint*>(r.endpoint.get());
      ep->handshake_->done = true;
      ep->handshake_->rejected = "the server stopped listening";
      ep->pending_client_ = nullptr;
    }
    s_->cv.notify_all();
    drop.swap(queue_);
  }
  std::uint16_t port() const override { return port_; }
  std::optional<ConnectRequest> next(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait_for(lock, timeout, [&] { return !queue_.empty(); });
    if (queue_.empty()) return std::nullopt;
    ConnectRequest r = std::move(queue_.front());
    queue_.erase(queue_.begin());
    return r;
  }

  std::shared_ptr<State> s_;
  std::uint16_t port_;
  std::vector<ConnectRequest> queue_;
};

std::vector<std::uint8_t> FakeEndpoint::connect(std::span<const std::uint8_t> private_data, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(s_->mu);
  auto it = s_->listeners.find(target_port_);
  if (it == s_->listeners.end()) throw IoError("RDMA connect to " + peer_ + ": connection refused (no listener)");
  auto hs = std::make_shared<Handshake>();
  auto server = std::make_unique<FakeEndpoint>(s_, "fake-client");
  server->handshake_ = hs;
  server->pending_client_ = this;
  it->second->queue_.push_back({std::move(server), std::vector<std::uint8_t>(private_data.begin(), private_data.end())});
  s_->cv.notify_all();
  if (!s_->cv.wait_for(lock, timeout, [&] { return hs->done; })) {
    hs->done = true;
    hs->rejected = "timeout";
    throw IoError("RDMA connect to " + peer_ + ": timed out after " + std::to_string(timeout.count()) + " ms");
  }
  if (!hs->rejected.empty()) throw IoError("RDMA connect to " + peer_ + " refused: " + hs->rejected);
  return hs->reply;
}

}  // namespace

FakeFabric::FakeFabric(std::uint32_t max_send_sges) : state_(std::make_shared<State>()) {
  if (max_send_sges == 0 || max_send_sges > kMaxSendSges)
    throw ConfigError("fake fabric: 1 to " + std::to_string(kMaxSendSges) + " pieces per send");
  state_->max_send_sges = max_send_sges;
}
FakeFabric::~FakeFabric() = default;

std::unique_ptr<Listener> FakeFabric::listen(const std::string& address, std::uint16_t port) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (port == 0) {
    while (state_->listeners.count(state_->next_port)) ++state_->next_port;
    port = state_->next_port++;
  }
  if (state_->listeners.count(port)) throw IoError("RDMA listen on " + address + ":" + std::to_string(port) + ": address in use");
  auto l = std::make_unique<FakeListener>(state_, port);
  state_->listeners[port] = l.get();
  return l;
}

std::unique_ptr<Endpoint> FakeFabric::resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds) {
  auto ep = std::make_unique<FakeEndpoint>(state_, host + ":" + std::to_string(port));
  ep->target_port_ = port;
  return ep;
}

void FakeFabric::inject_send_error(std::uint64_t nth) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->fail_at = state_->sends + nth;
}
std::uint64_t FakeFabric::registrations() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->registrations;
}
std::uint64_t FakeFabric::sends_posted() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->sends;
}
std::uint64_t FakeFabric::gathered_sends() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->gathered;
}
std::uint64_t FakeFabric::bytes_moved() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes;
}

}  // namespace ember::transport::verbs
