// A shard whose rows live on a disk tier (disk_tier.h) trains the rows an all-RAM shard
// trains, bit for bit, with a RAM budget far below the table (and below one iteration's
// rows); hints read rows in before they are used; bad store directories are refused.
#include "ember/ps/disk_tier.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {
namespace {

constexpr std::uint32_t kDim = 16;
constexpr std::uint64_t kKeys = 80000;  // 2 shards x 40000 rows; with Adagrad 128 B a row: 5 MB per shard

StoreConfig config(OptimizerKind kind, std::uint32_t shard, const std::filesystem::path& dir = {}) {
  StoreConfig c;
  c.num_keys = kKeys;
  c.dim = kDim;
  c.shard = shard;
  c.shards = 2;
  c.seed = 5;
  c.optimizer.kind = kind;
  c.optimizer.lr = 0.05f;
  c.lr_at = [](std::uint64_t it) { return 0.05f / (1.0f + 0.1f * static_cast<float>(it)); };
  if (!dir.empty()) {
    c.tier.dir = dir;
    c.tier.ram_budget_bytes = 192 << 10;  // 192 KiB: under one iteration's rows (1,003 to 3,072 rows)
    c.tier.table = "test table";
  }
  return c;
}

class DiskTierTest : public test::TempDirTest {};

// Waits until the pager brought the tier within its budget.
bool within_budget(const ShardStore& s) {
  for (int i = 0; i < 200; ++i) {
    const TierStats t = *s.tier_stats();
    if (t.resident <= t.budget_rows) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Iterations of pulls, gradient pushes (one and two trainers), write-backs and commits
// against an all-RAM shard and a tiered one in `dir`: each pull, and every row at the
// end, the same bytes. An iteration uses 4,000 rows (0.5 MB with Adagrad state) of which
// hot ones repeat; the budget holds fewer.
void train_both_and_compare(OptimizerKind kind, const std::filesystem::path& dir) {
  ShardStore ram(config(kind, 1)), disk(config(kind, 1, dir));
  ASSERT_TRUE(disk.tier_stats().has_value());
  std::mt19937_64 rng(11);
  const std::uint32_t rf = ram.row_floats();
  for (std::uint64_t it = 1; it <= 5; ++it) {
    // Keys of shard 1: odd; a quarter from a hot range, the rest anywhere.
    std::vector<Key> keys;
    std::set<Key> seen;
    while (keys.size() < 4000) {
      const std::uint64_t local = rng() % 4 == 0 ? rng() % 2000 : rng() % (kKeys / 2);
      if (seen.insert(local * 2 + 1).second) keys.push_back(local * 2 + 1);
    }
    if (it % 3 == 0) disk.hint(keys, it);
    std::vector<float> a(keys.size() * rf), b(keys.size() * rf);
    ram.pull_with_state(keys, a.data());
    disk.pull_with_state(keys, b.data());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "iteration " << it;
    // Gradients: the first half by one trainer; the next by two (two pushes); the last
    // eighth written back instead.
    const std::size_t half = keys.size() / 2, grads_end = keys.size() - keys.size() / 8;
    std::vector<float> g(keys.size() * kDim), g2(keys.size() * kDim);
    for (float& x : g) x = static_cast<float>(static_cast<std::int64_t>(rng() % 2001) - 1000) / 1000.0f;
    for (float& x : g2) x = static_cast<float>(static_cast<std::int64_t>(rng() % 2001) - 1000) / 1000.0f;
    std::span<const Key> k(keys);
    std::vector<std::uint32_t> one(half, 1), two(grads_end - half, 2);
    for (ShardStore* s : {&ram, &disk}) {
      s->push_grad(it, k.subspan(0, half), one, g.data());
      s->push_grad(it, k.subspan(half, grads_end - half), two, g.data() + half * kDim);
      s->push_grad(it, k.subspan(half, grads_end - half), two, g2.data() + half * kDim);
      std::vector<float> rows(a.begin() + static_cast<std::ptrdiff_t>(grads_end * rf), a.end());
      for (float& x : rows) x *= 0.5f;
      s->push_value(k.subspan(grads_end), rows.data());
      if (it % 2 == 0)
        s->commit();
      else
        s->commit_async();
    }
  }
  std::vector<Key> all;
  for (Key key = 1; key < kKeys; key += 2) all.push_back(key);
  std::vector<float> a(all.size() * rf), b(all.size() * rf);
  ram.pull_with_state(all, a.data());
  disk.pull_with_state(all, b.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  const TierStats t = *disk.tier_stats();
  EXPECT_GT(t.evicted, 0u) << "the table never outgrew the budget";
  EXPECT_GT(t.written_back, 0u);
  EXPECT_GT(t.hint_loads + t.misses, 0u);
  EXPECT_TRUE(within_budget(disk)) << t.resident << " rows resident, budget " << t.budget_rows;
}

// Every optimizer; rows of 64 to 196 bytes, so that rows share and straddle the file's
// sectors (written back by read-modify-write).
TEST_F(DiskTierTest, TrainsTheRowsAnAllRamShardTrains) {
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam}) {
    SCOPED_TRACE(optimizer_name(kind));
    train_both_and_compare(kind, dir_ / optimizer_name(kind));
  }
}

// Where the file system has no direct I/O (tmpfs), the tier reads and writes through the
// page cache and drops what it wrote: the same rows.
TEST_F(DiskTierTest, WorksWithoutDirectIo) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  const std::filesystem::path dir = "/dev/shm/ember-disk-tier-" + std::to_string(::getpid());
  train_both_and_compare(OptimizerKind::kAdagrad, dir);
  std::filesystem::remove_all(dir);
}

// Threads pull rows while the pager moves them between memory and disk and hints read
// some in: every pull is the rows written, whichever copy it came from.
TEST_F(DiskTierTest, ConcurrentPullsSeeTheRowsWritten) {
  ShardStore disk(config(OptimizerKind::kAdagrad, 0, dir_ / "tier"));
  const std::uint32_t rf = disk.row_floats();
  std::vector<Key> keys;
  for (Key k = 0; k < 40000; k += 2) keys.push_back(k);
  auto value = [&](Key k, std::uint32_t j) { return static_cast<float>(k) + 0.001f * static_cast<float>(j); };
  std::vector<float> rows(keys.size() * rf);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::uint32_t j = 0; j < rf; ++j) rows[i * rf + j] = value(keys[i], j);
  disk.push_value(keys, rows.data());  // 20,000 rows through a budget of 1,536: most go to disk
  std::atomic<int> bad{0};
  std::atomic<bool> done{false};
  std::thread hinter([&] {
    std::mt19937_64 rng(3);
    for (std::uint64_t it = 0; !done.load(); ++it) {
      std::vector<Key> some;
      for (int i = 0; i < 300; ++i) some.push_back(keys[rng() % keys.size()]);
      disk.hint(some, it);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::vector<std::thread> pullers;
  for (int t = 0; t < 4; ++t) {
    pullers.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<Key> some;
      std::vector<float> got;
      for (int round = 0; round < 60; ++round) {
        some.clear();
        std::set<Key> seen;
        while (some.size() < 400) {
          const Key k = keys[rng() % keys.size()];
          if (seen.insert(k).second) some.push_back(k);
        }
        got.assign(some.size() * rf, 0);
        disk.pull_with_state(some, got.data());
        for (std::size_t i = 0; i < some.size(); ++i)
          for (std::uint32_t j = 0; j < rf; ++j)
            if (got[i * rf + j] != value(some[i], j)) ++bad;
      }
    });
  }
  for (std::thread& p : pullers) p.join();
  done.store(true);
  hinter.join();
  EXPECT_EQ(bad.load(), 0);
  const TierStats t = *disk.tier_stats();
  EXPECT_GT(t.written_back, 10000u);
  EXPECT_GT(t.misses, 0u);
  EXPECT_TRUE(within_budget(disk));
}

// A checkpoint of a tiered shard restores into an all-RAM one, and back, exactly.
TEST_F(DiskTierTest, CheckpointsMoveBetweenTieredAndAllRamShards) {
  ShardStore disk(config(OptimizerKind::kAdagrad, 0, dir_ / "tier"));
  std::vector<Key> keys;
  for (Key k = 0; k < kKeys; k += 6) keys.push_back(k);
  std::vector<float> g(keys.size() * kDim, 0.25f);
  disk.push_grad(1, keys, std::vector<std::uint32_t>(keys.size(), 1), g.data());
  disk.commit();
  disk.save(dir_ / "ckpt.bin", 1);
  EXPECT_TRUE(within_budget(disk));
  ShardStore ram(config(OptimizerKind::kAdagrad, 0));
  ASSERT_EQ(ram.load({dir_ / "ckpt.bin"}, true), 1);
  ShardStore back(config(OptimizerKind::kAdagrad, 0, dir_ / "tier2"));
  ASSERT_EQ(back.load({dir_ / "ckpt.bin"}, true), 1);
  const std::uint32_t rf = ram.row_floats();
  std::vector<float> a(keys.size() * rf), b(keys.size() * rf), c(keys.size() * rf);
  disk.pull_with_state(keys, a.data());
  ram.pull_with_state(keys, b.data());
  back.pull_with_state(keys, c.data());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0);
  EXPECT_TRUE(within_budget(back));
}

