#include "ember/cache/location_map.h"

#include <algorithm>
#include <bit>
#include <string>

#include "ember/common/error.h"

namespace ember::cache {

LocationMap::LocationMap(std::uint64_t num_keys, std::uint32_t workers)
    : state_(num_keys, Entry{kNoOwner, 0, 0}), list_(num_keys, 0), pool_(2, 0) {
  if (workers == 0 || workers > kMaxWorkers) {
    throw ConfigError("workers must be in [1, " + std::to_string(kMaxWorkers) + "], not " + std::to_string(workers));
  }
}

bool LocationMap::is_partial(Key key, WorkerId w) const {
  const std::uint32_t at = list_[key];
  if (at == 0) return false;
  const std::uint16_t* p = &pool_[at];
  return std::find(p + 2, p + 2 + p[0], static_cast<std::uint16_t>(w)) != p + 2 + p[0];
}

std::uint32_t LocationMap::take_block(std::uint32_t cls) {
  if (cls < free_.size() && !free_[cls].empty()) {
    const std::uint32_t at = free_[cls].back();
    free_[cls].pop_back();
    return at;
  }
  const auto at = static_cast<std::uint32_t>(pool_.size());
  pool_.resize(pool_.size() + 2 + (std::size_t{1} << cls));
  pool_[at + 1] = static_cast<std::uint16_t>(cls);
  if (free_.size() <= cls) free_.resize(cls + 1);
  return at;
}

void LocationMap::set_partials(Key key, std::span<const std::uint16_t> listed, std::uint32_t total) {
  std::uint32_t at = list_[key];
  const std::uint32_t n = static_cast<std::uint32_t>(listed.size());
  if (at != 0 && (n == 0 || (std::uint32_t{1} << pool_[at + 1]) < n)) {
    give_block(at);
    at = 0;
  }
  if (n > 0) {
    if (at == 0) at = take_block(static_cast<std::uint32_t>(std::bit_width(n - 1)));
    pool_[at] = static_cast<std::uint16_t>(n);
    std::copy(listed.begin(), listed.end(), &pool_[at + 2]);
  }
  list_[key] = at;
  relaxed_store(state_[key].partials, static_cast<std::uint16_t>(total));
  store_flags(key, static_cast<std::uint8_t>(flags(key) & ~kFlushed));  // a new state
}

void LocationMap::remove_partial(Key key, WorkerId w, bool listed) {
  const std::uint16_t left = static_cast<std::uint16_t>(partials(key) - 1);
  relaxed_store(state_[key].partials, left);
  const std::uint32_t at = list_[key];
  if (!listed || at == 0) return;
  std::uint16_t* p = &pool_[at];
  std::uint16_t* end = p + 2 + p[0];
  std::uint16_t* it = std::find(p + 2, end, static_cast<std::uint16_t>(w));
  if (it == end) return;
  std::copy(it + 1, end, it);  // keeps the order
  if (--p[0] == 0) {
    give_block(at);
    list_[key] = 0;
  }
}

}  // namespace ember::cache
