// The TCP server (tcp.h): an acceptor and a pool of I/O threads (Boost.Asio), each
// connection read ahead and answered in order on one of them.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/host.h"
#include "ember/common/log.h"
#include "ember/common/process.h"
#include "ember/transport/auth.h"
#include "ember/transport/tcp.h"
#include "tcp_socket.h"

namespace ember::transport {
namespace asio = boost::asio;
using asio::ip::tcp;
using tcp_detail::consume;
using tcp_detail::move_some;
using tcp_detail::PayloadBuffer;
using tcp_detail::tune;

namespace {

// Payload buffers lent to handlers, given back by whichever thread let go of them last
// (a PS applying a commit), for the connection's next requests.
class ReturnedBuffers {
 public:
  void give_back(PayloadBuffer b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (buffers_.size() < kKeep) buffers_.push_back(std::move(b));  // else freed
  }
  // One given back, if any (else an empty buffer).
  PayloadBuffer take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (buffers_.empty()) return {};
    PayloadBuffer b = std::move(buffers_.back());
    buffers_.pop_back();
    return b;
  }

 private:
  // As many as a connection reads ahead: more would only hold memory.
  static constexpr std::size_t kKeep = 64;
  std::mutex mu_;
  std::vector<PayloadBuffer> buffers_;
};

// Hands b's storage to a shared owner (b is left empty); once the owner's last copy goes,
// on whichever thread, the storage goes back to `home`.
std::shared_ptr<const void> lend(PayloadBuffer& b, const std::shared_ptr<ReturnedBuffers>& home) {
  const std::size_t capacity = std::exchange(b.capacity, 0);
  return std::shared_ptr<const void>(b.words.release(), [home, capacity](const void* p) {
    PayloadBuffer back;
    back.words.reset(static_cast<std::uint64_t*>(const_cast<void*>(p)));
    back.capacity = capacity;
    home->give_back(std::move(back));
  });
}

}  // namespace

struct TcpServer::Impl {
  TcpServerOptions opt;
  ServerHandler handler;
  std::atomic<std::uint32_t> open_sessions{0};  // before ios: sessions outlive them
  // One io_context per I/O thread, each connection on one of them: a request is read,
  // handled and answered on one thread, with no hand-offs between threads.
  std::vector<std::unique_ptr<asio::io_context>> ios;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::size_t next_io = 0;
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> dropped{0}, served{0};
  std::atomic<int> in_flight{0};
  std::atomic<bool> draining{false}, stopping{false}, warned_buffers{false};
  // Peers can trigger these at will: at most a line per 10 s each.
  LogLimiter refused_log, unauthenticated_log, accept_log;
  std::unique_ptr<asio::steady_timer> accept_timer, sweep_timer;
  std::chrono::milliseconds accept_backoff{0};
  struct Session;
  std::mutex sessions_mu;
  std::vector<std::weak_ptr<Session>> sessions;

  // A connection. Reading and answering are decoupled: requests are read into a queue
  // while a reply is still going out, so a client that sends its next requests before
  // reading a large reply is not left blocked in its send while the server is blocked
  // in its own (each end waiting for the other to read). Requests are answered one at a
  // time, in order: the handler is called for the next one only once the reply before
  // it is out (its segments may point into the scratch). The read-ahead stops at
  // max_payload_bytes or kMaxQueued queued requests (back-pressure through TCP) and
  // resumes as replies go out. Everything runs on the connection's one I/O thread.
  struct Session : std::enable_shared_from_this<Session> {
    Session(Impl* s, tcp::socket sock, std::string who) : server(s), socket(std::move(sock)), peer(std::move(who)) {
      ++server->open_sessions;
    }
    ~Session() { --server->open_sessions; }
    Impl* server;
    tcp::socket socket;
    std::string peer;
    // A request as read, waiting for (or getting) its answer.
    struct Request {
      MessageHeader header;
      PayloadBuffer payload;
      std::shared_ptr<const void> lent;  // the payload, once the handler asked to keep it
    };
    std::uint8_t in_header[kHeaderBytes];
    std::uint8_t out_header[kHeaderBytes];
    Request incoming;                  // being read
    std::deque<Request> queue;         // read, in order; the front is being answered while `writing`
    std::vector<PayloadBuffer> spare;  // buffers of answered requests, for the next ones
    std::shared_ptr<ReturnedBuffers> returned = std::make_shared<ReturnedBuffers>();  // lent ones, back
    std::uint64_t queued_bytes = 0;                                                   // payload bytes in `queue`
    Scratch scratch;
    std::vector<iovec> in_iov, out_iov;
    std::size_t in_first = 0, out_first = 0;
    std::vector<Key> error_storage;
    OutMessage reply;
    // The challenge: this connection's nonce, sent before anything is read.
    const auth::Nonce nonce = auth::random_nonce();
    Key proof_keys[kProofKeys];  // the hello reply's payload: the server's proof
    bool authenticated = false;
    bool reading = false;  // a read is under way (from a header's wait to its payload's end)
    bool writing = false;  // the queue's front is being answered
    bool closed = false;
    bool in_payload = false;  // a payload is being read (the stall timeout applies)
    const std::chrono::steady_clock::time_point opened = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point progress = opened;  // last payload bytes read
    int open_requests = 0;                                    // counted in server->in_flight: from a header to its reply's last byte

