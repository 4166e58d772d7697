#include "tier_model.h"

#include <algorithm>

namespace ember::scheduler {

TierModel::TierModel(std::uint64_t budget_bytes, std::uint64_t row_bytes)
    : budget_(std::max<std::uint64_t>(budget_bytes / std::max<std::uint64_t>(row_bytes, 1), 1)) {}

void TierModel::touch(std::uint64_t iteration, std::uint64_t local) {
  ++touched_;
  const bool first = used_.insert(local).second;  // its first use: initialized in memory, nothing read
  if (use(local, iteration, 0, !first)) ++critical_;
}

void TierModel::hint(std::uint64_t now, std::uint64_t until, std::uint64_t local) {
  if (used_.contains(local)) use(local, now, until + 1, true);  // the shard hints rows it has initialized only
}

bool TierModel::use(std::uint64_t local, std::uint64_t iteration, std::uint64_t keep_before, bool on_disk) {
  auto found = in_.find(local);
  if (found != in_.end()) {
    lru_.splice(lru_.begin(), lru_, found->second.at);
    found->second.keep_before = std::max(found->second.keep_before, keep_before);
    return false;
  }
  if (on_disk) ++reads_;
  lru_.push_front(local);
  in_.emplace(local, Row{lru_.begin(), keep_before});
  make_room(iteration);
  return on_disk;
}

void TierModel::make_room(std::uint64_t iteration) {
  // The least recently used first; a row kept for a later iteration's hint moves to the
  // front instead (at most one pass: over budget when every row is kept).
  for (std::size_t looked = 0; in_.size() > budget_ && looked < in_.size(); ++looked) {
    const std::uint64_t local = lru_.back();
    Row& r = in_.at(local);
    if (r.keep_before > iteration) {
      lru_.splice(lru_.begin(), lru_, r.at);
      continue;
    }
    lru_.pop_back();
    in_.erase(local);
  }
}

}  // namespace ember::scheduler
