// Brute force (Herald's Appendix C): every assignment of W samples to W workers.
#include <algorithm>
#include <numeric>

#include "../allocation.h"

namespace ember::scheduler {

void allocate_brute(std::uint32_t workers, const std::function<std::uint64_t(const std::vector<std::uint32_t>&)>& cost,
                    std::vector<std::uint32_t>& worker_of) {
  std::vector<std::uint32_t> perm(workers), best;
  std::iota(perm.begin(), perm.end(), 0u);
  std::uint64_t best_cost = ~std::uint64_t{0};
  do {
    const std::uint64_t c = cost(perm);
    if (c < best_cost) {
      best_cost = c;
      best = perm;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));
  worker_of = best;
}

}  // namespace ember::scheduler
