// Large tables (scheduler state, caches' indexes, vocabularies) are read at random: on
// 4 KiB pages nearly every access also misses the TLB. Allocations of 4 MiB and more are
// aligned to 2 MiB and advised to use transparent huge pages (a hint: where THP is off,
// nothing changes).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace ember {

// Memory for `bytes`, huge-page advised when large. Free with huge_free(p, bytes).
void* huge_alloc(std::size_t bytes);
void huge_free(void* p, std::size_t bytes) noexcept;

// An owned huge_alloc array of n T (not initialized), freed with its size.
struct HugeFree {
  std::size_t bytes = 0;
  void operator()(void* p) const noexcept { huge_free(p, bytes); }
};
template <typename T>
using HugeArray = std::unique_ptr<T[], HugeFree>;
template <typename T>
HugeArray<T> huge_array(std::size_t n) {
  return HugeArray<T>(static_cast<T*>(huge_alloc(n * sizeof(T))), HugeFree{n * sizeof(T)});
}

// An allocator for std::vector of large, randomly accessed arrays.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(huge_alloc(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { huge_free(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace ember
