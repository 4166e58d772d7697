#include "ember/common/process.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "ember/common/error.h"

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

std::vector<int> parse_cpu_list(const std::string& list, const std::string& flag) {
  auto refuse = [&](const std::string& why) { throw ConfigError(flag + " '" + list + "': " + why + " (a list such as 1, 0-3 or 0,2-3)"); };
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) refuse("'" + s + "' is not a CPU number");
    const int n = std::stoi(s);
    if (n >= CPU_SETSIZE) refuse("CPU " + s + " is beyond " + std::to_string(CPU_SETSIZE - 1));
    return n;
  };
  std::vector<int> cpus;
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');) {
    const auto dash = part.find('-');
    const int lo = number(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : number(part.substr(dash + 1));
    if (hi < lo) refuse("range " + part + " runs backwards");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  if (cpus.empty() || list.back() == ',') refuse("no CPU");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::thread::hardware_concurrency();
  return static_cast<unsigned>(CPU_COUNT(&set));
}

void pin_this_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) throw ConfigError("CPU " + std::to_string(c) + " is out of range");
    CPU_SET(c, &set);
  }
  // This thread only, whatever mask it has now: the kernel refuses CPUs that are offline
  // or outside the process's cpuset.
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0) {
    std::string list;
    for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
    throw ConfigError("cannot run on CPU(s) " + list + ": " + std::strerror(rc) + " (see nproc, taskset -p " + std::to_string(::getpid()) +
                      ")");
  }
}

}  // namespace ember
