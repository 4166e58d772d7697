// Flushes: what a full flush and an evaluation's flush push or hand over, and that
// flushes change no plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>
#include <set>

#include "ember/common/error.h"
#include "ember/data/zipf.h"
#include "ember/scheduler/host_schedulers.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/simulator.h"
#include "reference_model.h"
#include "scheduler_fixture.h"

namespace ember::scheduler {
namespace {

// flush() leaves the PS with every update: dirty rows pushed as values, partial
// gradients pushed; the copies and their states stay, marked flushed, and the pushes the
// contract would make of them later are skipped. A second flush pushes nothing.
TEST(Scheduler, FlushPushesDirtyValuesAndPartialGradients) {
  Workload wl;
  std::vector<StepPlan> plans;
  Scheduler s(config("plan", 3, 1, 10, wl));
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};  // row 0 shared by workers 0 and 1
  s.schedule_with(b, {0, 1, 2}, plans);
  TrafficCounts c = s.flush(plans);
  EXPECT_EQ(c.push_grad, 2u);   // row 0 from workers 0 and 1
  EXPECT_EQ(c.push_value, 7u);  // every other row, by its sole trainer
  ASSERT_EQ(plans[0].push_grads.size(), 1u);
  EXPECT_EQ(plans[0].push_grads[0].key, 0u);
  EXPECT_EQ(s.locations().partials(0), 2u) << "the partial copies stay (flushes change no state)";
  EXPECT_TRUE(s.locations().flushed(0));
  EXPECT_TRUE(s.cache_of(0).contains(0));
  EXPECT_TRUE(s.cache_of(2).contains(102));
  EXPECT_TRUE(s.locations().dirty(102));
  EXPECT_TRUE(s.locations().flushed(102));
  EXPECT_EQ(s.flush(plans).transmissions(), 0u);
  // Row 0 needed by worker 2, row 102 by worker 0: the contract's pushes of them (the
  // partials' gradients, 102's value) are skipped; the copies go as they would have.
  b.keys = {102, 13, 103, 14, 15, 104, 0, 16, 105};
  const TrafficCounts next = s.schedule_with(b, {0, 1, 2}, plans).traffic;
  EXPECT_EQ(next.push_grad, 0u);
  EXPECT_EQ(next.push_value, 0u);
  EXPECT_TRUE(plans[0].push_grads.empty());
  EXPECT_TRUE(plans[2].push_values.empty());
  EXPECT_FALSE(s.cache_of(0).contains(0));
  EXPECT_EQ(s.locations().owner(102), 0u);
  EXPECT_FALSE(s.locations().flushed(102)) << "trained again: dirty for real";
}

// An evaluation's flush pushes only the rows the evaluation reads (evaluated_rows), and
// of those only partial gradients: a dirty row goes to worker 0 (eval_hands) and stays
// dirty and unflushed. A full flush then pushes the rest, so that the two push what one
// full flush pushes, less nothing: the handed row is pushed by the full flush.
TEST(Scheduler, AnEvaluationFlushPushesOnlyTheEvaluatedRows) {
  Workload wl;
  std::vector<StepPlan> plans;
  SchedulerConfig c = config("plan", 3, 1, 10, wl);
  c.evaluated_rows = {0, 102, 102, 7};  // repeats and a row never trained are fine
  c.hand_evaluated_rows = true;
  Scheduler s(c);
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};  // row 0 shared by workers 0 and 1
  s.schedule_with(b, {0, 1, 2}, plans);
  Scheduler whole = s;
  const TrafficCounts all = whole.flush(plans);
  const TrafficCounts eval = s.flush(plans, true);
  EXPECT_EQ(eval.push_grad, 2u);   // row 0's partials, from workers 0 and 1
  EXPECT_EQ(eval.push_value, 0u);  // row 102 is handed, not pushed
  EXPECT_EQ(eval.eval_handed, 1u);
  ASSERT_EQ(plans[2].eval_hands.size(), 1u);
  EXPECT_EQ(plans[2].eval_hands[0].key, 102u);
  EXPECT_TRUE(plans[0].eval_hands.empty() && plans[1].eval_hands.empty());
  for (const StepPlan& p : plans) {
    EXPECT_TRUE(p.push_values.empty());
    for (const KeySlot& e : p.push_grads) EXPECT_EQ(e.key, 0u);
  }
  EXPECT_TRUE(s.locations().flushed(0));
  EXPECT_FALSE(s.locations().flushed(102)) << "handed to worker 0: the PS still lacks it";
  EXPECT_TRUE(s.locations().dirty(102));
  EXPECT_FALSE(s.locations().flushed(100)) << "not evaluated: waits for a full flush";
  EXPECT_TRUE(s.locations().dirty(100));
  const TrafficCounts rest = s.flush(plans);
  EXPECT_EQ(eval.push_grad + rest.push_grad, all.push_grad);
  EXPECT_EQ(rest.push_value, all.push_value);
  EXPECT_EQ(rest.push_value, 7u);
  EXPECT_EQ(rest.eval_handed, 0u);
  EXPECT_EQ(s.flush(plans, true).transmissions(), 0u);
}

