// The TCP client (tcp.h): blocking calls on a blocking socket.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "ember/common/error.h"
#include "ember/transport/auth.h"
#include "ember/transport/tcp.h"
#include "tcp_socket.h"

namespace ember::transport {
using tcp_detail::consume;
using tcp_detail::move_some;
using tcp_detail::PayloadBuffer;
using tcp_detail::tune;

// The client is one thread's blocking calls on a blocking socket whose send and receive
// timeouts are the client's: a message moves in one sendmsg, a reply's header and rows in
// one recvmsg each (MSG_WAITALL), the thread sleeping in the kernel until they are there,
// as plain sockets do (polling a non-blocking socket costs a failed call and a poll per
// reply).
struct TcpClient::Impl {
  int fd = -1;
  std::string peer;
  std::chrono::milliseconds timeout{10000};
  std::uint64_t next_id = 1;
  std::uint8_t header[kHeaderBytes];
  PayloadBuffer payload;
  std::string broken;  // set once a call failed mid-message: the stream is out of step
  std::vector<iovec> iov;
  std::vector<Segment> runs;
  // Bytes moved through the socket once the handshake is done (Client::bytes_sent).
  bool counting = false;
  std::uint64_t sent = 0, received = 0;

  ~Impl() {
    if (fd >= 0) ::close(fd);  // also when the constructor failed after connecting
  }

  [[noreturn]] void fail(const std::string& what) {
    broken = what;
    throw IoError("PS " + peer + ": " + what);
  }

  // Moves all bytes of `iov` (consumed as it goes), or fails by the deadline: no call
  // blocks forever (a dead or stuck PS shows up as an error naming it).
  void transfer(bool out, const char* what) {
    if (!broken.empty()) throw IoError("PS " + peer + ": connection unusable after an earlier failure (" + broken + ")");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t first = 0;
    while (true) {
      const ssize_t n = move_some(fd, out, iov, first, true);
      if (n > 0) {
        if (counting) (out ? sent : received) += static_cast<std::uint64_t>(n);
        consume(iov, first, static_cast<std::size_t>(n));
        if (first < iov.size() && std::chrono::steady_clock::now() >= deadline) {
          fail(std::string(what) + " timed out after " + std::to_string(timeout.count()) + " ms");  // trickling
        }
        continue;
      }
      if (first == iov.size()) return;  // all moved
      if (n == 0 && !out) fail(std::string(what) + ": connection closed by the server");
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // the socket's timeout
        fail(std::string(what) + " timed out after " + std::to_string(timeout.count()) + " ms");
      }
      fail(std::string(what) + ": " + std::strerror(errno));
    }
  }

  void add(const void* p, std::size_t bytes) {
    if (bytes) iov.push_back({const_cast<void*>(p), bytes});
  }

  MessageHeader read_header() {
    iov.clear();
    add(header, kHeaderBytes);
    transfer(false, "receive");
    return decode_header(header, std::uint64_t{1} << 34);
  }

  void read(void* p, std::size_t bytes, const char* what) {
    iov.clear();
    add(p, bytes);
    transfer(false, what);
  }
};

