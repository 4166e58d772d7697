#include "ember/common/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>

namespace ember {
namespace {

constexpr std::size_t kHuge = std::size_t{2} << 20;
constexpr std::size_t kThreshold = std::size_t{4} << 20;

}  // namespace

void* huge_alloc(std::size_t bytes) {
  if (bytes < kThreshold) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p == nullptr) throw std::bad_alloc();
  ::madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void huge_free(void* p, std::size_t) noexcept { std::free(p); }

}  // namespace ember