// Without hand_evaluated_rows (a scheduler per host), the evaluated dirty row is pushed
// and marked flushed, as a full flush would.
TEST(Scheduler, AnEvaluationFlushPushesHeldRowsWhenItCannotHandThem) {
  Workload wl;
  std::vector<StepPlan> plans;
  SchedulerConfig c = config("plan", 3, 1, 10, wl);
  c.evaluated_rows = {0, 102};
  Scheduler s(c);
  GlobalBatch b;
  b.samples = 3;
  b.tables = 3;
  b.keys = {0, 10, 100, 0, 11, 101, 1, 12, 102};
  s.schedule_with(b, {0, 1, 2}, plans);
  const TrafficCounts eval = s.flush(plans, true);
  EXPECT_EQ(eval.push_grad, 2u);
  EXPECT_EQ(eval.push_value, 1u);
  EXPECT_EQ(eval.eval_handed, 0u);
  ASSERT_EQ(plans[2].push_values.size(), 1u);
  EXPECT_EQ(plans[2].push_values[0].key, 102u);
  EXPECT_TRUE(s.locations().flushed(102));
}

// Worker 0 holds the rows handed to it at once: only while they are at most twice a
// cache's rows. 24 rows trained by one worker alone each (8 a worker), all evaluated:
// handed with 12 cache rows a worker, pushed (and flushed) with 10.
TEST(Scheduler, AnEvaluationHandsNoMoreRowsThanTwoCachesHold) {
  for (std::uint32_t cache : {12u, 10u}) {
    Workload wl;
    std::vector<StepPlan> plans;
    SchedulerConfig c = config("plan", 3, 4, cache, wl);
    GlobalBatch b;
    b.samples = 12;
    b.tables = 3;
    for (std::uint64_t i = 0; i < 12; ++i) {
      b.keys.insert(b.keys.end(), {0, 4 + i, 44 + i});
      c.evaluated_rows.insert(c.evaluated_rows.end(), {4 + i, 44 + i});
    }
    c.hand_evaluated_rows = true;
    Scheduler s(c);
    s.schedule_with(b, {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, plans);
    const TrafficCounts eval = s.flush(plans, true);
    EXPECT_EQ(eval.eval_handed + eval.push_value, 24u) << cache;
    EXPECT_EQ(eval.eval_handed, cache == 12 ? 24u : 0u) << cache;
    EXPECT_EQ(s.locations().flushed(44), cache == 10) << cache;
  }
}

// Flushes (evaluations, checkpoints) change no allocation, slot, hit or eviction: a
// scheduler that flushes every few iterations plans exactly what one that never flushes
// does, except for the pushes the flushes made early. A scheduler replayed from
// iteration 0 and flushed, as a resumed worker's loader does, holds the same rows in
// the same slots as the one that ran. So a job resumed from a checkpoint meets the same
// rows on the same workers as the uninterrupted job, and its floating-point sums add up
// in the same order (Adagrad magnifies any other order).
TEST(Scheduler, FlushesChangeNoPlanAndAReplayRebuildsTheCaches) {
  for (const char* policy : {"vanilla", "laia", "plan", "herald"}) {
    for (const std::uint32_t L : {0u, 3u}) {
      Workload wl;
      SchedulerConfig cfg = config(policy, 4, 8, 30, wl);
      cfg.lookahead = L;
      cfg.eviction = L > 0 ? Eviction::kLookahead : Eviction::kLru;
      cfg.refine_allocation = std::string(policy) == "herald";
      Scheduler flushing(cfg), plain(cfg);
      std::vector<GlobalBatch> batches;
      for (std::uint32_t it = 0; it < 80 + L; ++it) batches.push_back(wl.next(32, it));
      std::vector<StepPlan> a, b, f;
      std::uint64_t flushed = 0, skipped = 0;
      auto transmissions = [](const TrafficCounts& c) { return c.push_grad + c.push_value + c.push_evict; };
      for (std::uint32_t it = 0; it < 80; ++it) {
        for (Scheduler* s : {&flushing, &plain}) {
          s->look_ahead_through(it, 80, [&, s](GlobalBatch& next) { next = batches[s->shown_until()]; });
        }
        const TrafficCounts ca = flushing.schedule(batches[it], a).traffic;
        const TrafficCounts cb = plain.schedule(batches[it], b).traffic;
        ASSERT_EQ(ca.pulls, cb.pulls) << policy << " L=" << L << " iteration " << it;
        ASSERT_EQ(ca.hits, cb.hits) << policy << " iteration " << it;
        skipped += transmissions(cb) - transmissions(ca);
        for (std::uint32_t w = 0; w < 4; ++w) {
          ASSERT_EQ(a[w].samples, b[w].samples) << policy << " L=" << L << " iteration " << it << " worker " << w;
          ASSERT_EQ(a[w].pulls.size(), b[w].pulls.size());
          for (std::size_t j = 0; j < a[w].pulls.size(); ++j) {
            ASSERT_EQ(a[w].pulls[j].key, b[w].pulls[j].key);
            ASSERT_EQ(a[w].pulls[j].slot, b[w].pulls[j].slot);
            ASSERT_EQ(a[w].pulls[j].evicted, b[w].pulls[j].evicted);
          }
        }
        if (it % 7 == 6) flushed += flushing.flush(f).transmissions();
        if (it == 40 || it == 61) {
          // A replay of 0 .. it, flushed: the same rows in the same slots.
          Scheduler replay(cfg);
          std::vector<StepPlan> r;
          for (std::uint32_t t = 0; t <= it; ++t) {
            replay.look_ahead_through(t, 80, [&](GlobalBatch& next) { next = batches[replay.shown_until()]; });
            replay.schedule(batches[t], r);
          }
          replay.flush(r);
          for (std::uint32_t w = 0; w < 4; ++w) {
            const auto want = plain.latest_rows(w);
            const auto got = replay.latest_rows(w);
            ASSERT_EQ(got.size(), want.size()) << policy << " iteration " << it;
            for (std::size_t j = 0; j < got.size(); ++j) {
              ASSERT_EQ(got[j].key, want[j].key);
              ASSERT_EQ(got[j].slot, want[j].slot);
            }
          }
        }
      }
      if (std::string(policy) == "plan" || std::string(policy) == "herald") {  // full-set sync leaves nothing to flush
        EXPECT_GT(flushed, 0u) << policy;
        EXPECT_GT(skipped, 0u) << policy << ": flushed rows are not pushed again";
        EXPECT_LE(skipped, flushed) << policy;
      }
    }
  }
}

}  // namespace
}  // namespace ember::scheduler
