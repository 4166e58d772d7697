#include "ember/scheduler/host_parts.h"

namespace ember::scheduler {

void HostParts::trained(const std::vector<const StepPlan*>& host_plans, const std::function<bool(Key)>& across) {
  U64Map<std::uint32_t> count;
  for (const StepPlan* p : host_plans) {
    for (const RowRef& r : p->rows) {
      // Applied by its one trainer, or within the host (peer sync): no part crosses.
      if ((r.trainers == 1 && !r.uncached) || r.host != HostApply::kNone || !across(r.key)) continue;
      ++*count.try_emplace(r.key, 0).first;
    }
  }
  // A row trained again has pushed every part of its last iteration (the training
  // needed their sum), so its count starts afresh.
  count.for_each([&](Key k, std::uint32_t n) { rows_[k] = Parts{n, n}; });
}

bool HostParts::take(Key key, std::uint32_t parts) {
  Parts* p = rows_.find(key);
  if (p == nullptr) return true;
  const bool whole = parts >= p->trainers;
  if (parts >= p->left) {
    rows_.erase(key);
  } else {
    p->left -= parts;
  }
  return whole;
}

}  // namespace ember::scheduler
