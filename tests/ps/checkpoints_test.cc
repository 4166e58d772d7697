// Checkpoint directories (checkpoints.h): a directory per checkpoint, a manifest written
// by the shard that completes it, pruning that never leaves fewer whole checkpoints than
// asked, and what --restore picks from a root (the newest whole checkpoint, naming those
// passed over) or from one checkpoint.
#include <gtest/gtest.h>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/shard_store.h"
#include "../data/test_util.h"

namespace ember::ps {
namespace {

namespace fs = std::filesystem;

StoreConfig config(std::uint32_t shard, std::uint32_t shards) {
  StoreConfig c;
  c.num_keys = 400;
  c.dim = 4;
  c.shard = shard;
  c.shards = shards;
  c.optimizer.kind = OptimizerKind::kAdagrad;
  return c;
}

class CheckpointDirs : public test::TempDirTest {
 protected:
  // Shard s of 2 trains rows of its own for `iteration` and checkpoints; returns what
  // finish() said.
  bool checkpoint(std::uint32_t s, std::int64_t iteration, std::size_t keep = 2) {
    ShardStore& store = stores_[s];
    std::vector<Key> keys;
    for (Key k = s; k < 40; k += 2) keys.push_back(k);
    std::vector<std::uint32_t> one(keys.size(), 1);
    std::vector<float> g(keys.size() * 4, 0.1f * static_cast<float>(iteration + 2));
    store.push_grad(static_cast<std::uint64_t>(iteration), keys, one, g.data());
    store.commit();
    const CheckpointDir dir(root(), s, 2, keep);
    store.save(dir.file_for(iteration), iteration);
    return dir.finish(iteration);
  }
  fs::path root() const { return dir_ / "ckpt"; }
  fs::path at(std::int64_t iteration) const { return checkpoint_dir(root(), iteration); }

