// Inside the TCP data plane (tcp.h): what its server (tcp_server.cc) and its client
// (tcp_client.cc) both do with a socket: tune it, move scatter-gather lists through it,
// and hold a message's payload.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ember/transport/channel.h"
#include "ember/transport/message.h"

namespace ember::transport::tcp_detail {

// No Nagle delay (requests are small and latency-bound). Buffer sizes are left to the
// kernel's autotuning unless `buffer_bytes` fixes them (which turns autotuning off).
// Best effort: a socket that refuses an option still works. Returns a warning when the
// kernel granted less than asked (it caps at net.core.wmem_max / rmem_max), else "".
inline std::string tune(int fd, std::uint32_t buffer_bytes) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (buffer_bytes == 0) return "";
  std::string capped;
  for (int option : {SO_SNDBUF, SO_RCVBUF}) {
    int want = static_cast<int>(std::min<std::uint32_t>(buffer_bytes, INT_MAX / 2)), got = 0;
    socklen_t len = sizeof got;
    ::setsockopt(fd, SOL_SOCKET, option, &want, sizeof want);
    // The kernel doubles what it grants (bookkeeping overhead): half is the usable size.
    if (::getsockopt(fd, SOL_SOCKET, option, &got, &len) == 0 && got / 2 < want) {
      capped += std::string(capped.empty() ? "" : ", ") + (option == SO_SNDBUF ? "send " : "receive ") + std::to_string(got / 2) +
                " bytes (net.core." + (option == SO_SNDBUF ? "wmem_max" : "rmem_max") + ")";
    }
  }
  return capped.empty() ? "" : "socket buffers of " + std::to_string(buffer_bytes) + " bytes asked, the kernel granted " + capped;
}

// Consumes `n` bytes from iov[first...] (a sendmsg/recvmsg moved them).
inline void consume(std::vector<iovec>& iov, std::size_t& first, std::size_t n) {
  while (n > 0) {
    const std::size_t take = std::min(n, iov[first].iov_len);
    iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
    iov[first].iov_len -= take;
    n -= take;
    if (iov[first].iov_len == 0) ++first;
  }
}

// One sendmsg/recvmsg over iov[first...] (at most IOV_MAX pieces, empty ones skipped);
// `wait`: block until all of it moved (or the socket's timeout), else never block.
inline ssize_t move_some(int fd, bool out, std::vector<iovec>& iov, std::size_t& first, bool wait = false) {
  while (first < iov.size() && iov[first].iov_len == 0) ++first;
  if (first == iov.size()) return 0;
  msghdr msg{};
  msg.msg_iov = iov.data() + first;
  msg.msg_iovlen = std::min<std::size_t>(iov.size() - first, IOV_MAX);
  if (out) return ::sendmsg(fd, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
  return ::recvmsg(fd, &msg, wait ? MSG_WAITALL : MSG_DONTWAIT);
}

// Payload storage aligned for uint64 keys, followed by the float values. It only grows
// (a push alternating with a commit must not re-zero 256 KiB each time) unless one huge
// message left it far larger than what follows.
struct PayloadBuffer {
  std::unique_ptr<std::uint64_t[]> words;
  std::size_t capacity = 0;
  void* prepare(std::uint64_t bytes) {
    const std::size_t n = (bytes + 7) / 8;
    constexpr std::size_t kKeepWords = std::size_t{8} << 20;  // 64 MiB
    if (n > capacity || (capacity > kKeepWords && n < capacity / 4)) {
      words = std::make_unique_for_overwrite<std::uint64_t[]>(std::max<std::size_t>(n, 1));
      capacity = std::max<std::size_t>(n, 1);
    }
    return words.get();
  }
  Message view(const MessageHeader& h) const {
    Message m;
    m.header = h;
    m.keys = words.get();
    m.values = reinterpret_cast<const float*>(reinterpret_cast<const char*>(words.get()) + 8ull * h.key_count);
    return m;
  }
};

}  // namespace ember::transport::tcp_detail