    // Requests read ahead of their answers, at most (empty ones cost memory too).
    static constexpr std::size_t kMaxQueued = 64;

    // Requests read or being read and not yet answered (drain waits for them).
    bool busy() const { return open_requests > 0; }

    void finish_requests() {
      server->in_flight -= open_requests;
      open_requests = 0;
    }

    void drop(const std::string& why) {
      if (closed) return;  // a second operation failing after the first closed the socket
      close();
      if (server->stopping.load()) return;
      ++server->dropped;
      const std::string line = "tcp server: dropping peer " + peer + ": " + why;
      if (authenticated)
        spdlog::warn("{}", line);
      else
        server->unauthenticated_log.warn(line);  // anyone can cause these
    }

    // Called about once a second (Impl::sweep): closes a connection that has not said
    // hello in time, or whose payload stopped arriving.
    void check_deadlines(std::chrono::steady_clock::time_point now) {
      if (closed) return;
      const auto& o = server->opt;
      if (!authenticated && now - opened > o.hello_timeout)
        return drop("no hello within " + std::to_string(o.hello_timeout.count()) + " ms");
      if (in_payload && now - progress > o.stall_timeout)
        drop(std::string(type_name(incoming.header.type)) + " payload stalled for " + std::to_string(o.stall_timeout.count()) + " ms");
    }

    void close() {
      closed = true;
      finish_requests();
      boost::system::error_code ec;
      socket.close(ec);
    }

    // Sends the challenge (a hello carrying this connection's nonce), then reads. Into
    // the empty send buffer of a new socket its 64 bytes go at once.
    void start() {
      std::uint8_t challenge[kHeaderBytes + 8 * kChallengeKeys];
      MessageHeader h;
      h.type = MessageType::kHello;
      h.key_count = kChallengeKeys;
      encode_header(h, challenge);
      std::memcpy(challenge + kHeaderBytes, nonce.data(), nonce.size());
      const ssize_t n = ::send(socket.native_handle(), challenge, sizeof challenge, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n != static_cast<ssize_t>(sizeof challenge))
        return drop(std::string("sending the challenge: ") + (n < 0 ? std::strerror(errno) : "short write"));
      read_header();
    }

    // Starts reading the next request unless one is being read, the read-ahead is full,
    // or the server is draining (then the connection closes once its replies are out).
    void read_header() {
      if (closed || reading) return;
      if (server->draining.load()) {
        if (!writing && queue.empty()) close();
        return;
      }
      if (queued_bytes >= server->opt.max_payload_bytes || queue.size() >= kMaxQueued) return;  // resumed as replies go out
      reading = true;
      auto self = shared_from_this();
      asio::async_read(socket, asio::buffer(in_header), [self](boost::system::error_code ec, std::size_t) {
        if (self->closed) return;
        self->reading = false;
        if (ec) {
          if (ec != asio::error::eof && ec != asio::error::operation_aborted) self->drop("read: " + ec.message());
          return;  // at EOF the replies still owed go out, then the session ends
        }
        self->on_header();
      });
    }

