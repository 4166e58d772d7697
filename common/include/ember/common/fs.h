// Durable file-system helpers: nothing already saved is lost or half-written.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace ember {

// Writes `bytes` to `path` through a temp file in the same directory, fsync, rename.
// Readers see either the old file or the whole new one.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// The same for a file too large to hold in memory: `produce` hands its bytes, in order,
// to the writer it is given.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(const std::function<void(std::string_view)>&)>& produce);

// Writes all of `bytes` to `fd` (retrying short writes and EINTR); IoError naming `path`.
void write_all(int fd, std::string_view bytes, const std::filesystem::path& path);

// Reads a whole (small) file. Throws IoError naming the path.
std::string read_file(const std::filesystem::path& path);
// Its first `max_bytes` bytes (fewer if it is shorter): a header.
std::string read_file_head(const std::filesystem::path& path, std::size_t max_bytes);

// A secret kept in a file (a job token): its content without trailing newlines. Throws
// IoError naming the path, ConfigError naming `flag` when it is empty or when users other
// than its owner may read it (any group or other permission bit: chmod 600).
std::string read_secret_file(const std::filesystem::path& path, const std::string& flag);

// fsyncs a directory so that a rename inside it survives a crash.
void fsync_dir(const std::filesystem::path& dir);

// A directory built under a temporary name beside `target` and renamed onto `target`
// by commit(). Destroyed uncommitted, it removes the temporary directory, so a failed
// run leaves nothing behind.
class StagingDir {
 public:
  // Fails with ConfigError if `target` exists and `overwrite` is false.
  StagingDir(std::filesystem::path target, bool overwrite);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return tmp_; }
  const std::filesystem::path& target() const { return target_; }

  // fsyncs the staged files' directory and renames it onto the target (replacing an
  // existing target only when overwrite was asked for).
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path tmp_;
  bool overwrite_;
  bool committed_ = false;
};

}  // namespace ember