// Rows hinted ahead are read in by the tier's threads: their pull then waits for none.
TEST_F(DiskTierTest, HintedRowsAreInMemoryBeforeTheyArePulled) {
  ShardStore disk(config(OptimizerKind::kSgd, 0, dir_ / "tier"));
  std::vector<Key> keys;
  for (Key k = 0; k < 2000; k += 2) keys.push_back(k);  // under half the budget's rows (a hint's most)
  std::vector<float> out(keys.size() * kDim);
  disk.pull(keys, out.data());  // first use: initialized (written)
  // Push them out of memory: use the rest of the table.
  std::vector<Key> rest;
  for (Key k = 20000; k < kKeys; k += 2) rest.push_back(k);
  std::vector<float> big(rest.size() * kDim);
  disk.pull(rest, big.data());
  ASSERT_TRUE(within_budget(disk));
  disk.hint(keys, 2);
  for (int i = 0; i < 500 && disk.tier_stats()->hint_queue > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const TierStats before = *disk.tier_stats();
  EXPECT_GT(before.hint_loads, 0u);
  disk.pull(keys, out.data());
  EXPECT_EQ(disk.tier_stats()->misses, before.misses) << "a hinted row was read on the critical path";
}

// Bad store directories: another table's, one in use, one that is a file, too small a budget.
TEST_F(DiskTierTest, RefusesDirectoriesItCannotUse) {
  const std::filesystem::path dir = dir_ / "store";
  {
    ShardStore first(config(OptimizerKind::kSgd, 0, dir));
    try {
      ShardStore second(config(OptimizerKind::kSgd, 0, dir));
      ADD_FAILURE() << "a store directory in use was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("shard-0-of-2.rows is in use"), std::string::npos) << e.what();
    }
  }
  StoreConfig other = config(OptimizerKind::kSgd, 0, dir);
  other.tier.table = "another table";
  try {
    ShardStore s(other);
    ADD_FAILURE() << "another table's directory was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("shard-0-of-2.json holds another table"), std::string::npos) << e.what();
  }
  { ShardStore again(config(OptimizerKind::kSgd, 0, dir)); }  // the same table's: reused
  std::ofstream(dir_ / "a-file") << "x";
  EXPECT_THROW(ShardStore(config(OptimizerKind::kSgd, 0, dir_ / "a-file")), ConfigError);
  StoreConfig tiny = config(OptimizerKind::kSgd, 0, dir_ / "tiny");
  tiny.tier.ram_budget_bytes = 32 << 10;
  EXPECT_THROW(ShardStore{tiny}, ConfigError);
}

// A budget that holds the whole shard makes the tier pure overhead: the shard says so.
TEST_F(DiskTierTest, SaysWhenTheBudgetHoldsTheWholeShard) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  auto warnings = [&] {
    std::string all;
    for (const auto& line : sink->last_formatted()) all += line;
    return all;
  };
  { ShardStore small(config(OptimizerKind::kSgd, 0, dir_ / "small")); }  // 192 KiB: a fraction of the shard
  const std::string quiet = warnings();
  StoreConfig big = config(OptimizerKind::kSgd, 0, dir_ / "big");
  big.tier.ram_budget_bytes = 64 << 20;
  { ShardStore whole(big); }
  const std::string said = warnings();
  spdlog::set_default_logger(before);
  EXPECT_EQ(quiet.find("holds all"), std::string::npos) << quiet;
  EXPECT_NE(said.find("--ram-budget-mb 64 holds all 40000 rows of shard-0-of-2"), std::string::npos) << said;
}

}  // namespace
}  // namespace ember::ps