    void on_header() {
      reading = true;
      ++open_requests;
      ++server->in_flight;
      try {
        // Before the hello is checked, nothing but a hello's 48 bytes is read.
        incoming.header = decode_header(in_header, authenticated ? server->opt.max_payload_bytes : 8 * kClientHelloKeys);
      } catch (const ProtocolError& e) {
        drop(authenticated ? e.what() : std::string("refused before its hello: ") + e.what());
        return;
      }
      if (!authenticated && (incoming.header.type != MessageType::kHello || incoming.header.key_count != kClientHelloKeys ||
                             incoming.header.value_count != 0)) {
        drop("refused: the first message must be a hello proving this job's token");
        return;
      }
      in_payload = true;
      progress = std::chrono::steady_clock::now();
      if (incoming.payload.capacity == 0) {
        if (!spare.empty()) {
          incoming.payload = std::move(spare.back());
          spare.pop_back();
        } else {
          incoming.payload = returned->take();
        }
      }
      in_iov.assign(1, iovec{incoming.payload.prepare(incoming.header.payload_bytes()), incoming.header.payload_bytes()});
      in_first = 0;
      read_payload();
    }

    // The payload is read in as few recvmsg calls as the kernel allows (asio's async_read
    // would cut it into 64 KiB operations, each a trip through the event loop), waiting
    // for the socket only when no data is there.
    void read_payload() {
      const int fd = socket.native_handle();
      const char* type = type_name(incoming.header.type);
      while (true) {
        const ssize_t n = move_some(fd, false, in_iov, in_first);
        if (n > 0) {
          consume(in_iov, in_first, static_cast<std::size_t>(n));
          progress = std::chrono::steady_clock::now();
          continue;
        }
        if (in_first == in_iov.size()) {
          in_payload = false;
          return on_request();
        }
        if (n == 0) return drop("truncated " + std::string(type) + " payload: connection closed");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return drop("truncated " + std::string(type) + " payload: " + std::strerror(errno));
        auto self = shared_from_this();
        socket.async_wait(tcp::socket::wait_read, [self](boost::system::error_code ec) {
          if (self->closed) return;
          if (ec) return self->drop("truncated " + std::string(type_name(self->incoming.header.type)) + " payload: " + ec.message());
          self->read_payload();
        });
        return;
      }
    }

    // A request is in whole: queue it, answer what can be answered, read on.
    void on_request() {
      reading = false;
      queued_bytes += incoming.header.payload_bytes();
      queue.push_back(std::move(incoming));
      incoming = Request{};
      answer_next();
      read_header();
    }

    // Answers queued requests in order while each reply leaves without waiting; returns
    // when the queue is empty or a reply waits for the socket (write_reply resumes).
    void answer_next() {
      while (!closed && !writing && !queue.empty()) {
        if (!start_reply(queue.front())) return;  // dropped
        writing = true;
        write_reply();
        // The handler's own work for after its reply: run once the reply is with the
        // kernel or waits for the socket, never later (a reader on another thread may be
        // waiting for it).
        if (server->handler.after_reply) server->handler.after_reply();
      }
    }

    // Calls the handler for `req` and lays out its reply; false if the peer was dropped.
    bool start_reply(Request& req) {
      const MessageHeader& header = req.header;
      Message m = req.payload.view(header);
      m.lend_payload = [this, &req] {
        if (!req.lent) req.lent = lend(req.payload, returned);
        return req.lent;
      };
      reply = OutMessage{};
      if (!authenticated) {
        // keys: the client's nonce (2), then its proof of the token over both nonces (4).
        auth::Nonce client_nonce;
        auth::Digest claimed;
        std::memcpy(client_nonce.data(), m.keys, client_nonce.size());
        std::memcpy(claimed.data(), m.keys + 2, claimed.size());
        const std::string& token = server->opt.token;
        if (!auth::equal(claimed, auth::proof(token, auth::kTcpClient, nonce, client_nonce))) {
          drop("refused: wrong job token (its hello's proof does not match)");
          return false;
        }
        authenticated = true;
        // The server proves it knows the token too (the client refuses an impostor).
        const auth::Digest mine = auth::proof(token, auth::kTcpServer, nonce, client_nonce);
        std::memcpy(proof_keys, mine.data(), mine.size());
        reply.header.type = MessageType::kHelloReply;
        reply.keys = proof_keys;
        reply.key_count = kProofKeys;
      } else if (header.type == MessageType::kHello) {
        drop("a second hello on one connection");
        return false;
      } else {
        try {
          server->handler.handle(m, reply, scratch);
          ++server->served;
        } catch (const ProtocolError& e) {
          make_error_reply(e.what(), reply, error_storage);
        } catch (const std::exception& e) {
          drop(std::string("request failed: ") + e.what());
          return false;
        }
      }
      if (server->stopping.load()) {  // stopping (not draining): no more replies
        close();
        return false;
      }
      reply.header.request_id = header.request_id;
      reply.header.iteration = reply.header.iteration ? reply.header.iteration : header.iteration;
      reply.header.key_count = reply.key_count;
      reply.header.value_count = reply.value_count;
      encode_header(reply.header, out_header);
      out_iov.clear();
      auto add = [&](const void* p, std::size_t bytes) { out_iov.push_back({const_cast<void*>(p), bytes}); };
      add(out_header, kHeaderBytes);
      if (reply.key_count) add(reply.keys, 8ull * reply.key_count);
      if (reply.value_segments != nullptr) {
        // Values straight from where they live (the PS store): no copy into one buffer.
        for (std::uint32_t i = 0; i < reply.segment_count; ++i) add(reply.value_segments[i].data, 4ull * reply.value_segments[i].floats);
      } else if (reply.value_count) {
        add(reply.values, 4ull * reply.value_count);
      }
      out_first = 0;
      return true;
    }

