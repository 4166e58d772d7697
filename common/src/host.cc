#include "ember/common/host.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

namespace ember {

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::optional<std::string> ipv4_address(const std::string& name, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int e = ::getaddrinfo(name.c_str(), nullptr, &hints, &res); e != 0 || res == nullptr) {
    if (why != nullptr) *why = e != 0 ? ::gai_strerror(e) : "no IPv4 address";
    return std::nullopt;
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof text);
  ::freeaddrinfo(res);
  return std::string(text);
}

std::string worker_host_key(std::uint32_t rank) { return "host/worker/" + std::to_string(rank); }
std::string shard_host_key(std::uint32_t shard) { return "host/shard/" + std::to_string(shard); }
std::string worker_machine_key(std::uint32_t rank) { return "machine/worker/" + std::to_string(rank); }
std::string shard_machine_key(std::uint32_t shard) { return "machine/shard/" + std::to_string(shard); }

}  // namespace ember
