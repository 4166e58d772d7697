// FAE's offline profile: the rows a job accesses most, replicated on every worker.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/scheduler/scheduler_config.h"

namespace ember::scheduler {

// The `fraction` of all rows of the key space most frequently accessed in the global
// batches a job with options `o` schedules (o.iterations of them); replicated[k] = 1.
// Rows never accessed are never replicated. Every process computes the same set from the same data.
std::vector<std::uint8_t> profile_replicated_rows(const data::Dataset& ds, const SchedulerOptions& o, double fraction);

}  // namespace ember::scheduler