    // The reply goes out in as few sendmsg calls as the socket takes (asio's async_write
    // would cut it into 64 KiB operations, each a trip through the event loop); only when
    // the kernel has no room does the session wait for the socket to become writable.
    void write_reply() {
      const int fd = socket.native_handle();
      while (out_first < out_iov.size()) {
        const ssize_t n = move_some(fd, true, out_iov, out_first);
        if (n > 0) {
          consume(out_iov, out_first, static_cast<std::size_t>(n));
          continue;
        }
        if (n == 0) break;  // nothing left (trailing empty pieces)
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return drop(std::string("write: ") + std::strerror(errno));
        auto self = shared_from_this();
        socket.async_wait(tcp::socket::wait_write, [self](boost::system::error_code ec) {
          if (self->closed) return;
          if (ec) return self->drop("write: " + ec.message());
          self->write_reply();
          if (!self->writing) {  // that reply is out: answer the next ones, read on
            self->answer_next();
            self->read_header();
          }
        });
        return;
      }
      // Out: the request's buffer goes back to the spares.
      writing = false;
      --open_requests;
      --server->in_flight;
      Request& done = queue.front();
      queued_bytes -= done.header.payload_bytes();
      if (spare.size() < 2 && done.payload.capacity > 0) spare.push_back(std::move(done.payload));  // (not if lent)
      queue.pop_front();
    }
  };

  void accept() {
    asio::io_context& target = *ios[next_io++ % ios.size()];
    acceptor->async_accept(target, [this](boost::system::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
        // At the descriptor limit accept fails at once for as long as the connection
        // waits in the backlog: back off (up to a second) instead of spinning.
        accept_backoff = std::min(std::chrono::milliseconds(1000), std::max(std::chrono::milliseconds(10), accept_backoff * 2));
        accept_log.warn("tcp server: accept: " + ec.message() + " (retrying in " + std::to_string(accept_backoff.count()) + " ms)");
        accept_timer->expires_after(accept_backoff);
        accept_timer->async_wait([this](boost::system::error_code wait_ec) {
          if (!wait_ec && acceptor->is_open()) accept();
        });
        return;
      }
      accept_backoff = std::chrono::milliseconds(0);
      boost::system::error_code peer_ec;
      const auto ep = s.remote_endpoint(peer_ec);
      std::string peer = peer_ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
      if (open_sessions.load() >= opt.max_connections) {
        refused_log.warn("tcp server: " + std::to_string(opt.max_connections) + " connections open (the limit): refused " + peer);
        boost::system::error_code close_ec;
        s.close(close_ec);
      } else {
        if (std::string capped = tune(s.native_handle(), opt.socket_buffer_bytes); !capped.empty() && !warned_buffers.exchange(true)) {
          spdlog::warn("tcp server: {}", capped);  // once: every connection gets the same
        }
        std::shared_ptr<Session> session;
        try {
          session = std::make_shared<Session>(this, std::move(s), std::move(peer));  // draws its nonce
        } catch (const std::exception& e) {
          accept_log.warn(std::string("tcp server: a new connection: ") + e.what());
          accept();
          return;
        }
        {
          std::lock_guard<std::mutex> lock(sessions_mu);
          std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
          sessions.push_back(session);
        }
        // The session's handlers run on the context its socket belongs to.
        asio::post(session->socket.get_executor(), [session] { session->start(); });
      }
      accept();
    });
  }

  // Every second: each session checks its deadlines on its own thread.
  void sweep() {
    sweep_timer->expires_after(
        std::chrono::milliseconds(std::clamp<std::int64_t>(std::min(opt.hello_timeout, opt.stall_timeout).count() / 4, 10, 1000)));
    sweep_timer->async_wait([this](boost::system::error_code ec) {
      if (ec || stopping.load()) return;
      const auto now = std::chrono::steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(sessions_mu);
        std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
        for (auto& w : sessions)
          if (auto session = w.lock()) asio::post(session->socket.get_executor(), [session, now] { session->check_deadlines(now); });
      }
      sweep();
    });
  }
};

