#include "ember/cache/location_map.h"

#include "ember/common/error.h"

namespace ember::cache {

LocationMap::LocationMap(std::uint64_t num_keys, std::uint32_t workers) : state_(num_keys, Entry{kNoOwner, 0}), partial_(num_keys, 0) {
  if (workers == 0 || workers > kMaxWorkers) {
    throw ConfigError("workers must be in [1, " + std::to_string(kMaxWorkers) + "], not " + std::to_string(workers));
  }
}

}  // namespace ember::cache
