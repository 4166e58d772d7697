// Reads a text input file (plain or gzip) as a sequence of blocks of whole lines.
// Block boundaries depend only on the file's content, so two passes over the same file
// see the same blocks: the second pass can rely on per-block counts from the first.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "ember/common/mapped_file.h"

namespace ember::data {

class TextInput {
 public:
  static constexpr std::size_t kDefaultBlockBytes = 16u << 20;

  explicit TextInput(const std::filesystem::path& path, std::size_t block_bytes = kDefaultBlockBytes);
  ~TextInput();
  TextInput(const TextInput&) = delete;
  TextInput& operator=(const TextInput&) = delete;

  // Next block of whole lines (the last may lack its newline); false at end of file.
  // The view stays valid until the next call.
  bool next(std::string_view& block);
  // Back to the start of the file.
  void rewind();
  // Tells the OS that the current block's bytes will not be read again (keeps RSS low).
  void release_current();

  bool gzip() const { return gz_ != nullptr; }
  // Bytes of the file (compressed for gzip) consumed so far, for progress reports.
  std::size_t consumed_bytes() const;
  // Bytes of the file itself (compressed size for gzip).
  std::size_t file_bytes() const { return file_bytes_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::size_t block_bytes_;
  std::size_t file_bytes_ = 0;
  // Plain files: mapped, blocks are views into the mapping.
  MappedFile map_;
  std::size_t pos_ = 0;
  std::size_t block_begin_ = 0;
  // Gzip files: decompressed into buf_, carrying the partial last line over.
  gzFile gz_ = nullptr;
  std::string buf_;
  std::size_t carry_ = 0;  // bytes at the end of buf_ that belong to the next block
  bool gz_eof_ = false;
};

// Reads the first line of a file (plain or gzip), without its newline.
std::string read_first_line(const std::filesystem::path& path);

}  // namespace ember::data
