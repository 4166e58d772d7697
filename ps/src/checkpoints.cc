#include "ember/ps/checkpoints.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/ps/serving_delta.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr int kManifestFormat = 1;

std::vector<fs::path> ckpt_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".ckpt") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The files `dir`'s manifest lists, each there with the size it lists; DataError naming
// the file otherwise. With `own` (see RestorePlan), only the restoring shard's own file
// when the others are not there and the shard counts agree (`own_only` says so).
std::vector<fs::path> files_of_manifest(const fs::path& dir, std::optional<RestoringShard> own = std::nullopt, bool* own_only = nullptr) {
  const fs::path path = dir / kManifest;
  std::vector<fs::path> files;
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file(path));
    if (j.at("format").get<int>() != kManifestFormat) throw DataError(path.string() + ": manifest format " + j.at("format").dump());
    std::optional<DataError> missing;  // the first listed file not there
    fs::path own_file;
    const std::string own_name = own ? checkpoint_file_name(own->shard, own->shards) : std::string();
    for (const auto& f : j.at("files")) {
      const std::string name = f.at("name").get<std::string>();
      const std::uint64_t bytes = f.at("bytes").get<std::uint64_t>();
      if (name.empty() || name.find('/') != std::string::npos) throw DataError(path.string() + ": file name '" + name + "'");
      const fs::path file = dir / name;
      std::error_code ec;
      const std::uint64_t size = fs::file_size(file, ec);
      if (ec) {
        // Written on another host (shards without a shared filesystem): say where.
        const std::string at = f.value("at", std::string());
        if (!missing) {
          missing = DataError(path.string() + " lists " + name + ", which cannot be read (" + ec.message() + ")" +
                              (at.empty() ? "" : "; it was written by the shard at " + at + ": copy it here"));
        }
        continue;
      }
      if (size != bytes) {
        throw DataError(file.string() + ": " + std::to_string(size) + " bytes, its manifest says " + std::to_string(bytes) +
                        " (truncated or replaced)");
      }
      if (name == own_name) own_file = file;
      files.push_back(file);
    }
    if (missing) {
      if (!own || own_file.empty() || j.at("shards").get<std::uint32_t>() != own->shards) throw *missing;
      if (own_only != nullptr) *own_only = true;
      return {own_file};
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path.string() + ": " + e.what());
  }
  if (files.empty()) throw DataError(path.string() + ": lists no files");
  return files;
}

void write_manifest(const fs::path& dir, std::int64_t iteration, std::size_t shards, const nlohmann::json& files) {
  const nlohmann::json j = {{"format", kManifestFormat}, {"iteration", iteration}, {"shards", shards}, {"files", files}};
  write_file_atomic(dir / kManifest, j.dump(1) + "\n");
}

}  // namespace

