// An evaluation's rows that workers hold newer than the PS (a dirty owner's copy:
// StepPlan::eval_hands, Scheduler::flush), handed to worker 0 over a Gloo group of the
// workers instead of flushed to the PS and read back: they cross once, between workers,
// not twice over the PS's link, and their states stay as they are (still dirty, still to
// be pushed when the scheduler says so). Worker 0 reads every other row from the PS.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/scheduler/step_plan.h"
#include "ember/transport/control.h"
#include "ember/worker/row_cache.h"
#include "ember/worker/train_config.h"
#include "job/gloo_group.h"

namespace ember::worker {

// The values worker 0 took from their holders, by key (dim floats a row).
struct HeldRows {
  U64Map<std::uint32_t> index;  // key -> its row in `values`
  std::vector<float> values;
  std::uint32_t dim = 0;

  const float* find(Key k) const {
    const std::uint32_t* at = index.find(k);
    return at != nullptr ? values.data() + static_cast<std::size_t>(*at) * dim : nullptr;
  }
  std::size_t size() const { return index.size(); }
};

class RowHandover {
 public:
  // Every worker makes it, at set-up (a group of the workers, rendezvous over the control
  // plane); one worker needs no group.
  RowHandover(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control, std::uint32_t rank);
  // After an evaluation's flush. A worker other than 0 sends the values of `plan`'s
  // eval_hands, in order, and returns once they are sent (the next iteration may change
  // them). Worker 0 takes its own from `cache` and receives every other worker's, whose
  // keys it knows from their plans (`keys_of`, by rank: Step::eval_hands_of); IoError when
  // a peer is lost.
  HeldRows hand(const scheduler::StepPlan& plan, const std::vector<std::vector<Key>>& keys_of, RowCache& cache, std::uint32_t dim);

 private:
  std::uint32_t workers_, rank_;
  GlooGroup group_;  // null with one worker
};

}  // namespace ember::worker
