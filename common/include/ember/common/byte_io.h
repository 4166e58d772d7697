// Plain values appended to and read back from a byte string, in host byte order: the
// small binary records of spools, directories and checkpoints.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ember/common/error.h"

namespace ember {

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A length (uint64) and then the elements.
template <typename T>
void put_vector(std::string& out, const std::vector<T>& v) {
  put(out, static_cast<std::uint64_t>(v.size()));
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads what put() and put_vector() wrote; DataError "ORIGIN: truncated WHAT" when the
// bytes run short. The bytes and the origin must outlive the reader.
class ByteReader {
 public:
  ByteReader(const std::string& bytes, std::size_t at, const std::string& origin, const char* what)
      : b_(bytes), at_(at), origin_(origin), what_(what) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const auto n = get<std::uint64_t>();
    if (n > (b_.size() - at_) / sizeof(T)) fail();
    std::vector<T> v(n);
    std::memcpy(v.data(), b_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  void need(std::size_t n) const {
    if (b_.size() - at_ < n) fail();
  }
  [[noreturn]] void fail() const { throw DataError(origin_ + ": truncated " + what_); }
  const std::string& b_;
  std::size_t at_;
  const std::string& origin_;
  const char* what_;
};

}  // namespace ember