std::optional<std::int64_t> iteration_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name == "iter-initial") return -1;
  if (name.size() <= 5 || name.size() > 23 || name.rfind("iter-", 0) != 0) return std::nullopt;
  std::int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<std::pair<std::int64_t, fs::path>> checkpoints_under(const fs::path& root) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    if (const auto iteration = iteration_of(it->path())) out.emplace_back(*iteration, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string checkpoint_file_name(std::uint32_t shard, std::uint32_t shards) {
  return "shard-" + std::to_string(shard) + "-of-" + std::to_string(shards) + ".ckpt";
}

fs::path checkpoint_dir(const fs::path& root, std::int64_t iteration) {
  if (iteration < 0) return root / "iter-initial";
  char name[32];
  std::snprintf(name, sizeof name, "iter-%09lld", static_cast<long long>(iteration));  // sorts by name up to 10^9
  return root / name;
}

CheckpointDir::CheckpointDir(fs::path root, std::uint32_t shard, std::uint32_t shards, std::size_t keep)
    : root_(std::move(root)), shard_(shard), shards_(shards), keep_(keep) {}

std::string CheckpointDir::file_name() const { return checkpoint_file_name(shard_, shards_); }

fs::path CheckpointDir::file_for(std::int64_t iteration) const {
  const fs::path dir = checkpoint_dir(root_, iteration);
  fs::create_directories(dir);
  return dir / file_name();
}

bool write_manifest_if_whole(const fs::path& dir) {
  const std::vector<fs::path> files = ckpt_files(dir);
  std::int64_t iteration = 0;
  try {
    iteration = ShardStore::check_checkpoint_set(files);
  } catch (const DataError&) {
    return false;  // a shard's file is not there yet (or files of another checkpoint are)
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : files) list.push_back({{"name", f.filename().string()}, {"bytes", fs::file_size(f)}});
  write_manifest(dir, iteration, files.size(), list);
  return true;
}

bool CheckpointDir::finish(std::int64_t iteration) const {
  const fs::path dir = checkpoint_dir(root_, iteration);
  const bool whole = write_manifest_if_whole(dir);
  if (peers_) {
    const fs::path mine = dir / checkpoint_file_name(shard_, shards_);
    const nlohmann::json record = {{"name", mine.filename().string()}, {"bytes", fs::file_size(mine)}, {"at", peers_->here}};
    peers_->announce(iteration, shard_, record.dump());
    manifests_from_peers();
    if (whole && peers_->on_whole) peers_->on_whole(iteration);
  }
  prune(whole);
  return fs::exists(dir / kManifest);
}

bool CheckpointDir::settle(std::int64_t iteration) const {
  if (peers_) {
    if (manifests_from_peers())
      prune(false);
    else
      settle_pruning();
  }
  return fs::exists(checkpoint_dir(root_, iteration) / kManifest);
}

void CheckpointDir::settle_pruning() const {
  const auto now = std::chrono::steady_clock::now();
  if (!recheck_ || now - last_recheck_ < std::chrono::seconds(1)) return;
  last_recheck_ = now;
  prune(false);
}

bool CheckpointDir::whole_for_job(std::int64_t iteration, const fs::path& dir) const {
  if (!fs::exists(dir / kManifest)) return false;
  if (!peers_ || !peers_->workers_done) return true;
  if (peers_->workers_done(iteration)) return true;
  recheck_ = true;  // the workers' word may still come
  return false;
}

bool CheckpointDir::manifests_from_peers() const {
  bool wrote = false;
  const std::string mine = checkpoint_file_name(shard_, shards_);
  for (const auto& [iteration, dir] : checkpoints_under(root_)) {
    // This shard's checkpoints only (not another layout's), not known whole yet.
    if (fs::exists(dir / kManifest) || !fs::exists(dir / mine)) continue;
    nlohmann::json list = nlohmann::json::array();
    for (std::uint32_t s = 0; s < shards_; ++s) {
      const std::optional<std::string> record = peers_->record_of(iteration, s);
      if (!record) break;
      try {
        const nlohmann::json r = nlohmann::json::parse(*record);
        list.push_back({{"name", r.at("name").get<std::string>()},
                        {"bytes", r.at("bytes").get<std::uint64_t>()},
                        {"at", r.value("at", std::string())}});
      } catch (const nlohmann::json::exception& e) {
        throw DataError("shard " + std::to_string(s) + "'s record of checkpoint " + std::to_string(iteration) + ": " + e.what());
      }
    }
    if (list.size() < shards_) continue;
    write_manifest(dir, iteration, shards_, list);
    if (peers_->on_whole) peers_->on_whole(iteration);
    wrote = true;
  }
  return wrote;
}

void CheckpointDir::prune(bool completed_here) const {
  if (keep_ == 0) return;
  const std::string mine = checkpoint_file_name(shard_, shards_), my_delta = delta_file_name(shard_, shards_);
  std::size_t newer_whole = 0;
  recheck_ = false;
  // A checkpoint kept keeps those its incremental files add to (their bases, older).
  std::set<std::int64_t> bases;
  const auto keep_bases_of = [&](const fs::path& dir) {
    std::error_code ec;
    for (fs::directory_iterator e(dir, ec), end; !ec && e != end; e.increment(ec)) {
      if (e->path().extension() != ".ckpt") continue;
      try {
        if (const auto base = ShardStore::checkpoint_info(e->path()).base) bases.insert(*base);
      } catch (const std::exception&) {
        // not a checkpoint (or half written): it needs nothing kept
      }
    }
  };
  for (const auto& [it, dir] : checkpoints_under(root_)) {
    if (newer_whole < keep_) {
      newer_whole += whole_for_job(it, dir);
      keep_bases_of(dir);
      continue;
    }
    if (bases.contains(it)) {
      keep_bases_of(dir);
      continue;
    }
    // Older than the newest `keep` whole checkpoints. The shard that just completed one
    // removes them whole: every shard has written a newer checkpoint, and shards write
    // theirs in increasing iterations. Another removes its own part (the manifest first),
    // and the directory goes with the last shard's.
    std::error_code ec;
    if (completed_here) {
      fs::remove_all(dir, ec);
      continue;
    }
    fs::remove(dir / kManifest, ec);
    for (fs::directory_iterator e(dir, ec), end; !ec && e != end; e.increment(ec)) {
      const std::string name = e->path().filename().string();
      if (name.rfind(mine, 0) == 0 || name.rfind(my_delta, 0) == 0)
        fs::remove(e->path(), ec);  // the file, a temp file a crash left (or a .prev earlier versions kept)
    }
    fs::remove(dir, ec);  // only once empty
  }
}

RestorePlan plan_restore(const fs::path& dir, std::optional<RestoringShard> own) {
  if (!fs::is_directory(dir)) throw DataError("--restore " + dir.string() + ": not a directory");
  RestorePlan plan;
  plan.dir = dir;
  // One checkpoint: its manifest's files, or its *.ckpt files.
  if (fs::exists(dir / kManifest)) {
    plan.files = files_of_manifest(dir, own, &plan.own_file_only);
    plan.manifest = true;
    return plan;
  }
  plan.files = ckpt_files(dir);
  const auto under = checkpoints_under(dir);
  if (!plan.files.empty() && !under.empty()) {
    // Files of the flat layout beside checkpoint directories (a root used before and
    // after an upgrade): which is meant is not for the restore to guess.
    throw DataError("--restore " + dir.string() + " holds both *.ckpt files and iter-* checkpoint directories: give one checkpoint's " +
                    "directory, or move the *.ckpt files away");
  }
  if (!plan.files.empty()) return plan;
  // A root of checkpoints: the newest whole one.
  for (const auto& [iteration, sub] : under) {
    try {
      plan.manifest = fs::exists(sub / kManifest);
      plan.files = plan.manifest ? files_of_manifest(sub, own, &plan.own_file_only) : ckpt_files(sub);
      if (!plan.manifest) ShardStore::check_checkpoint_set(plan.files);
      // Whole is not enough: a file with flipped bytes has its listed size. Every file
      // this shard would load is read and its checksum checked, so a corrupt newest
      // checkpoint is passed over here rather than refused by the load.
      for (const fs::path& f : plan.files) verify_checkpoint_file(f);
      plan.verified = true;
      plan.dir = sub;
      return plan;
    } catch (const DataError& e) {
      plan.skipped.push_back(sub.string() + ": " + e.what());
    }
  }
  std::string why = " (no manifest.json, *.ckpt files or iter-* checkpoint directories)";
  if (!plan.skipped.empty()) {
    why = ": ";
    for (std::size_t i = 0; i < plan.skipped.size(); ++i) why += (i ? "; " : "") + plan.skipped[i];
  }
  throw DataError("--restore " + dir.string() + ": no whole checkpoint that verifies" + why);
}

}  // namespace ember::ps
