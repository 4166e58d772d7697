#include "ember/common/fs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <system_error>

#include "ember/common/error.h"

namespace ember {
namespace fs = std::filesystem;

namespace {

std::string unique_suffix() {
  std::random_device rd;
  return std::to_string(::getpid()) + "-" + std::to_string(rd() & 0xffffff);
}

}  // namespace

void write_all(int fd, std::string_view bytes, const fs::path& path) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw IoError(errno_message("write " + path.string()));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw IoError(errno_message("open directory " + dir.string()));
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  write_file_atomic(path, [bytes](const std::function<void(std::string_view)>& write) { write(bytes); });
}

void write_file_atomic(const fs::path& path, const std::function<void(const std::function<void(std::string_view)>&)>& produce) {
  fs::path tmp = path;
  tmp += ".tmp-" + unique_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IoError(errno_message("create " + tmp.string()));
  try {
    produce([&](std::string_view bytes) { write_all(fd, bytes, tmp); });
    if (::fsync(fd) != 0) throw IoError(errno_message("fsync " + tmp.string()));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw IoError(errno_message("rename " + tmp.string() + " -> " + path.string()));
  }
  fsync_dir(path.parent_path());
}

std::string read_secret_file(const fs::path& path, const std::string& flag) {
  // As ssh does with a private key: a secret others may read is no secret.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError(errno_message(flag + ": stat " + path.string()));
  if ((st.st_mode & 077) != 0)
    throw ConfigError(fmt::format("{} {} may be read by other users (mode {:04o}): chmod 600 {}", flag, path.string(), st.st_mode & 07777,
                                  path.string()));
  std::string text = read_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) throw ConfigError(flag + " " + path.string() + " is empty");
  return text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(errno_message("open " + path.string()));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(errno_message("read " + path.string()));
  return s;
}

std::string read_file_head(const fs::path& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(errno_message("open " + path.string()));
  std::string s(max_bytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(max_bytes));
  if (in.bad()) throw IoError(errno_message("read " + path.string()));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

StagingDir::StagingDir(fs::path target, bool overwrite) : target_(std::move(target)), overwrite_(overwrite) {
  if (target_.filename().empty()) target_ = target_.parent_path();
  std::error_code ec;
  if (fs::exists(target_, ec) && !overwrite_) {
    throw ConfigError("output " + target_.string() + " already exists (use --force to replace it)");
  }
  fs::path parent = target_.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    throw ConfigError("output directory's parent " + parent.string() + " does not exist");
  }
  tmp_ = target_;
  tmp_ += ".tmp-" + unique_suffix();
  if (!fs::create_directory(tmp_, ec) || ec) {
    throw IoError("create " + tmp_.string() + ": " + ec.message());
  }
}

StagingDir::~StagingDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void StagingDir::commit() {
  fsync_dir(tmp_);
  std::error_code ec;
  fs::path old;
  if (fs::exists(target_, ec)) {
    if (!overwrite_) throw ConfigError("output " + target_.string() + " already exists");
    old = target_;
    old += ".old-" + unique_suffix();
    fs::rename(target_, old, ec);
    if (ec) throw IoError("rename " + target_.string() + ": " + ec.message());
  }
  fs::rename(tmp_, target_, ec);
  if (ec) {
    if (!old.empty()) fs::rename(old, target_, ec);  // put the previous output back
    throw IoError("rename " + tmp_.string() + " -> " + target_.string() + ": " + ec.message());
  }
  committed_ = true;
  fsync_dir(target_.parent_path());
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace ember
