// Facts about the running process, for benchmarks and stats lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ember {

// Peak resident set size of this process so far, in bytes (VmHWM).
std::uint64_t peak_rss_bytes();
// Current resident set size, in bytes (VmRSS).
std::uint64_t current_rss_bytes();

// Names the calling thread (what top -H, perf and gdb show); cut to the 15 characters
// Linux keeps.
void name_this_thread(const std::string& name);

// Monotonic stopwatch.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double millis() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ember
