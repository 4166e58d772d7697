// The schedulers of a job's hosts (--scheduler-per-host): each process models only its
// own host's caches (SchedulerConfig::model_host), so after each iteration it tells the
// others which rows its workers evicted, and applies theirs, before it looks ahead or
// schedules again (docs/scheduler.md "State per process"). Each worker sends its own
// evictions (its host's scheduler knows them all; splitting by worker keeps the
// messages even); one eviction is one 64-bit word.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/scheduler/scheduler.h"

namespace ember::worker {

// Every worker's words, gathered on every worker (a collective of the whole job).
class EvictionChannel {
 public:
  virtual ~EvictionChannel() = default;
  // mine: this worker's words; returns every worker's, by rank. Throws IoError when a
  // peer is lost.
  virtual std::vector<std::vector<std::int64_t>> all_gather(const std::vector<std::int64_t>& mine) = 0;
};

// Worker `rank`'s evictions of the iteration just scheduled, as words: the key, bit 62
// partial, bit 61 pushed.
std::vector<std::int64_t> encode_evictions(const std::vector<scheduler::RowEviction>& evictions, std::uint32_t rank);
// Appends worker `rank`'s words as evictions; ProtocolError for a word out of range.
void decode_evictions(const std::vector<std::int64_t>& words, std::uint32_t rank, std::uint64_t num_keys,
                      std::vector<scheduler::RowEviction>& out);

// The words' bytes a worker sent (its own evictions) and received (every other
// worker's).
struct ExchangeBytes {
  std::uint64_t out = 0, in = 0;
  ExchangeBytes& operator+=(const ExchangeBytes& o) {
    out += o.out;
    in += o.in;
    return *this;
  }
};

// After s scheduled an iteration: sends this worker's evictions, gathers every worker's,
// applies the other hosts' to s.
ExchangeBytes exchange_evictions(scheduler::Scheduler& s, EvictionChannel& channel, std::uint32_t rank);

}  // namespace ember::worker
