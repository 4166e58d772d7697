// The Scheduler's state and working memory (scheduler.h keeps them behind pointers, so
// that its public header stays small).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "admission.h"
#include "allocation.h"
#include "batch_rows.h"
#include "doi_profiler.h"
#include "ember/cache/location_map.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/worker_cache.h"
#include "row_marks.h"
#include "sync_mode.h"
#include "window.h"

namespace ember::scheduler {

// Everything the Scheduler keeps from one iteration to the next. Every member is a value
// type: the default copy is a complete, independent copy (brute force tries each
// allocation on a copy).
struct Scheduler::State {
  explicit State(const SchedulerConfig& c);

  std::uint32_t tables = 0;
  std::uint64_t iteration = 0;
  bool planned = false;                 // an iteration was planned before (the first has nothing to prefetch)
  cache::LocationMap loc;               // every row's state
  WorkerCaches lru;                     // the modelled workers' caches (SchedulerConfig::model_host)
  std::vector<std::uint32_t> modelled;  // those workers
  bool awaiting_evictions = false;      // a scheduler of one host: the other hosts' evictions not applied yet
  std::optional<Window> window;         // lookahead only
  SyncModes sync;                       // the policy's sync mode, with its own state (het: versions)
  DoiProfiler doi;                      // adaptive LAIA: the tables to score
  KeyBits seen;                         // rows used by an earlier iteration (cold pulls)
  PushMarks pushed;                     // prefetch only
  ReplicatedLog replicated_trained;     // replicated rows trained since the last flush
  FrequencySketch sketch;               // --cache-admission tinylfu only
  // The rows an evaluation reads (SchedulerConfig::evaluated_rows): marked, and listed
  // in key order.
  KeyBits evaluated;
  std::vector<Key> evaluated_keys;
};

// Working memory for one batch, reused; a copy starts with its own.
struct Scheduler::Scratch {
  BatchRows rows;
  LaiaScratch laia;  // LAIA's working memory
  std::vector<std::uint32_t> worker_of;
  std::vector<RowEviction> evictions;  // a scheduler of one host: its workers' of the last iteration
  std::vector<Key> counted;            // admission: the batch's rows a cache may hold
};

}  // namespace ember::scheduler
