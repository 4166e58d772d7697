// Marks per key that the scheduler keeps from one iteration to the next, each a value
// type (copied with the scheduler): a bit per key, the rows pushed since the last pulls
// (prefetch), the replicated rows trained since the last flush.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/common/types.h"
#include "ember/scheduler/step_plan.h"

namespace ember::scheduler {

// A bit per key (empty: none kept).
class KeyBits {
 public:
  KeyBits() = default;
  explicit KeyBits(std::uint64_t num_keys) : bits_((num_keys + 7) / 8, 0) {}

  bool test(Key k) const { return (bits_[k >> 3] >> (k & 7) & 1) != 0; }
  // Sets k's bit; returns whether it was clear.
  bool set(Key k) {
    std::uint8_t& b = bits_[k >> 3];
    const auto m = static_cast<std::uint8_t>(1u << (k & 7));
    const bool was_clear = (b & m) == 0;
    b |= m;
    return was_clear;
  }
  void reset(Key k) { bits_[k >> 3] &= static_cast<std::uint8_t>(~(1u << (k & 7))); }
  // Clears the byte holding k's bit (and its 7 neighbours').
  void clear_byte(Key k) { bits_[k >> 3] = 0; }
  std::size_t memory_bytes() const { return bits_.capacity(); }

 private:
  std::vector<std::uint8_t> bits_;
};

// Prefetch: the rows pushed to the PS since the last iteration's pulls (its evictions and
// end pushes, a flush's pushes, the next sync pushes), a bit per key and their list (to
// clear the bits). A pull of a row not marked may be made one iteration early.
class PushMarks {
 public:
  PushMarks() = default;
  explicit PushMarks(std::uint64_t num_keys) : bits_(num_keys) {}

  void note(Key k) {
    if (bits_.set(k)) keys_.push_back(k);
  }
  bool pushed(Key k) const { return bits_.test(k); }
  // After an iteration's pulls: what changes the PS's rows before the next iteration's
  // pulls starts here, with the pulls' pushing evictions.
  void restart(const std::vector<StepPlan>& plans) {
    for (Key k : keys_) bits_.clear_byte(k);
    keys_.clear();
    for (const StepPlan& plan : plans) {
      for (const PullEntry& p : plan.pulls) {
        if (p.kind == EvictKind::kDirty || p.kind == EvictKind::kPartial) note(p.evicted);
      }
    }
  }
  std::size_t memory_bytes() const { return bits_.memory_bytes(); }

 private:
  KeyBits bits_;
  std::vector<Key> keys_;
};

// The replicated rows trained since the last flush (a byte per key), and their keys in
// the order first trained.
class ReplicatedLog {
 public:
  ReplicatedLog() = default;
  explicit ReplicatedLog(std::uint64_t num_keys) : trained_(num_keys, 0) {}

  void note(Key k) {
    if (!trained_[k]) keys_.push_back(k);
    trained_[k] = 1;
  }
  const std::vector<Key>& keys() const { return keys_; }
  // After a flush wrote them back.
  void clear() {
    for (Key k : keys_) trained_[k] = 0;
    keys_.clear();
  }
  std::size_t memory_bytes() const { return trained_.capacity(); }

 private:
  std::vector<std::uint8_t> trained_;
  std::vector<Key> keys_;
};

}  // namespace ember::scheduler
