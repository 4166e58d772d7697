// Memory-mapped files: read-only input and pre-sized output.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string_view>

namespace ember {

// A whole file mapped read-only. Empty files map to an empty view.
class MappedFile {
 public:
  enum class Access { kSequential, kRandom };

  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path, Access access = Access::kSequential);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return static_cast<const char*>(addr_); }
  std::size_t size() const { return size_; }
  std::string_view view() const { return {data(), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void reset();
  std::filesystem::path path_;
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// A new file of a fixed size mapped read-write; written in place, then synced. Its blocks
// are reserved when it is created (posix_fallocate): a full disk is an IoError there,
// never a SIGBUS on a later store.
class MappedOutput {
 public:
  // Throws IoError naming `path` ("allocate PATH (N bytes): No space left on device"),
  // leaving no file behind.
  MappedOutput(const std::filesystem::path& path, std::size_t size);
  ~MappedOutput();
  MappedOutput(const MappedOutput&) = delete;
  MappedOutput& operator=(const MappedOutput&) = delete;

  char* data() { return static_cast<char*>(addr_); }
  std::size_t size() const { return size_; }
  // msync + fsync + unmap; throws IoError on failure. Destroyed without close(), the
  // mapping is dropped unsynced (the caller is failing and removes the file).
  void close();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace ember
