// Typed errors thrown at module boundaries. `main` turns them into one line on stderr
// and a non-zero exit code (see exit_code()).
#pragma once

#include <stdexcept>
#include <string>

namespace ember {

// Base of every error Ember throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The operating system refused something (open, read, write, rename, mmap...).
class IoError : public Error {
 public:
  using Error::Error;
};

// Input data is malformed: a text line, a binary shard, a manifest. The message names
// the file and, where there is one, the line.
class DataError : public Error {
 public:
  using Error::Error;
};

// A peer sent something that breaks the wire protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// A flag, config file or combination of settings is invalid.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// The job failed elsewhere: the control plane named another member and its cause.
class JobFailed : public Error {
 public:
  using Error::Error;
};

// Process exit codes by error type, so scripts can tell usage errors from bad data.
int exit_code(const std::exception& e);

// "open /x: No such file or directory" from the current errno.
std::string errno_message(const std::string& what);

}  // namespace ember
