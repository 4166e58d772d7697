#include "ember/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "ember/common/error.h"

namespace ember {

void setup_logging(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    throw ConfigError("--log-level: unknown level '" + level + "' (trace, debug, info, warn, error, off)");
  }
  auto logger = spdlog::stderr_color_mt("ember");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace ember

namespace ember {

void LogLimiter::warn(const std::string& line) {
  std::uint64_t skipped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++total_;
    const auto now = std::chrono::steady_clock::now();
    if (logged_ && now - last_ < interval_) {
      ++suppressed_;
      return;
    }
    logged_ = true;
    last_ = now;
    skipped = std::exchange(suppressed_, 0);
  }
  if (skipped == 0) {
    spdlog::warn("{}", line);
  } else {
    spdlog::warn("{} (and {} more since the last such line)", line, skipped);
  }
}

std::uint64_t LogLimiter::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace ember
