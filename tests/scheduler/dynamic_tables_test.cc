// Dynamic tables in the scheduler and ember-sim: hashed ids become the KeyDirectory's
// slots, dropped rows leave the scheduler's state, the traffic equals the vocabulary's
// when nothing is dropped, and memory stays flat while ids keep coming.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/common/error.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"
#include "ember/scheduler/key_directory.h"
#include "ember/scheduler/scheduler.h"
#include "ember/scheduler/simulator.h"
#include "test_util.h"

namespace ember::scheduler {
namespace {
namespace fs = std::filesystem;

class DynamicTables : public test::TempDirTest {
 protected:
  // Generated Criteo-like text, prepared with a vocabulary ("vocab") and with hashed
  // ids ("hashed").
  void prepare(std::uint64_t rows, double new_ids) {
    data::GenOptions g;
    g.rows = rows;
    g.scale = 0.001;
    g.new_ids = new_ids;
    g.output = dir_ / "g.tsv";
    data::generate(g);
    for (bool hashed : {false, true}) {
      data::PrepOptions p;
      p.inputs = {g.output};
      p.output = dir_ / (hashed ? "hashed" : "vocab");
      p.hashed_ids = hashed;
      data::prepare_dataset(p);
    }
  }
  SimOptions options(const std::string& policy, std::uint64_t iterations) const {
    SimOptions o;
    o.scheduler.workers = 4;
    o.scheduler.batch_per_worker = 64;
    o.scheduler.policy = policy;
    o.iterations = iterations;
    o.warmup = 2;
    o.shards = 2;
    o.shard_of = [](Key k) { return static_cast<std::uint32_t>(k % 2); };
    return o;
  }
};

TEST_F(DynamicTables, WithoutDropsTheTrafficIsTheVocabularysForTheSameCache) {
  prepare(6000, 0);
  const data::Dataset vocab = data::Dataset::open(dir_ / "vocab"), hashed = data::Dataset::open(dir_ / "hashed");
  for (const char* policy : {"vanilla", "herald"}) {
    SimOptions ov = options(policy, 18), oh = ov;
    const SimResult v = simulate(vocab, ov);
    // The same cache rows: the ratio of the slots that gives the vocabulary's count.
    const std::uint64_t slots = make_key_directory(hashed, oh.scheduler, oh.shards, 20).slot_count();
    oh.scheduler.cache_ratio = (static_cast<double>(v.cache_rows) - 0.5) / static_cast<double>(slots);
    const SimResult h = simulate(hashed, oh);
    ASSERT_EQ(h.cache_rows, v.cache_rows);
    EXPECT_EQ(h.traffic.pulls, v.traffic.pulls) << policy;
    EXPECT_EQ(h.traffic.push_grad, v.traffic.push_grad) << policy;
    EXPECT_EQ(h.traffic.push_value, v.traffic.push_value) << policy;
    EXPECT_EQ(h.traffic.push_evict, v.traffic.push_evict) << policy;
    EXPECT_EQ(h.traffic.hits, v.traffic.hits) << policy;
    EXPECT_EQ(h.traffic.flush_value + h.traffic.flush_grad, v.traffic.flush_value + v.traffic.flush_grad) << policy;
    ASSERT_EQ(h.per_shard_rows.size(), 2u);
    EXPECT_EQ(h.per_shard_rows[0].expired + h.per_shard_rows[0].capped, 0u);
    EXPECT_TRUE(v.per_shard_rows.empty());
    EXPECT_TRUE(h.per_table.empty());
  }
}

TEST_F(DynamicTables, TheRowsMadeAndDroppedDoNotDependOnThePolicyAndTheCapHolds) {
  prepare(12000, 0.3);
  const data::Dataset hashed = data::Dataset::open(dir_ / "hashed");
  std::vector<DirectoryCounts> first;
  for (const char* policy : {"vanilla", "laia", "herald"}) {
    SimOptions o = options(policy, 40);
    o.scheduler.create_after = 2;
    o.scheduler.create_filter_mb = 0.25;
    o.scheduler.expire_after = 8;
    o.scheduler.shard_max_rows = 1500;
    o.checkpoint_every = 7;  // flushes between drops
    const SimResult r = simulate(hashed, o);
    if (first.empty()) first = r.per_shard_rows;
    EXPECT_EQ(r.per_shard_rows, first) << policy;
    for (const DirectoryCounts& c : r.per_shard_rows) EXPECT_LE(c.live, 1500u);
  }
  DirectoryCounts all;
  for (const auto& c : first) all += c;
  EXPECT_GT(all.refused, 0u);
  EXPECT_GT(all.expired, 0u);
  EXPECT_GT(all.capped, 0u);
  EXPECT_EQ(all.created - all.expired - all.capped, all.live);
}

TEST_F(DynamicTables, MemoryStaysFlatWhileIdsKeepComing) {
  // 40% of the values new in each 10,000 rows: distinct ids grow with the rows; the cap
  // keeps the rows, and so the scheduler's and the directory's bytes, where they are.
  prepare(60000, 0.4);
  const data::Dataset hashed = data::Dataset::open(dir_ / "hashed");
  std::size_t bytes[2] = {0, 0};
  std::uint64_t created[2] = {0, 0};
  int i = 0;
  for (std::uint64_t iterations : {40, 200}) {
    SimOptions o = options("herald", iterations);
    o.scheduler.shard_max_rows = 2000;
    const SimResult r = simulate(hashed, o);
    bytes[i] = r.scheduler_bytes + r.directory_bytes;
    for (const auto& c : r.per_shard_rows) created[i] += c.created;
    ++i;
  }
  EXPECT_GT(created[1], 3 * created[0]);
  EXPECT_EQ(bytes[1], bytes[0]);
}

TEST_F(DynamicTables, EmberSimPrintsTheRowsMadeAndDroppedPerShard) {
  prepare(6000, 0.3);
  const std::string base = test::bin("ember-sim") + " --dataset " + (dir_ / "hashed").string() +
                           " --workers 2 --batch-per-worker 64 --iterations 20 --warmup 2 --ps 2 --policy vanilla,herald -q"
                           " --create-after 2 --expire-after 4 --shard-max-rows 800";
  std::string text, json;
  ASSERT_EQ(test::run_command(base + " 2>&1", text), 0) << text;
  EXPECT_NE(text.find("dynamic rows: "), std::string::npos) << text;
  EXPECT_NE(text.find("kept out by --create-after"), std::string::npos) << text;
  ASSERT_EQ(test::run_command(base + " --json 2>&1", json), 0) << json;
  std::istringstream lines(json);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(lines, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << json;
  for (const auto& r : rows) {
    const auto& d = r.at("dynamic_rows");
    ASSERT_EQ(d.at("per_shard").size(), 2u);
    std::uint64_t live = 0;
    for (const auto& shard : d.at("per_shard")) {
      EXPECT_LE(shard.at("live").get<std::uint64_t>(), 800u);
      live += shard.at("live").get<std::uint64_t>();
    }
    EXPECT_EQ(d.at("live").get<std::uint64_t>(), live);
    EXPECT_EQ(d.at("created").get<std::uint64_t>() - d.at("expired").get<std::uint64_t>() - d.at("capped").get<std::uint64_t>(), live);
    EXPECT_GT(d.at("refused").get<std::uint64_t>(), 0u);
    // The same rows under both policies.
    EXPECT_EQ(d, rows[0].at("dynamic_rows"));
  }
}

TEST(DynamicTablesScheduler, DroppedRowsLeaveEveryCacheAndTheirStates) {
  SchedulerConfig c;
  c.workers = 2;
  c.batch_per_worker = 2;
  c.num_keys = 16;
  c.table_offsets = {0};
  c.cache_rows = 8;
  c.policy = parse_policy("herald");
  Scheduler s(c);
  GlobalBatch b;
  b.samples = 4;
  b.tables = 1;
  b.keys = {1, 2, 3, 1};
  std::vector<StepPlan> plans;
  s.schedule(b, plans);
  bool cached = false;
  for (WorkerId w = 0; w < 2; ++w) cached |= s.cache_of(w).contains(1);
  ASSERT_TRUE(cached);
  const std::vector<Key> gone = {1, 3};
  s.drop_rows(gone);
  for (WorkerId w = 0; w < 2; ++w) {
    EXPECT_FALSE(s.cache_of(w).contains(1));
    EXPECT_FALSE(s.cache_of(w).contains(3));
  }
  EXPECT_EQ(s.locations().owner(1), cache::LocationMap::kNoOwner);
  EXPECT_EQ(s.locations().partials(1), 0u);
  EXPECT_FALSE(s.locations().dirty(1));
  // A new row in slot 1 is a cold pull again.
  const IterationStats st = s.schedule(b, plans);
  EXPECT_GE(st.traffic.cold_pulls, 2u);
  EXPECT_THROW(s.drop_rows(std::vector<Key>{99}), Error);
}

TEST_F(DynamicTables, WhatDynamicTablesDoNotSupportYetIsRefused) {
  prepare(3000, 0);
  const data::Dataset hashed = data::Dataset::open(dir_ / "hashed");
  SimOptions o = options("herald", 5);
  o.scheduler.lookahead = 2;
  try {
    simulate(hashed, o);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--lookahead does not apply to dynamic tables (hashed ids) yet");
  }
  o = options("fae:0.1", 5);
  EXPECT_THROW(simulate(hashed, o), ConfigError);
}

}  // namespace
}  // namespace ember::scheduler
