// Logging setup, done once by each binary's main, and a limiter for what peers can repeat.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace ember {

// Sets the process's log level ("trace".."off") and a compact pattern on stderr.
// Throws ConfigError for an unknown level.
void setup_logging(const std::string& level);

// At most one line per interval for an event a peer can trigger at will (a malformed
// message, a refused connection, accept failing at the descriptor limit): the first
// occurrence is logged, later ones within the interval are counted and reported with the
// next line ("... (and 4711 more since the last such line)"). Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10)) : interval_(interval) {}
  // Logs `line` as a warning unless one was logged within the interval.
  void warn(const std::string& line);
  // Occurrences so far, logged or not.
  std::uint64_t count() const;

 private:
  std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
  bool logged_ = false;
  std::uint64_t suppressed_ = 0, total_ = 0;
};

}  // namespace ember