TcpClient::TcpClient(const std::string& host, std::uint16_t port, const std::string& token, std::chrono::milliseconds timeout,
                     std::uint32_t socket_buffer_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->peer = host + ":" + std::to_string(port);
  impl_->timeout = timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0 || res == nullptr) {
    throw IoError("PS " + impl_->peer + ": resolve: " + ::gai_strerror(e));
  }
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr && impl_->fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, static_cast<int>(timeout.count())) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) {
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      impl_->fd = fd;
    } else {
      why = errno == ETIMEDOUT ? "timed out after " + std::to_string(timeout.count()) + " ms" : std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (impl_->fd < 0) throw IoError("PS " + impl_->peer + ": connect: " + why);
  if (std::string capped = tune(impl_->fd, socket_buffer_bytes); !capped.empty()) spdlog::warn("PS {}: {}", impl_->peer, capped);
  // Blocking from now on, each call bounded by the timeout (connect above was not).
  const int flags = ::fcntl(impl_->fd, F_GETFL);
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  if (timeout.count() <= 0) tv.tv_usec = 1000;  // 0 would mean "no timeout"
  if (flags < 0 || ::fcntl(impl_->fd, F_SETFL, flags & ~O_NONBLOCK) != 0 ||
      ::setsockopt(impl_->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(impl_->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    throw IoError("PS " + impl_->peer + ": socket options: " + std::strerror(errno));
  }
  // The server's challenge: a hello carrying its nonce (nothing larger is read).
  impl_->iov.clear();
  impl_->add(impl_->header, kHeaderBytes);
  impl_->transfer(false, "receive the challenge");
  const MessageHeader ch = decode_header(impl_->header, 8 * kChallengeKeys);
  if (ch.type != MessageType::kHello || ch.key_count != kChallengeKeys || ch.value_count != 0)
    throw ProtocolError("PS " + impl_->peer + ": no challenge (got a " + type_name(ch.type) + ")");
  auth::Nonce server_nonce;
  impl_->read(server_nonce.data(), server_nonce.size(), "receive the challenge");
  // The answer: this side's nonce and the proof over both; the token stays here.
  const auth::Nonce client_nonce = auth::random_nonce();
  const auth::Digest mine = auth::proof(token, auth::kTcpClient, server_nonce, client_nonce);
  Key keys[kClientHelloKeys];
  std::memcpy(keys, client_nonce.data(), client_nonce.size());
  std::memcpy(keys + 2, mine.data(), mine.size());
  OutMessage hello;
  hello.header.type = MessageType::kHello;
  hello.keys = keys;
  hello.key_count = kClientHelloKeys;
  Message r = call(hello);
  if (r.header.type != MessageType::kHelloReply) throw ProtocolError("PS " + impl_->peer + ": unexpected reply to hello");
  auth::Digest theirs{};
  if (r.header.key_count == kProofKeys) std::memcpy(theirs.data(), r.keys, theirs.size());
  if (r.header.key_count != kProofKeys || !auth::equal(theirs, auth::proof(token, auth::kTcpServer, server_nonce, client_nonce)))
    throw ProtocolError("PS " + impl_->peer + ": the server does not prove it knows the job token");
  impl_->counting = true;
}

TcpClient::~TcpClient() = default;

std::uint64_t TcpClient::send(OutMessage m) {
  m.header.request_id = impl_->next_id++;
  m.header.key_count = m.key_count;
  m.header.value_count = m.value_count;
  std::uint8_t h[kHeaderBytes];
  encode_header(m.header, h);
  impl_->iov.clear();
  impl_->add(h, kHeaderBytes);
  impl_->add(m.keys, 8ull * m.key_count);
  if (m.value_segments != nullptr) {
    for (std::uint32_t i = 0; i < m.segment_count; ++i) impl_->add(m.value_segments[i].data, 4ull * m.value_segments[i].floats);
  } else {
    impl_->add(m.values, 4ull * m.value_count);
  }
  impl_->transfer(true, "send");
  return m.header.request_id;
}

Message TcpClient::receive() {
  MessageHeader h = impl_->read_header();
  void* dst = impl_->payload.prepare(h.payload_bytes());
  impl_->read(dst, h.payload_bytes(), "receive payload");
  Message m = impl_->payload.view(h);
  if (h.type == MessageType::kError) throw ProtocolError("PS " + impl_->peer + " refused the request: " + error_reply_text(m));
  return m;
}

Message TcpClient::receive_rows(std::span<float* const> rows, std::uint32_t row_floats) {
  MessageHeader h = impl_->read_header();
  const bool fits = h.type != MessageType::kError && h.value_count == rows.size() * static_cast<std::uint64_t>(row_floats);
  // Rows whose destinations follow each other form one run; read straight into the runs
  // when they are long (few pieces), else into the buffer and copy.
  auto& runs = impl_->runs;
  runs.clear();
  if (fits) {
    for (float* r : rows) append_run(runs, r, row_floats);
  }
  const bool scatter = fits && !rows.empty() && runs.size() * kMinRowsPerPiece <= rows.size();
  const std::uint64_t head = scatter ? 8ull * h.key_count : h.payload_bytes();
  void* dst = impl_->payload.prepare(head);
  impl_->read(dst, head, "receive payload");
  Message m = impl_->payload.view(h);
  if (h.type == MessageType::kError) throw ProtocolError("PS " + impl_->peer + " refused the request: " + error_reply_text(m));
  if (!fits) return m;
  if (scatter) {
    impl_->iov.clear();
    for (const Segment& r : runs) impl_->add(r.data, 4ull * r.floats);  // the caller's rows: writable
    impl_->transfer(false, "receive rows");
  } else {
    place_rows(m, rows, row_floats);
  }
  m.values = nullptr;
  return m;
}

const std::string& TcpClient::peer() const { return impl_->peer; }
std::uint64_t TcpClient::bytes_sent() const { return impl_->sent; }
std::uint64_t TcpClient::bytes_received() const { return impl_->received; }

}  // namespace ember::transport
