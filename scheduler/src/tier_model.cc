#include "tier_model.h"

#include <algorithm>

namespace ember::scheduler {

TierModel::TierModel(std::uint64_t budget_bytes, std::uint64_t row_bytes)
    : budget_(std::max<std::uint64_t>(budget_bytes / kPageBytes, 1)), row_bytes_(std::max<std::uint64_t>(row_bytes, 1)) {}

std::pair<std::uint64_t, std::uint64_t> TierModel::pages_of(std::uint64_t local) const {
  return {local * row_bytes_ / kPageBytes, (local * row_bytes_ + row_bytes_ - 1) / kPageBytes};
}

void TierModel::touch(std::uint64_t iteration, std::uint64_t local) {
  const auto [first, last] = pages_of(local);
  for (std::uint64_t p = first; p <= last; ++p) {
    ++touched_;
    if (use(p, iteration, 0)) ++critical_;
  }
}

void TierModel::hint(std::uint64_t now, std::uint64_t until, std::uint64_t local) {
  const auto [first, last] = pages_of(local);
  for (std::uint64_t p = first; p <= last; ++p) use(p, now, until + 1);
}

bool TierModel::use(std::uint64_t page, std::uint64_t iteration, std::uint64_t keep_before) {
  auto found = in_.find(page);
  if (found != in_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second.at);
    found->second.keep_before = std::max(found->second.keep_before, keep_before);
    return false;
  }
  ++reads_;
  lru_.push_front(page);
  in_.emplace(page, Page{lru_.begin(), keep_before});
  make_room(iteration);
  return true;
}

void TierModel::make_room(std::uint64_t iteration) {
  // The least recently used first; a page kept for a later iteration's hint moves to the
  // front instead (at most one pass: over budget when every page is kept).
  for (std::size_t looked = 0; in_.size() > budget_ && looked < in_.size(); ++looked) {
    const std::uint64_t page = lru_.back();
    Page& p = in_.at(page);
    if (p.keep_before > iteration) {
      lru_.splice(lru_.begin(), lru_, p.at);
      continue;
    }
    lru_.pop_back();
    in_.erase(page);
  }
}

}  // namespace ember::scheduler