  std::vector<ShardStore> stores_ = [] {
    std::vector<ShardStore> v;
    v.emplace_back(config(0, 2));
    v.emplace_back(config(1, 2));
    return v;
  }();
};

TEST_F(CheckpointDirs, TheShardThatCompletesACheckpointWritesItsManifest) {
  EXPECT_EQ(at(9).filename(), "iter-000000009");
  EXPECT_EQ(at(-1).filename(), "iter-initial");
  EXPECT_FALSE(checkpoint(0, 9));  // shard 1's file is not there yet
  EXPECT_FALSE(fs::exists(at(9) / "manifest.json"));
  EXPECT_TRUE(checkpoint(1, 9));
  const std::string manifest = read_file(at(9) / "manifest.json");
  EXPECT_NE(manifest.find("\"iteration\": 9"), std::string::npos) << manifest;
  EXPECT_NE(manifest.find("\"name\": \"shard-1-of-2.ckpt\""), std::string::npos) << manifest;
  // Restored into three shards from the root: the same rows.
  const RestorePlan plan = plan_restore(root());
  EXPECT_EQ(plan.dir, at(9));
  EXPECT_TRUE(plan.manifest);
  ASSERT_EQ(plan.files.size(), 2u);
  std::vector<ShardStore> three;
  for (std::uint32_t s = 0; s < 3; ++s) {
    three.emplace_back(config(s, 3));
    EXPECT_EQ(three.back().load(plan.files), 9);
  }
  for (Key k = 0; k < 40; ++k) {
    for (int j = 0; j < 8; ++j) ASSERT_EQ(three[k % 3].row(k)[j], stores_[k % 2].row(k)[j]) << "key " << k;
  }
}

TEST_F(CheckpointDirs, PruningKeepsTheNewestWholeCheckpointsAndAnyNewer) {
  for (std::int64_t it : {1, 3, 5}) {
    checkpoint(0, it);
    checkpoint(1, it);
  }
  // Keep 2: shard 1 completed 5 and removed iteration 1 whole.
  EXPECT_FALSE(fs::exists(at(1)));
  EXPECT_TRUE(fs::exists(at(3) / "manifest.json"));
  EXPECT_TRUE(fs::exists(at(5) / "manifest.json"));
  // Shard 0 checkpoints 7 and 9 while shard 1 is gone: neither is whole, so the two
  // whole ones stay (a restore still has them), and 7 and 9 stay too.
  checkpoint(0, 7);
  checkpoint(0, 9);
  for (std::int64_t it : {3, 5, 7, 9}) EXPECT_TRUE(fs::exists(at(it))) << it;
  // The root's newest whole checkpoint is 5; 9 and 7 are passed over, saying why.
  const RestorePlan plan = plan_restore(root());
  EXPECT_EQ(plan.dir, at(5));
  ASSERT_EQ(plan.skipped.size(), 2u);
  EXPECT_NE(plan.skipped[0].find("iter-000000009"), std::string::npos) << plan.skipped[0];
  EXPECT_NE(plan.skipped[0].find("shard 1"), std::string::npos) << plan.skipped[0];
  // Shard 1 catches up at 9 and completes it: 3 is now older than the newest 2 whole
  // ones (9, 5) and goes whole; 7, newer than 5, stays.
  EXPECT_TRUE(checkpoint(1, 9));
  EXPECT_FALSE(fs::exists(at(3)));
  EXPECT_TRUE(fs::exists(at(7)));
  EXPECT_EQ(plan_restore(root()).dir, at(9));
  // A shard that completes nothing removes only its own part of older checkpoints:
  // shard 0 alone at 11 (keep 1: 9 is the newest whole one, so 5 and 7 are older).
  checkpoint(0, 11, 1);
  EXPECT_FALSE(fs::exists(at(5) / "manifest.json"));
  EXPECT_FALSE(fs::exists(at(5) / "shard-0-of-2.ckpt"));
  EXPECT_TRUE(fs::exists(at(5) / "shard-1-of-2.ckpt"));
  EXPECT_FALSE(fs::exists(at(7)));  // shard 0's file was its only one
  EXPECT_TRUE(fs::exists(at(9) / "manifest.json"));
}

TEST_F(CheckpointDirs, ATruncatedFileIsPassedOverFromTheRootAndRefusedByName) {
  checkpoint(0, 1);
  checkpoint(1, 1);
  checkpoint(0, 3);
  checkpoint(1, 3);
  const fs::path victim = at(3) / "shard-0-of-2.ckpt";
  const std::string bytes = read_file(victim);
  write_file_atomic(victim, bytes.substr(0, bytes.size() - 100));
  const RestorePlan plan = plan_restore(root());
  EXPECT_EQ(plan.dir, at(1));
  ASSERT_EQ(plan.skipped.size(), 1u);
  EXPECT_NE(plan.skipped[0].find("shard-0-of-2.ckpt: " + std::to_string(bytes.size() - 100) + " bytes, its manifest says"), std::string::npos)
      << plan.skipped[0];
  // Named directly, that checkpoint is refused, naming the file.
  try {
    plan_restore(at(3));
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("shard-0-of-2.ckpt"), std::string::npos) << e.what();
  }
  // Nothing whole at all: refused, listing why for each.
  fs::remove(at(1) / "shard-1-of-2.ckpt");
  fs::remove(at(1) / "manifest.json");
  try {
    plan_restore(root());
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no whole checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("iter-000000001"), std::string::npos) << e.what();
  }
  fs::create_directories(dir_ / "empty");
  EXPECT_THROW(plan_restore(dir_ / "empty"), DataError);
  EXPECT_THROW(plan_restore(dir_ / "missing"), DataError);
}

// A directory of *.ckpt files (the flat layout of earlier versions) is one checkpoint.
TEST_F(CheckpointDirs, AFlatDirectoryOfFilesStillRestores) {
  fs::create_directories(dir_ / "flat");
  stores_[0].save(dir_ / "flat" / "shard-0-of-2.ckpt", 4);
  stores_[1].save(dir_ / "flat" / "shard-1-of-2.ckpt", 4);
  const RestorePlan plan = plan_restore(dir_ / "flat");
  EXPECT_EQ(plan.dir, dir_ / "flat");
  EXPECT_FALSE(plan.manifest);
  ShardStore one(config(0, 1));
  EXPECT_EQ(one.load(plan.files), 4);
  // Beside checkpoint directories, flat files make the root ambiguous: refused.
  checkpoint(0, 6);
  checkpoint(1, 6);
  fs::rename(at(6), dir_ / "flat" / "iter-000000006");
  try {
    plan_restore(dir_ / "flat");
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("both *.ckpt files and iter-* checkpoint directories"), std::string::npos) << e.what();
  }
  EXPECT_EQ(plan_restore(dir_ / "flat" / "iter-000000006").files.size(), 2u);
}

}  // namespace
}  // namespace ember::ps
