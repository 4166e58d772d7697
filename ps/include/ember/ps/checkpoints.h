// Where a job's checkpoints live: one directory per checkpoint under a root, each shard's
// file in it, and a manifest once every shard's file is there:
//
//   ROOT/iter-000000009/shard-0-of-2.ckpt
//   ROOT/iter-000000009/shard-1-of-2.ckpt
//   ROOT/iter-000000009/manifest.json    {"format", "iteration", "shards", "files": [{"name", "bytes", "at"?}]}
//
// (iter-initial: a checkpoint taken before any commit.) Each shard writes its own file
// (ShardStore::save: temp + fsync + rename); the shard that then finds every shard's file
// of that checkpoint writes the manifest, so a checkpoint with a manifest is whole.
//
// Shards on hosts that do not share the root's filesystem never see each other's files:
// with CheckpointPeers each also tells the others that its file is written (ember-ps does
// it through the job's control plane), and once every shard has, each writes the manifest
// in its own root, listing every shard's file with its size and where it was written. So
// a manifest still means "whole", and --keep-checkpoints prunes on every host. A restore
// needs every listed file in one directory (copy them there); it names where a missing
// one is.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ember::ps {

// shard-S-of-N.ckpt
std::string checkpoint_file_name(std::uint32_t shard, std::uint32_t shards);

// How a shard learns what the other shards of its job have written (see above). Neither
// call may wait.
struct CheckpointPeers {
  std::string here;  // where this shard writes (its data address), for the manifests
  // Tells the others that `shard`'s file of `iteration` is written: `record` is its
  // manifest entry (JSON: name, bytes, at).
  std::function<void(std::int64_t iteration, std::uint32_t shard, const std::string& record)> announce;
  // `shard`'s record of `iteration`, once it has announced one.
  std::function<std::optional<std::string>(std::int64_t iteration, std::uint32_t shard)> record_of;
  // Optional. Whether the workers' part of `iteration`'s checkpoint is in (job_config.h:
  // dense_states_ok); false while unknown. Pruning then keeps the newest `keep`
  // checkpoints that are whole for the job, not just for the shards.
  std::function<bool(std::int64_t iteration)> workers_done;
  // Optional. Called when this shard finds `iteration`'s checkpoint whole.
  std::function<void(std::int64_t iteration)> on_whole;
};

// One shard's side of a job's checkpoint root.
class CheckpointDir {
 public:
  // Keeps the newest `keep` whole checkpoints (0: all) and any newer than those, and the
  // checkpoints their incremental files add to (ShardStore::save with a base); never the
  // newest whole one.
  CheckpointDir(std::filesystem::path root, std::uint32_t shard, std::uint32_t shards, std::size_t keep);

  // From now on, also with the other shards' word (see above); none: files alone.
  void set_peers(std::optional<CheckpointPeers> peers) { peers_ = std::move(peers); }
  bool has_peers() const { return peers_.has_value(); }

  const std::filesystem::path& root() const { return root_; }
  // The name of this shard's file in every checkpoint directory.
  std::string file_name() const;
  // This shard's file of the checkpoint of `iteration` (-1: before any commit); creates
  // its directory.
  std::filesystem::path file_for(std::int64_t iteration) const;
  // Once this shard's file of `iteration` is written: the manifest, if every shard's file
  // is there now (returns whether the checkpoint is whole), then pruning of checkpoints
  // older than the newest `keep` whole ones: the shard that completed one removes them
  // whole; another removes its own files of them (their manifests first, so that none
  // looks whole once a file is gone), and their directories once empty.
  // With peers, announces this shard's file first, and counts a checkpoint every shard
  // has announced as whole (writing its manifest from their records).
  bool finish(std::int64_t iteration) const;
  // With peers: writes the manifest of each of this shard's checkpoints that every shard
  // has announced since, then prunes. Returns whether `iteration`'s checkpoint is whole.
  // (The daemon calls it on its clock: the last shard's word comes after this one's.)
  bool settle(std::int64_t iteration) const;
  // Whether pruning waits for the workers' word on some checkpoint; settle_pruning()
  // prunes again once it has come (at most once a second).
  bool pruning_pending() const { return recheck_; }
  void settle_pruning() const;

