#include "ember/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "ember/common/error.h"

namespace ember {

MappedFile::MappedFile(const std::filesystem::path& path, Access access) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError(errno_message("open " + path.string()));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw IoError(errno_message("stat " + path.string()));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError("open " + path.string() + ": not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    addr_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      ::close(fd);
      throw IoError(errno_message("mmap " + path.string()));
    }
    ::madvise(addr_, size_, access == Access::kSequential ? MADV_SEQUENTIAL : MADV_RANDOM);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

MappedOutput::MappedOutput(const std::filesystem::path& path, std::size_t size) : path_(path), size_(size) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw IoError(errno_message("create " + path.string()));
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    ::close(fd_);
    throw IoError(errno_message("resize " + path.string()));
  }
  if (size > 0) {
    addr_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      ::close(fd_);
      throw IoError(errno_message("mmap " + path.string()));
    }
  }
}

void MappedOutput::close() {
  if (fd_ < 0) return;
  bool ok = true;
  std::string what;
  if (addr_ != nullptr) {
    if (::msync(addr_, size_, MS_SYNC) != 0) {
      ok = false;
      what = errno_message("msync " + path_.string());
    }
    ::munmap(addr_, size_);
    addr_ = nullptr;
  }
  if (ok && ::fsync(fd_) != 0) {
    ok = false;
    what = errno_message("fsync " + path_.string());
  }
  ::close(fd_);
  fd_ = -1;
  if (!ok) throw IoError(what);
}

MappedOutput::~MappedOutput() {
  try {
    close();
  } catch (...) {
  }
}

}  // namespace ember
