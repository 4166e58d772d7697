// When a job checkpoints, and so when its workers flush: read by the PS shards, the
// workers and ember-sim (which replays a job's flushes), so the rule is stated once.
#pragma once

#include <cstdint>

namespace ember {

// The periodic checkpoints (ember-ps --checkpoint-every N; 0: none): the PS checkpoints
// at commit(I) for every I with (I + 1) % N == 0. commit(I) is the one after which the
// rows hold every update of iteration I - 1 (protocol.h), so that checkpoint holds the
// model before iteration I, and the workers flush after iteration I - 1. Checkpoints
// asked for on command (kCheckpointLead) come on top of these.
class CheckpointSchedule {
 public:
  explicit CheckpointSchedule(std::uint64_t every = 0) : every_(every) {}

  std::uint64_t every() const { return every_; }
  // Whether the PS checkpoints at commit(I).
  bool checkpoints_at_commit(std::uint64_t I) const { return every_ > 0 && (I + 1) % every_ == 0; }
  // Whether the workers flush the rows they hold after iteration t: commit(t + 1)
  // checkpoints.
  bool flush_after(std::uint64_t t) const { return checkpoints_at_commit(t + 1); }

 private:
  std::uint64_t every_ = 0;
};

}  // namespace ember
