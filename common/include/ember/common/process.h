// Facts about the running process, for benchmarks and stats lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ember {

// Peak resident set size of this process so far, in bytes (VmHWM).
std::uint64_t peak_rss_bytes();
// Current resident set size, in bytes (VmRSS).
std::uint64_t current_rss_bytes();

// Names the calling thread (what top -H, perf and gdb show); cut to the 15 characters
// Linux keeps.
void name_this_thread(const std::string& name);

// The CPUs of a list such as "1", "0-3" or "0,2-3", in order, each once. A malformed
// list, or an empty one, is a ConfigError that names `flag` and the list.
std::vector<int> parse_cpu_list(const std::string& list, const std::string& flag);

// Keeps the calling thread, and the threads it starts from now on (they inherit the
// mask), on `cpus`. CPUs the process may not use (offline, outside its cpuset) are a
// ConfigError naming them.
void pin_this_thread(const std::vector<int>& cpus);

// CPUs the calling thread may run on (its affinity mask: taskset, a cgroup's cpuset),
// which std::thread::hardware_concurrency() does not see; that count where the mask
// cannot be read.
unsigned usable_cpus();

// Monotonic stopwatch.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  double millis() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ember
