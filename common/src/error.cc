#include "ember/common/error.h"

#include <cerrno>
#include <cstring>

namespace ember {

int exit_code(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return 2;
  if (dynamic_cast<const DataError*>(&e)) return 3;
  if (dynamic_cast<const IoError*>(&e)) return 4;
  if (dynamic_cast<const ProtocolError*>(&e)) return 5;
  if (dynamic_cast<const JobFailed*>(&e)) return 6;
  return 1;
}

std::string errno_message(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace ember
