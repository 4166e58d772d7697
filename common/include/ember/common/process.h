// Facts about the running process, for benchmarks and stats lines.
#pragma once

#include <chrono>
#include <cstdint>

namespace ember {

// Peak resident set size of this process so far, in bytes (VmHWM).
std::uint64_t peak_rss_bytes();
// Current resident set size, in bytes (VmRSS).
std::uint64_t current_rss_bytes();

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
