#include "ember/ps/row_lending.h"

#include <string>

#include "ember/common/error.h"
#include "ember/ps/row_arena.h"

namespace ember::ps {

void RowLending::flag(const RowArena& arena, std::span<const Key> keys, std::uint64_t iteration) {
  for (Key k : keys) {
    const std::uint64_t local = arena.local_of(k);
    if (lent_[local].exchange(1, std::memory_order_acq_rel) == 0) lent_rows_.emplace_back(local, iteration);
  }
}

void RowLending::end(std::uint64_t iteration) {
  if (!lending_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(lent_rows_, [&](const std::pair<std::uint64_t, std::uint64_t>& r) {
    if (r.second > iteration) return false;
    lent_[r.first].store(0, std::memory_order_release);
    return true;
  });
}

void RowLending::check_slow(const RowArena& arena, std::span<const Key> keys, const char* what) const {
  for (Key k : keys) {
    if (arena.holds(k) && lent_[arena.local_of(k)].load(std::memory_order_acquire) != 0) {
      throw ProtocolError(std::string(what) + ": key " + std::to_string(k) +
                          " was prefetched for an iteration not yet committed (the copy served would miss this update)");
    }
  }
}

}  // namespace ember::ps
