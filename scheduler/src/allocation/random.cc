// Random allocation: a balanced random partition of the batch (vanilla, plan, het, fae).
#include <numeric>
#include <utility>

#include "../allocation.h"
#include "ember/common/hash.h"
#include "ember/data/zipf.h"

namespace ember::scheduler {

void allocate_random(const SchedulerConfig& c, std::uint64_t iteration, std::uint32_t n, std::vector<std::uint32_t>& worker_of) {
  // Balanced random partition from (seed, iteration): identical in every process.
  data::SplitMix64 rng(mix64(c.seed ^ mix64(iteration + 0x51ed)));
  std::vector<std::uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  for (std::uint32_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[rng.below(i)]);
  for (std::uint32_t j = 0; j < n; ++j) worker_of[perm[j]] = j / c.batch_per_worker;
}

}  // namespace ember::scheduler
