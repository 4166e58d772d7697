// One stopwatch for an iteration's phases (PhaseTimes): each lap adds the time since the
// last one to a phase, so the phases add up to the wall time. On a GPU a lap first waits
// for the queued kernels, so that they count in the phase that queued them.
#pragma once

#include <torch/torch.h>

#include "ember/common/process.h"
#include "ember/worker/summary.h"

namespace ember::worker {

class PhaseClock {
 public:
  PhaseClock(PhaseTimes& times, torch::Device device) : times_(times), sync_(device.is_cuda()) {}

  void lap(PhaseTimes::Field phase) {
    if (sync_) torch::cuda::synchronize();
    times_.*phase += clock_.seconds();
    clock_.reset();
  }

 private:
  PhaseTimes& times_;
  bool sync_;
  Stopwatch clock_;
};

}  // namespace ember::worker
