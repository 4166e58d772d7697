#include "ember/common/process.h"

#include <pthread.h>

#include <cstdio>
#include <cstring>

namespace ember {
namespace {

// Reads a "Name:   1234 kB" line of /proc/self/status.
std::uint64_t status_kb(const char* name) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kb = 0;
  std::size_t len = std::strlen(name);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, name, len) == 0 && line[len] == ':') {
      unsigned long long v = 0;
      if (std::sscanf(line + len + 1, "%llu", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb;
}

}  // namespace

std::uint64_t peak_rss_bytes() { return status_kb("VmHWM") * 1024; }
std::uint64_t current_rss_bytes() { return status_kb("VmRSS") * 1024; }

void name_this_thread(const std::string& name) { pthread_setname_np(pthread_self(), name.substr(0, 15).c_str()); }

}  // namespace ember
