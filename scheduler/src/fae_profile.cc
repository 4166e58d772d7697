#include "ember/scheduler/fae_profile.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ember/scheduler/global_batch.h"

namespace ember::scheduler {

std::vector<std::uint8_t> profile_replicated_rows(const data::Dataset& ds, const SchedulerOptions& o, double fraction) {
  auto offsets = key_space(ds, o.table_rows);
  const std::uint64_t num_keys = offsets.back();
  offsets.pop_back();
  std::vector<std::uint32_t> count(num_keys, 0);
  data::BatchReader reader = global_batch_reader(ds, o);
  data::Batch b;
  GlobalBatch g;
  for (std::uint64_t it = 0; it < o.iterations && reader.next(b); ++it) {
    to_global_batch(b, offsets, g);
    for (Key k : g.keys) ++count[k];
  }
  const auto replicated_rows = static_cast<std::uint64_t>(std::floor(fraction * static_cast<double>(num_keys)));
  std::vector<std::uint64_t> order(num_keys);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  // Stable: among rows accessed equally often, the lower key is replicated first.
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) { return count[a] > count[b]; });
  std::vector<std::uint8_t> replicated(num_keys, 0);
  for (std::uint64_t i = 0; i < replicated_rows && count[order[i]] > 0; ++i) replicated[order[i]] = 1;
  return replicated;
}

}  // namespace ember::scheduler
