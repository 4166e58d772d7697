#include "ember/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

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
