#include "ember/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
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
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(errno_message("create " + path.string()));
  // A store through the mapping into a page the file system has no room for is SIGBUS,
  // not an error: reserve every block now (ftruncate alone leaves a sparse file), so a
  // full disk is ENOSPC here. Where the file system cannot reserve, fall back to a
  // sparse file.
  int rc = size > 0 ? ::posix_fallocate(fd_, 0, static_cast<off_t>(size)) : 0;
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd_, static_cast<off_t>(size)) == 0 ? 0 : errno;
  if (rc != 0) {
    errno = rc;
    std::string what = errno_message("allocate " + path.string() + " (" + std::to_string(size) + " bytes)");
    ::close(fd_);
    ::unlink(path.c_str());
    throw IoError(what);
  }
  if (size > 0) {
    addr_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      std::string what = errno_message("mmap " + path.string());
      ::close(fd_);
      ::unlink(path.c_str());
      throw IoError(what);
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
  // Not closed: abandoned (an error is on its way), so nothing is synced.
  if (addr_ != nullptr) ::munmap(addr_, size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ember