 private:
  // Manifests from the peers' records; returns whether it wrote any.
  bool manifests_from_peers() const;
  // Removes what is older than the newest `keep` whole checkpoints (see finish).
  void prune(bool completed_here) const;
  // With workers_done: whole for the job (see CheckpointPeers).
  bool whole_for_job(std::int64_t iteration, const std::filesystem::path& dir) const;

  std::filesystem::path root_;
  std::uint32_t shard_, shards_;
  std::size_t keep_;
  std::optional<CheckpointPeers> peers_;
  // Pruning waits for the workers' word on a checkpoint the shards completed: settle()
  // prunes again (at most once a second) until it has come.
  mutable bool recheck_ = false;
  mutable std::chrono::steady_clock::time_point last_recheck_{};
};

// The iteration an iter-* directory's name gives (-1: iter-initial); none for other names.
std::optional<std::int64_t> iteration_of(const std::filesystem::path& dir);
// The checkpoint directories under `root`, newest first (none if it cannot be read).
std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoints_under(const std::filesystem::path& root);

// The directory of the checkpoint of `iteration` under `root`.
std::filesystem::path checkpoint_dir(const std::filesystem::path& root, std::int64_t iteration);

// Writes `dir`/manifest.json (atomically) if the *.ckpt files there are one whole
// checkpoint (ShardStore::check_checkpoint_set); returns whether it did.
bool write_manifest_if_whole(const std::filesystem::path& dir);

// Reads one checkpoint file in full and checks it as ShardStore::load does: an Ember
// checkpoint whose size fits its rows and whose checksum holds. DataError naming the file
// otherwise ("FILE: checksum mismatch (corrupt checkpoint)" for flipped bytes).
// (shard_store_io.cc, beside the format.)
void verify_checkpoint_file(const std::filesystem::path& file);

// The checksum a checkpoint file stores (its last 8 bytes), unchecked: what names that
// file's content (serving deltas follow it). IoError/DataError naming the file.
std::uint64_t checkpoint_checksum(const std::filesystem::path& file);

// What `--restore DIR` loads. DIR may be one checkpoint (its manifest's files, checked
// against the sizes it lists; or, without a manifest, its *.ckpt files, as in the flat
// layout of earlier versions) or a root of checkpoints: then the newest one that is whole,
// whose files have their listed sizes and whose files to load verify
// (verify_checkpoint_file: a corrupt newest checkpoint is passed over for an older
// one); those passed over are named in `skipped`, with why. Throws DataError when there
// is nothing to load (naming every checkpoint and why), or when DIR holds both *.ckpt
// files and checkpoint directories (which is meant?). One checkpoint named is taken as
// it is: ShardStore::load checks its files in full (checksums, one checkpoint, every
// shard) and refuses a corrupt one.
//
// Given the restoring shard (`own`), a whole checkpoint of the same shard count whose
// other files are not there (written on other hosts) restores from this shard's own
// file alone: it holds every row the shard owns, and the manifest says the others wrote
// theirs. So each host of a job restarted with the same shards restores from its own
// directory.
struct RestorePlan {
  std::filesystem::path dir;  // the checkpoint chosen
  std::vector<std::filesystem::path> files;
  bool manifest = false;             // whether a manifest listed them
  bool own_file_only = false;        // files is this shard's own file (see above)
  std::vector<std::string> skipped;  // "DIR: why" of newer checkpoints passed over
  bool verified = false;             // whether `files` were read in full and verified (a root's pick)
};
struct RestoringShard {
  std::uint32_t shard = 0, shards = 1;
};
RestorePlan plan_restore(const std::filesystem::path& dir, std::optional<RestoringShard> own = std::nullopt);

}  // namespace ember::ps
