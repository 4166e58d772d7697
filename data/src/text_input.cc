#include "ember/data/text_input.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "ember/common/error.h"

namespace ember::data {
namespace {

bool has_gzip_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(errno_message("open " + path.string()));
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

}  // namespace

TextInput::TextInput(const std::filesystem::path& path, std::size_t block_bytes) : path_(path), block_bytes_(block_bytes) {
  std::error_code ec;
  file_bytes_ = std::filesystem::file_size(path, ec);
  if (ec) throw IoError("open " + path.string() + ": " + ec.message());
  if (has_gzip_magic(path)) {
    gz_ = gzopen(path.c_str(), "rb");
    if (gz_ == nullptr) throw IoError(errno_message("open " + path.string()));
    gzbuffer(gz_, 1 << 20);
  } else {
    map_ = MappedFile(path, MappedFile::Access::kSequential);
  }
}

TextInput::~TextInput() {
  if (gz_ != nullptr) gzclose(gz_);
}

void TextInput::rewind() {
  pos_ = 0;
  block_begin_ = 0;
  if (gz_ != nullptr) {
    gzrewind(gz_);
    buf_.clear();
    carry_ = 0;
    gz_eof_ = false;
  }
}

bool TextInput::next(std::string_view& block) {
  if (gz_ == nullptr) {
    std::string_view all = map_.view();
    if (pos_ >= all.size()) return false;
    std::size_t end = std::min(all.size(), pos_ + block_bytes_);
    if (end < all.size()) {
      // Extend to the end of the line that straddles the limit.
      const void* nl = std::memchr(all.data() + end, '\n', all.size() - end);
      end = nl == nullptr ? all.size() : static_cast<std::size_t>(static_cast<const char*>(nl) - all.data()) + 1;
    }
    block_begin_ = pos_;
    block = all.substr(pos_, end - pos_);
    pos_ = end;
    return true;
  }
  // Gzip: keep the carried partial line, then fill up to block_bytes_ and cut at the
  // last newline. A line longer than a block grows the buffer until it ends.
  buf_.erase(0, buf_.size() - carry_);
  carry_ = 0;
  while (!gz_eof_) {
    std::size_t have = buf_.size();
    std::size_t want = std::max(block_bytes_, have + (1u << 20));
    buf_.resize(want);
    int n = gzread(gz_, buf_.data() + have, static_cast<unsigned>(want - have));
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz_, &errnum);
      throw IoError("read " + path_.string() + ": " + (msg ? msg : "gzip error"));
    }
    buf_.resize(have + static_cast<std::size_t>(n));
    if (n == 0) {
      gz_eof_ = true;
      break;
    }
    if (buf_.size() >= block_bytes_ && buf_.rfind('\n') != std::string::npos) break;
  }
  if (buf_.empty()) return false;
  std::size_t end = buf_.size();
  if (!gz_eof_) {
    std::size_t nl = buf_.rfind('\n');
    end = nl + 1;
    carry_ = buf_.size() - end;
  }
  block = std::string_view(buf_.data(), end);
  return true;
}

void TextInput::release_current() {
  if (gz_ != nullptr || map_.size() == 0) return;
  // Whole pages strictly inside the block; the page shared with the next block stays.
  const long page = ::sysconf(_SC_PAGESIZE);
  auto begin = reinterpret_cast<std::uintptr_t>(map_.data() + block_begin_);
  auto end = reinterpret_cast<std::uintptr_t>(map_.data() + pos_);
  begin = (begin + page - 1) / page * page;
  end = end / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::size_t TextInput::consumed_bytes() const {
  if (gz_ == nullptr) return pos_;
  return gz_eof_ ? file_bytes_ : static_cast<std::size_t>(std::max<z_off_t>(0, gzoffset(gz_)));
}

std::string read_first_line(const std::filesystem::path& path) {
  TextInput in(path, 1u << 20);
  std::string_view block;
  if (!in.next(block)) return {};
  std::size_t nl = block.find('\n');
  return std::string(block.substr(0, nl));
}

}  // namespace ember::data