TcpServer::TcpServer(TcpServerOptions options, ServerHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(impl_->opt.address, ec);
  if (ec) {
    // A host name (a hostfile's entry, `hostname`): its first IPv4 address.
    std::string why;
    const auto address = ipv4_address(impl_->opt.address, &why);
    if (!address) {
      throw ConfigError("listen address '" + impl_->opt.address + "': neither an address nor a host name that resolves (" + why + ")");
    }
    addr = asio::ip::make_address(*address);
  }
  tcp::endpoint ep(addr, impl_->opt.port);
  const int n = std::max(1, impl_->opt.io_threads);
  for (int i = 0; i < n; ++i) {
    impl_->ios.push_back(std::make_unique<asio::io_context>(1));
    impl_->guards.push_back(asio::make_work_guard(*impl_->ios.back()));
  }
  impl_->acceptor = std::make_unique<tcp::acceptor>(*impl_->ios[0]);
  impl_->acceptor->open(ep.protocol());
  impl_->acceptor->set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor->bind(ep, ec);
  if (ec) throw IoError("listen on " + impl_->opt.address + ":" + std::to_string(impl_->opt.port) + ": " + ec.message());
  impl_->acceptor->listen();
  impl_->accept_timer = std::make_unique<asio::steady_timer>(*impl_->ios[0]);
  impl_->sweep_timer = std::make_unique<asio::steady_timer>(*impl_->ios[0]);
  impl_->accept();
  impl_->sweep();
  for (int i = 0; i < n; ++i)
    impl_->threads.emplace_back([this, i] {
      name_this_thread("tcp-io-" + std::to_string(i));
      impl_->ios[static_cast<std::size_t>(i)]->run();
    });
}

void TcpServer::drain(std::chrono::milliseconds grace) {
  impl_->draining = true;
  std::promise<void> closed;
  asio::post(*impl_->ios[0], [&] {
    boost::system::error_code ec;
    impl_->acceptor->close(ec);
    closed.set_value();
  });
  closed.get_future().wait();
  // Idle connections close now; busy ones after their replies (read_header sees draining).
  {
    std::lock_guard<std::mutex> lock(impl_->sessions_mu);
    for (auto& w : impl_->sessions) {
      if (auto s = w.lock()) {
        asio::post(s->socket.get_executor(), [s] {
          if (!s->busy()) s->close();
        });
      }
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (impl_->in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TcpServer::~TcpServer() {
  impl_->stopping = true;
  asio::post(*impl_->ios[0], [this] {
    boost::system::error_code ec;
    impl_->acceptor->close(ec);
  });
  impl_->guards.clear();
  for (auto& io : impl_->ios) io->stop();
  for (auto& t : impl_->threads) t.join();
}

std::uint16_t TcpServer::port() const {
  boost::system::error_code ec;
  return impl_->acceptor->local_endpoint(ec).port();
}
std::uint64_t TcpServer::connections_dropped() const { return impl_->dropped.load(); }
std::uint64_t TcpServer::requests_served() const { return impl_->served.load(); }
std::uint32_t TcpServer::connections_open() const { return impl_->open_sessions.load(); }

}  // namespace ember::transport
