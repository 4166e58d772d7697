// Logging setup, done once by each binary's main.
#pragma once

#include <string>

namespace ember {

// Sets the process's log level ("trace".."off") and a compact pattern on stderr.
// Throws ConfigError for an unknown level.
void setup_logging(const std::string& level);

}  // namespace ember
