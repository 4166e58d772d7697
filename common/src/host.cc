#include "ember/common/host.h"

#include <unistd.h>

namespace ember {

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string worker_host_key(std::uint32_t rank) { return "host/worker/" + std::to_string(rank); }
std::string shard_host_key(std::uint32_t shard) { return "host/shard/" + std::to_string(shard); }
std::string worker_machine_key(std::uint32_t rank) { return "machine/worker/" + std::to_string(rank); }
std::string shard_machine_key(std::uint32_t shard) { return "machine/shard/" + std::to_string(shard); }

}  // namespace ember
