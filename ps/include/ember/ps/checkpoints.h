// Where a job's checkpoints live: one directory per checkpoint under a root, each shard's
// file in it, and a manifest once every shard's file is there:
//
//   ROOT/iter-000000009/shard-0-of-2.ckpt
//   ROOT/iter-000000009/shard-1-of-2.ckpt
//   ROOT/iter-000000009/manifest.json    {"format", "iteration", "shards", "files": [{"name", "bytes"}]}
//
// (iter-initial: a checkpoint taken before any commit.) Each shard writes its own file
// (ShardStore::save: temp + fsync + rename); the shard that then finds every shard's file
// of that checkpoint writes the manifest, so a checkpoint with a manifest is whole. That
// needs the shards to share the root's filesystem, as restoring into another shard count
// does; without it no manifest appears, and a restore checks the files themselves.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ember::ps {

// shard-S-of-N.ckpt
std::string checkpoint_file_name(std::uint32_t shard, std::uint32_t shards);

// One shard's side of a job's checkpoint root.
class CheckpointDir {
 public:
  // Keeps the newest `keep` whole checkpoints (0: all) and any newer than those.
  CheckpointDir(std::filesystem::path root, std::uint32_t shard, std::uint32_t shards, std::size_t keep);

  const std::filesystem::path& root() const { return root_; }
  // This shard's file of the checkpoint of `iteration` (-1: before any commit); creates
  // its directory.
  std::filesystem::path file_for(std::int64_t iteration) const;
  // Once this shard's file of `iteration` is written: the manifest, if every shard's file
  // is there now (returns whether the checkpoint is whole), then pruning of checkpoints
  // older than the newest `keep` whole ones: the shard that completed one removes them
  // whole; another removes its own files of them (their manifests first, so that none
  // looks whole once a file is gone), and their directories once empty.
  bool finish(std::int64_t iteration) const;

 private:
  std::filesystem::path root_;
  std::uint32_t shard_, shards_;
  std::size_t keep_;
};

// The directory of the checkpoint of `iteration` under `root`.
std::filesystem::path checkpoint_dir(const std::filesystem::path& root, std::int64_t iteration);

// Writes `dir`/manifest.json (atomically) if the *.ckpt files there are one whole
// checkpoint (ShardStore::check_checkpoint_set); returns whether it did.
bool write_manifest_if_whole(const std::filesystem::path& dir);

// What `--restore DIR` loads. DIR may be one checkpoint (its manifest's files, checked
// against the sizes it lists; or, without a manifest, its *.ckpt files, as in the flat
// layout of earlier versions) or a root of checkpoints: then the newest one that is whole
// and whose files have their listed sizes; those passed over are named in `skipped`, with
// why. Throws DataError when there is nothing to load, or when DIR holds both *.ckpt
// files and checkpoint directories (which is meant?). ShardStore::load checks the files
// in full (checksums, one checkpoint, every shard).
struct RestorePlan {
  std::filesystem::path dir;  // the checkpoint chosen
  std::vector<std::filesystem::path> files;
  bool manifest = false;             // whether a manifest listed them
  std::vector<std::string> skipped;  // "DIR: why" of newer checkpoints passed over
};
RestorePlan plan_restore(const std::filesystem::path& dir);

}  // namespace ember::ps
