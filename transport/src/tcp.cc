#include "ember/transport/tcp.h"

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <cstring>
#include <thread>

#include "ember/common/error.h"
#include "ember/common/hash.h"

namespace ember::transport {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

// No Nagle delay (requests are small and latency-bound) and large buffers (replies are
// big). Best effort: a socket that refuses an option still works.
void tune(tcp::socket& s) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  s.set_option(asio::socket_base::send_buffer_size(4 << 20), ignored);
  s.set_option(asio::socket_base::receive_buffer_size(4 << 20), ignored);
}

// Payload storage aligned for uint64 keys, followed by the float values.
struct PayloadBuffer {
  std::vector<std::uint64_t> words;
  void* prepare(std::uint64_t bytes) {
    words.resize((bytes + 7) / 8);
    return words.data();
  }
  Message view(const MessageHeader& h) const {
    Message m;
    m.header = h;
    m.keys = words.data();
    m.values = reinterpret_cast<const float*>(reinterpret_cast<const char*>(words.data()) + 8ull * h.key_count);
    return m;
  }
};

}  // namespace

struct TcpServer::Impl {
  TcpServerOptions opt;
  RequestHandler handler;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
  std::atomic<std::uint64_t> dropped{0}, served{0};
  std::uint64_t token = 0;

  struct Session : std::enable_shared_from_this<Session> {
    Session(Impl* s, tcp::socket sock) : server(s), socket(std::move(sock)) {
      boost::system::error_code ec;
      auto ep = socket.remote_endpoint(ec);
      peer = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
    }
    Impl* server;
    tcp::socket socket;
    std::string peer;
    std::uint8_t in_header[kHeaderBytes];
    std::uint8_t out_header[kHeaderBytes];
    MessageHeader header;
    PayloadBuffer payload;
    std::vector<float> scratch;
    std::vector<Key> error_storage;
    OutMessage reply;
    bool authenticated = false;

    void drop(const std::string& why) {
      spdlog::warn("tcp server: dropping peer {}: {}", peer, why);
      ++server->dropped;
      boost::system::error_code ec;
      socket.close(ec);
    }

    void read_header() {
      auto self = shared_from_this();
      asio::async_read(socket, asio::buffer(in_header), [self](boost::system::error_code ec, std::size_t) {
        if (ec) {
          if (ec != asio::error::eof && ec != asio::error::operation_aborted) self->drop("read: " + ec.message());
          return;
        }
        self->on_header();
      });
    }

    void on_header() {
      try {
        header = decode_header(in_header, server->opt.max_payload_bytes);
      } catch (const ProtocolError& e) {
        drop(e.what());
        return;
      }
      auto self = shared_from_this();
      asio::async_read(socket, asio::buffer(payload.prepare(header.payload_bytes()), header.payload_bytes()),
                       [self](boost::system::error_code ec, std::size_t) {
                         if (ec) {
                           self->drop("truncated " + std::string(type_name(self->header.type)) + " payload: " + ec.message());
                           return;
                         }
                         self->on_message();
                       });
    }

    void on_message() {
      Message m = payload.view(header);
      reply = OutMessage{};
      if (!authenticated) {
        if (header.type != MessageType::kHello || header.key_count != 1 || m.keys[0] != server->token) {
          drop("refused: the first message must be a hello with this job's token");
          return;
        }
        authenticated = true;
        reply.header.type = MessageType::kHelloReply;
      } else if (header.type == MessageType::kHello) {
        drop("a second hello on one connection");
        return;
      } else {
        try {
          server->handler(m, reply, scratch);
          ++server->served;
        } catch (const ProtocolError& e) {
          make_error_reply(e.what(), reply, error_storage);
        } catch (const std::exception& e) {
          drop(std::string("request failed: ") + e.what());
          return;
        }
      }
      reply.header.request_id = header.request_id;
      reply.header.iteration = reply.header.iteration ? reply.header.iteration : header.iteration;
      reply.header.key_count = reply.key_count;
      reply.header.value_count = reply.value_count;
      encode_header(reply.header, out_header);
      std::array<asio::const_buffer, 3> bufs = {asio::buffer(out_header), asio::buffer(reply.keys, 8ull * reply.key_count),
                                                 asio::buffer(reply.values, 4ull * reply.value_count)};
      auto self = shared_from_this();
      asio::async_write(socket, bufs, [self](boost::system::error_code ec, std::size_t) {
        if (ec) {
          self->drop("write: " + ec.message());
          return;
        }
        self->read_header();
      });
    }
  };

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec != asio::error::operation_aborted) spdlog::warn("tcp server: accept: {}", ec.message());
        if (!acceptor.is_open()) return;
      } else {
        tune(s);
        std::make_shared<Session>(this, std::move(s))->read_header();
      }
      accept();
    });
  }
};

