// Checkpoint directories (checkpoints.h): a directory per checkpoint, a manifest written
// by the shard that completes it, pruning that never leaves fewer whole checkpoints than
// asked, and what --restore picks from a root (the newest whole checkpoint, naming those
// passed over) or from one checkpoint.
#include "ember/ps/checkpoints.h"

#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <optional>
#include <set>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/ps/shard_store.h"

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
    train(s, iteration);
    const CheckpointDir dir(root(), s, 2, keep);
    stores_[s].save(dir.file_for(iteration), iteration);
    return dir.finish(iteration);
  }
  void train(std::uint32_t s, std::int64_t iteration) {
    ShardStore& store = stores_[s];
    std::vector<Key> keys;
    for (Key k = s; k < 40; k += 2) keys.push_back(k);
    std::vector<std::uint32_t> one(keys.size(), 1);
    std::vector<float> g(keys.size() * 4, 0.1f * static_cast<float>(iteration + 2));
    store.push_grad(static_cast<std::uint64_t>(iteration), keys, one, g.data());
    store.commit();
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

// Incremental checkpoints (ShardStore::save with a base): each holds the rows changed
// since the one before; a restore loads the chain oldest first and gives every row the
// store had; pruning keeps the bases that a kept checkpoint needs and lets them go once
// a whole one follows; a missing base is refused by name and passed over from the root.
TEST_F(CheckpointDirs, IncrementalCheckpointsRestoreWithTheirBases) {
  std::vector<ShardStore> s;
  for (std::uint32_t i = 0; i < 2; ++i) {
    StoreConfig c = config(i, 2);
    c.track_changes = true;
    s.emplace_back(c);
  }
  // Iteration 1 trains keys 0-39, 2 trains 0-9, 3 trains 100-109 (each shard its own).
  auto train_keys = [&](std::int64_t it, Key from, Key to) {
    for (std::uint32_t i = 0; i < 2; ++i) {
      std::vector<Key> keys;
      for (Key k = from + i; k < to; k += 2) keys.push_back(k);
      std::vector<std::uint32_t> one(keys.size(), 1);
      std::vector<float> g(keys.size() * 4, 0.1f * static_cast<float>(it + 2));
      s[i].push_grad(static_cast<std::uint64_t>(it), keys, one, g.data());
      s[i].commit();
    }
  };
  auto save_all = [&](std::int64_t it, std::optional<std::int64_t> base) {
    for (std::uint32_t i = 0; i < 2; ++i) {
      const CheckpointDir dir(root(), i, 2, 1);  // keep 1
      s[i].save(dir.file_for(it), it, ShardStore::Unapplied::kRefuse, base);
      dir.finish(it);
    }
  };
  train_keys(1, 0, 40);
  save_all(1, std::nullopt);
  train_keys(2, 0, 10);
  save_all(2, 1);
  train_keys(3, 100, 110);
  save_all(3, 2);
  const auto info = ShardStore::checkpoint_info(at(3) / "shard-0-of-2.ckpt");
  EXPECT_EQ(info.rows, 5u) << "only the rows changed since iteration 2's";
  EXPECT_EQ(info.base, std::optional<std::int64_t>(2));
  EXPECT_EQ(ShardStore::checkpoint_info(at(2) / "shard-1-of-2.ckpt").rows, 5u);
  EXPECT_EQ(ShardStore::checkpoint_info(at(1) / "shard-1-of-2.ckpt").rows, 20u);
  EXPECT_FALSE(ShardStore::checkpoint_info(at(1) / "shard-1-of-2.ckpt").base.has_value());
  for (std::int64_t it : {1, 2}) EXPECT_TRUE(fs::exists(at(it) / "manifest.json")) << "keep 1, but 3 needs " << it;
  // Restored from the root into three shards: every row the two had.
  const RestorePlan plan = plan_restore(root());
  ASSERT_EQ(plan.dir, at(3));
  std::vector<ShardStore> three;
  for (std::uint32_t i = 0; i < 3; ++i) {
    three.emplace_back(config(i, 3));
    EXPECT_EQ(three[i].load(plan.files), 3);
  }
  for (Key k = 0; k < 400; ++k) {
    for (int j = 0; j < 8; ++j) ASSERT_EQ(three[k % 3].row(k)[j], s[k % 2].row(k)[j]) << "key " << k;
  }
  // Without its base, an incremental checkpoint is refused by name, and passed over.
  const fs::path lone = dir_ / "lone";
  fs::create_directories(checkpoint_dir(lone, 3));
  fs::copy(at(3), checkpoint_dir(lone, 3), fs::copy_options::recursive);
  fs::create_directories(checkpoint_dir(lone, 2));
  fs::copy(at(2) / "shard-0-of-2.ckpt", checkpoint_dir(lone, 2));
  try {
    verify_checkpoint_file(checkpoint_dir(lone, 3) / "shard-0-of-2.ckpt");
    ADD_FAILURE() << "a chain without its whole base verified";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("iter-000000001/shard-0-of-2.ckpt is missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_restore(lone), DataError);
  // A whole checkpoint at 4: the chain behind it goes (keep 1).
  train_keys(4, 0, 4);
  save_all(4, std::nullopt);
  for (std::int64_t it : {1, 2, 3}) EXPECT_FALSE(fs::exists(at(it))) << it;
  EXPECT_EQ(ShardStore::checkpoint_info(at(4) / "shard-0-of-2.ckpt").rows, 200u) << "every row (the comparison above read them all)";
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
  EXPECT_NE(plan.skipped[0].find("shard-0-of-2.ckpt: " + std::to_string(bytes.size() - 100) + " bytes, its manifest says"),
            std::string::npos)
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

// Flips `n` bytes in the middle of `file`, keeping its size: the manifest's size check
// passes, the checksum does not.
void flip_bytes(const fs::path& file, std::size_t n = 8) {
  std::string bytes = read_file(file);
  for (std::size_t i = 0; i < n; ++i) bytes[bytes.size() / 2 + i] = static_cast<char>(~bytes[bytes.size() / 2 + i]);
  write_file_atomic(file, bytes);
}

// A newest checkpoint whose shard file has flipped bytes (same size) is passed over from
// the root for the newest one that verifies, naming the file and "checksum mismatch";
// named directly it is refused; with nothing that verifies, every checkpoint is named.
TEST_F(CheckpointDirs, ACorruptNewestCheckpointIsPassedOverFromTheRoot) {
  for (std::int64_t it : {9, 19}) {
    checkpoint(0, it);
    checkpoint(1, it);
  }
  const fs::path victim = at(19) / "shard-1-of-2.ckpt";
  const auto size = fs::file_size(victim);
  flip_bytes(victim);
  ASSERT_EQ(fs::file_size(victim), size);
  for (const std::optional<RestoringShard> own : {std::optional<RestoringShard>{}, std::optional<RestoringShard>{RestoringShard{0, 2}}}) {
    const RestorePlan plan = plan_restore(root(), own);
    EXPECT_EQ(plan.dir, at(9));
    EXPECT_TRUE(plan.verified);
    ASSERT_EQ(plan.skipped.size(), 1u);
    EXPECT_NE(plan.skipped[0].find(at(19).string() + ": " + victim.string() + ": checksum mismatch (corrupt checkpoint)"),
              std::string::npos)
        << plan.skipped[0];
    ShardStore restored(config(0, 2));
    EXPECT_EQ(restored.load(plan.files, plan.own_file_only), 9);
  }
  EXPECT_THROW(verify_checkpoint_file(victim), DataError);
  EXPECT_NO_THROW(verify_checkpoint_file(at(19) / "shard-0-of-2.ckpt"));
  // Named directly, that checkpoint is what is loaded, and the load refuses it.
  const RestorePlan named = plan_restore(at(19));
  EXPECT_EQ(named.dir, at(19));
  EXPECT_FALSE(named.verified);
  try {
    ShardStore(config(0, 2)).load(named.files);
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(victim.string() + ": checksum mismatch"), std::string::npos) << e.what();
  }
  // Every checkpoint corrupt: refused, naming each file and why.
  flip_bytes(at(9) / "shard-0-of-2.ckpt");
  try {
    plan_restore(root());
    ADD_FAILURE();
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no whole checkpoint that verifies"), std::string::npos) << what;
    EXPECT_NE(what.find(victim.string() + ": checksum mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find((at(9) / "shard-0-of-2.ckpt").string() + ": checksum mismatch"), std::string::npos) << what;
  }
}

// The same through the daemon: `ember-ps --restore ROOT` restores iteration 9, logging
// the one line that passes over 19; `ember-ps --verify-checkpoint` (what the launcher's
// --resume asks) prints the directory that verifies, and refuses one named that does not.
TEST_F(CheckpointDirs, TheDaemonRestoresTheNewestCheckpointThatVerifies) {
  for (std::int64_t it : {9, 19}) {
    checkpoint(0, it);
    checkpoint(1, it);
  }
  const fs::path victim = at(19) / "shard-0-of-2.ckpt";
  flip_bytes(victim);
  std::string out;
  EXPECT_EQ(test::run_command(test::bin("ember-ps") + " --verify-checkpoint " + root().string() + " 2>&1", out), 0) << out;
  EXPECT_NE(out.find("--verify-checkpoint: passing over " + at(19).string() + ": " + victim.string() + ": checksum mismatch"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(at(9).string() + "\n"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(test::bin("ember-ps") + " --verify-checkpoint " + at(9).string() + " 2>/dev/null", out), 0);
  EXPECT_EQ(out, at(9).string() + "\n");
  EXPECT_EQ(test::run_command(test::bin("ember-ps") + " --verify-checkpoint " + at(19).string() + " 2>&1", out), 3) << out;
  EXPECT_NE(out.find("ember-ps: error: " + victim.string() + ": checksum mismatch (corrupt checkpoint)"), std::string::npos) << out;

  const fs::path port_file = dir_ / "port";
  test::Process ps({test::bin("ember-ps"),
                    "--shard",
                    "0",
                    "--shards",
                    "2",
                    "--num-keys",
                    "400",
                    "--dim",
                    "4",
                    "--optimizer",
                    "adagrad",
                    "--token",
                    "t",
                    "--listen",
                    "127.0.0.1:0",
                    "--port-file",
                    port_file.string(),
                    "--stats-interval",
                    "0",
                    "--restore",
                    root().string()},
                   dir_ / "ps.log");
  ASSERT_FALSE(test::wait_for_file(port_file, std::chrono::seconds(20)).empty()) << ps.log_tail(20);
  ps.signal(SIGTERM);
  EXPECT_EQ(ps.wait(std::chrono::seconds(10)), 0);
  const std::string log = read_file(dir_ / "ps.log");
  EXPECT_NE(log.find("--restore: passing over " + at(19).string() + ": " + victim.string() + ": checksum mismatch (corrupt checkpoint)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("checkpoint file(s) in " + at(9).string() + " (listed by its manifest), iteration 9"), std::string::npos) << log;
  // Named directly: refused (exit 3, a DataError), naming the file.
  const int rc = test::run_command("timeout 20 " + test::bin("ember-ps") + " --num-keys 400 --dim 4 --optimizer adagrad --shards 2 " +
                                       "--token t --stats-interval 0 --restore " + at(19).string() + " 2>&1",
                                   out);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find(victim.string() + ": checksum mismatch (corrupt checkpoint)"), std::string::npos) << out;
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

// Shards on hosts that share no filesystem: a root each, and a board standing in for the
// control plane's on which each says it wrote its file.
// Pruning counts checkpoints whole for the job: the shards' files and every worker's
// dense state. Checkpoints whose workers' part failed (a full disk) are not counted, so
// the last one the job can resume from is never deleted.
TEST_F(CheckpointDirs, PruningKeepsTheLastCheckpointWholeForTheJob) {
  std::map<std::string, std::string> board;
  std::set<std::int64_t> workers_done, whole_seen;
  auto key = [](std::int64_t it, std::uint32_t shard) { return std::to_string(it) + "/" + std::to_string(shard); };
  auto write = [&](std::uint32_t s, std::int64_t it) {
    train(s, it);
    CheckpointDir d(root(), s, 2, 1);  // keep 1
    CheckpointPeers p;
    p.here = "h";
    p.announce = [&](std::int64_t i, std::uint32_t shard, const std::string& record) { board[key(i, shard)] = record; };
    p.record_of = [&](std::int64_t i, std::uint32_t shard) -> std::optional<std::string> {
      const auto f = board.find(key(i, shard));
      if (f == board.end()) return std::nullopt;
      return f->second;
    };
    p.workers_done = [&](std::int64_t i) { return workers_done.count(i) > 0; };
    p.on_whole = [&](std::int64_t i) { whole_seen.insert(i); };
    d.set_peers(p);
    stores_[s].save(d.file_for(it), it);
    return d.finish(it);
  };
  workers_done.insert(1);
  for (std::int64_t it : {1, 3, 5}) {  // the workers' dense files of 3 and 5 failed
    write(0, it);
    EXPECT_TRUE(write(1, it));
  }
  EXPECT_EQ(whole_seen, (std::set<std::int64_t>{1, 3, 5}));
  for (std::int64_t it : {1, 3, 5}) EXPECT_TRUE(fs::exists(at(it) / "manifest.json")) << it << ": 1 is the last whole for the job";
  workers_done.insert(7);
  write(0, 7);
  write(1, 7);
  EXPECT_TRUE(fs::exists(at(7) / "manifest.json"));
  for (std::int64_t it : {1, 3, 5}) EXPECT_FALSE(fs::exists(at(it))) << it << ": older than 7, whole for the job";
}

TEST_F(CheckpointDirs, ShardsWithoutASharedFilesystemLearnFromEachOtherWhenACheckpointIsWhole) {
  const fs::path roots[2] = {dir_ / "host0", dir_ / "host1"};
  std::map<std::string, std::string> board;
  auto key = [](std::int64_t it, std::uint32_t shard) { return std::to_string(it) + "/" + std::to_string(shard); };
  auto dir_of = [&](std::uint32_t s, bool with_peers) {
    CheckpointDir d(roots[s], s, 2, 1);  // keep 1
    if (!with_peers) return d;
    CheckpointPeers p;
    p.here = "10.0.0." + std::to_string(s) + ":7000";
    p.announce = [&](std::int64_t it, std::uint32_t shard, const std::string& record) { board[key(it, shard)] = record; };
    p.record_of = [&](std::int64_t it, std::uint32_t shard) -> std::optional<std::string> {
      const auto f = board.find(key(it, shard));
      if (f == board.end()) return std::nullopt;
      return f->second;
    };
    d.set_peers(p);
    return d;
  };
  auto write = [&](std::uint32_t s, std::int64_t it, bool with_peers) {
    train(s, it);
    const CheckpointDir d = dir_of(s, with_peers);
    stores_[s].save(d.file_for(it), it);
    return d.finish(it);
  };
  // Files alone: neither shard ever sees a whole checkpoint, so nothing is pruned.
  for (std::int64_t it : {1, 3}) {
    EXPECT_FALSE(write(0, it, false));
    EXPECT_FALSE(write(1, it, false));
  }
  for (const fs::path& r : roots) EXPECT_TRUE(fs::exists(checkpoint_dir(r, 1)) && fs::exists(checkpoint_dir(r, 3)));
  // With each other's word: the shard that writes last completes it on its host...
  EXPECT_FALSE(write(0, 5, true));
  EXPECT_TRUE(fs::exists(checkpoint_dir(roots[0], 1)));  // nothing whole yet: all kept
  EXPECT_TRUE(write(1, 5, true));
  const std::string manifest = read_file(checkpoint_dir(roots[1], 5) / "manifest.json");
  EXPECT_NE(manifest.find("\"at\": \"10.0.0.0:7000\""), std::string::npos) << manifest;
  EXPECT_NE(manifest.find("\"name\": \"shard-0-of-2.ckpt\""), std::string::npos) << manifest;
  EXPECT_FALSE(fs::exists(checkpoint_dir(roots[1], 1)));  // keep 1: older ones go
  EXPECT_FALSE(fs::exists(checkpoint_dir(roots[1], 3)));
  // ...and the other learns it when it next settles (the daemon does on its clock).
  EXPECT_TRUE(dir_of(0, true).settle(5));
  EXPECT_TRUE(fs::exists(checkpoint_dir(roots[0], 5) / "manifest.json"));
  EXPECT_FALSE(fs::exists(checkpoint_dir(roots[0], 1)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(roots[0], 3)));
  // The next one: until shard 1 has written 7, shard 0 keeps 5.
  EXPECT_FALSE(write(0, 7, true));
  EXPECT_FALSE(dir_of(0, true).settle(7));
  EXPECT_TRUE(fs::exists(checkpoint_dir(roots[0], 5) / "manifest.json"));
  EXPECT_TRUE(write(1, 7, true));
  EXPECT_TRUE(dir_of(0, true).settle(7));
  for (const fs::path& r : roots) {
    EXPECT_FALSE(fs::exists(checkpoint_dir(r, 5))) << r;
    EXPECT_TRUE(fs::exists(checkpoint_dir(r, 7) / "manifest.json")) << r;
  }
  // A restore on host 0 names where the missing file is...
  try {
    plan_restore(roots[0]);
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("shard-1-of-2.ckpt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("written by the shard at 10.0.0.1:7000: copy it here"), std::string::npos) << e.what();
  }
  // Restarted with the same shards, though, each restores from its own file: the
  // manifest says the other shard wrote its own.
  const RestorePlan mine = plan_restore(roots[0], RestoringShard{0, 2});
  EXPECT_TRUE(mine.own_file_only);
  ASSERT_EQ(mine.files.size(), 1u);
  EXPECT_EQ(mine.files[0], checkpoint_dir(roots[0], 7) / "shard-0-of-2.ckpt");
  ShardStore again(config(0, 2));
  EXPECT_EQ(again.load(mine.files, true), 7);
  for (Key k = 0; k < 40; k += 2) {
    for (int j = 0; j < 8; ++j) ASSERT_EQ(again.row(k)[j], stores_[0].row(k)[j]) << "key " << k;
  }
  ShardStore other(config(1, 2));
  EXPECT_THROW(other.load(mine.files, true), DataError);                  // shard 0's file
  EXPECT_THROW(plan_restore(roots[0], RestoringShard{0, 3}), DataError);  // three shards need every file
  // ...and, once it is copied there, loads checkpoint 7 whole.
  fs::copy_file(checkpoint_dir(roots[1], 7) / "shard-1-of-2.ckpt", checkpoint_dir(roots[0], 7) / "shard-1-of-2.ckpt");
  const RestorePlan plan = plan_restore(roots[0]);
  EXPECT_TRUE(plan.manifest);
  ShardStore one(config(0, 1));
  EXPECT_EQ(one.load(plan.files), 7);
  for (Key k = 0; k < 40; ++k) {
    for (int j = 0; j < 8; ++j) ASSERT_EQ(one.row(k)[j], stores_[k % 2].row(k)[j]) << "key " << k;
  }
}

}  // namespace
}  // namespace ember::ps