TcpServer::TcpServer(TcpServerOptions options, RequestHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
  impl_->token = token_hash(impl_->opt.token);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(impl_->opt.address, ec);
  if (ec) throw ConfigError("listen address '" + impl_->opt.address + "': " + ec.message());
  tcp::endpoint ep(addr, impl_->opt.port);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(ep, ec);
  if (ec) throw IoError("listen on " + impl_->opt.address + ":" + std::to_string(impl_->opt.port) + ": " + ec.message());
  impl_->acceptor.listen();
  impl_->accept();
  for (int i = 0; i < std::max(1, impl_->opt.io_threads); ++i) impl_->threads.emplace_back([this] { impl_->io.run(); });
}

TcpServer::~TcpServer() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
}

std::uint16_t TcpServer::port() const { return impl_->acceptor.local_endpoint().port(); }
std::uint64_t TcpServer::connections_dropped() const { return impl_->dropped.load(); }
std::uint64_t TcpServer::requests_served() const { return impl_->served.load(); }

struct TcpClient::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::string peer;
  std::chrono::milliseconds timeout{10000};
  std::uint64_t next_id = 1;
  std::uint8_t header[kHeaderBytes];
  PayloadBuffer payload;
  std::string broken;  // set once a call failed mid-message: the stream is out of step

  [[noreturn]] void fail(const std::string& what) {
    broken = what;
    throw IoError("PS " + peer + ": " + what);
  }

  // Runs one asynchronous operation to completion or until the timeout: no call blocks
  // forever (a dead or stuck PS shows up as an error naming it).
  template <typename Start>
  void run(Start start, const char* what) {
    if (!broken.empty()) throw IoError("PS " + peer + ": connection unusable after an earlier failure (" + broken + ")");
    bool done = false;
    boost::system::error_code result;
    start([&](boost::system::error_code ec, std::size_t) {
      result = ec;
      done = true;
    });
    io.restart();
    io.run_for(timeout);
    if (!done) {
      boost::system::error_code ignored;
      socket.cancel(ignored);
      io.restart();
      io.run();
      fail(std::string(what) + " timed out after " + std::to_string(timeout.count()) + " ms");
    }
    if (result) fail(std::string(what) + ": " + (result == asio::error::eof ? std::string("connection closed by the server") : result.message()));
  }
};

TcpClient::TcpClient(const std::string& host, std::uint16_t port, const std::string& token, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->peer = host + ":" + std::to_string(port);
  impl_->timeout = timeout;
  boost::system::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) throw IoError("PS " + impl_->peer + ": resolve: " + ec.message());
  impl_->run([&](auto handler) {
    asio::async_connect(impl_->socket, endpoints, [handler](boost::system::error_code e, const tcp::endpoint&) mutable { handler(e, 0); });
  }, "connect");
  tune(impl_->socket);
  Key h = token_hash(token);
  OutMessage hello;
  hello.header.type = MessageType::kHello;
  hello.keys = &h;
  hello.key_count = 1;
  Message r = call(hello);
  if (r.header.type != MessageType::kHelloReply) throw ProtocolError("PS " + impl_->peer + ": unexpected reply to hello");
}

TcpClient::~TcpClient() {
  boost::system::error_code ec;
  impl_->socket.close(ec);
}

std::uint64_t TcpClient::send(OutMessage m) {
  m.header.request_id = impl_->next_id++;
  m.header.key_count = m.key_count;
  m.header.value_count = m.value_count;
  std::uint8_t h[kHeaderBytes];
  encode_header(m.header, h);
  std::array<asio::const_buffer, 3> bufs = {asio::buffer(h), asio::buffer(m.keys, 8ull * m.key_count),
                                             asio::buffer(m.values, 4ull * m.value_count)};
  impl_->run([&](auto handler) { asio::async_write(impl_->socket, bufs, handler); }, "send");
  return m.header.request_id;
}

Message TcpClient::receive() {
  impl_->run([&](auto handler) { asio::async_read(impl_->socket, asio::buffer(impl_->header), handler); }, "receive");
  MessageHeader h = decode_header(impl_->header, std::uint64_t{1} << 34);
  void* dst = impl_->payload.prepare(h.payload_bytes());
  impl_->run([&](auto handler) { asio::async_read(impl_->socket, asio::buffer(dst, h.payload_bytes()), handler); }, "receive payload");
  Message m = impl_->payload.view(h);
  if (h.type == MessageType::kError) throw ProtocolError("PS " + impl_->peer + " refused the request: " + error_reply_text(m));
  return m;
}

const std::string& TcpClient::peer() const { return impl_->peer; }

}  // namespace ember::transport
