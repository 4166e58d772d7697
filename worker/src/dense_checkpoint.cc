#include "dense_checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "ember/common/error.h"
#include "ember/common/fs.h"

namespace ember::worker {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The start of worker `rank`'s dense checkpoint files' names (the iteration follows).
std::string file_prefix(std::uint32_t rank) { return "worker-" + std::to_string(rank) + "-iter-"; }

// The first line of an error (LibTorch's carry a backtrace).
std::string first_line(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string s = c != nullptr ? c->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

}  // namespace

fs::path dense_checkpoint_file(const fs::path& dir, std::uint32_t rank, std::uint64_t iteration) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%09llu", static_cast<unsigned long long>(iteration));
  return dir / (file_prefix(rank) + digits + ".pt");
}

json DenseCheckpoints::meta(std::uint64_t iteration) const {
  return {{"iteration", iteration},
          {"model", c_.model.kind},
          {"dense_optimizer", c_.dense_optimizer},
          {"dense_lr", c_.dense_lr},
          {"seed", c_.seed},
          {"workers", c_.workers},
          {"batch_per_worker", c_.batch_per_worker},
          {"shuffle", c_.shuffle},
          {"num_keys", num_keys_},
          {"dim", dim_}};
}

bool DenseCheckpoints::save(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer) const {
  torch::serialize::OutputArchive root, model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  root.write("model", model_archive);
  root.write("optimizer", optimizer_archive);
  root.write("meta", c10::IValue(meta(iteration).dump()));
  root.write("model_config", c10::IValue(model_config_json(c_.model)));
  root.write("ps_seed", c10::IValue(static_cast<std::int64_t>(ps_seed_)));
  std::ostringstream bytes;
  root.save_to(bytes);
  const fs::path file = dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration);
  try {
    fs::create_directories(c_.checkpoint_dir);
    write_file_atomic(file, bytes.str());
  } catch (const std::exception& e) {
    spdlog::error("worker {}: dense checkpoint of iteration {} not written: {}", rank_, iteration, e.what());
    return false;
  }
  prune();
  return true;
}

void DenseCheckpoints::prune() const {
  if (c_.keep_checkpoints == 0) return;
  const std::string prefix = file_prefix(rank_);
  std::vector<fs::path> mine;
  for (const auto& e : fs::directory_iterator(c_.checkpoint_dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.path().extension() == ".pt") mine.push_back(e.path());
  }
  // Newest first (the iteration is zero-padded): past the newest `keep` whole for the job.
  std::sort(mine.rbegin(), mine.rend());
  std::size_t whole = 0;
  for (const fs::path& file : mine) {
    if (whole >= c_.keep_checkpoints) {
      std::error_code ec;
      fs::remove(file, ec);
      continue;
    }
    const std::string digits = file.stem().string().substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    whole += whole_for_job_(std::stoull(digits));
  }
}

void DenseCheckpoints::load(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer, torch::Device device) const {
  fs::path file = dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration);
  if (!fs::exists(file)) {
    // Another worker's copy of the same iteration holds the same state.
    for (std::uint32_t r = 0; r < c_.workers && !fs::exists(file); ++r) file = dense_checkpoint_file(c_.checkpoint_dir, r, iteration);
    if (!fs::exists(file)) {
      throw ConfigError("--resume: the PS restored iteration " + std::to_string(iteration) + " but " + c_.checkpoint_dir +
                        " holds no worker's dense state of it (" +
                        dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration).filename().string() +
                        "); restore the PS from a checkpoint the workers also wrote (ember-worker --checkpoint-dir)");
    }
  }
  torch::serialize::InputArchive root, model_archive, optimizer_archive;
  json found;
  try {
    root.load_from(file.string(), device);
    c10::IValue m;
    root.read("meta", m);
    found = json::parse(m.toStringRef());
    root.read("model", model_archive);
    root.read("optimizer", optimizer_archive);
  } catch (const std::exception& e) {
    throw DataError(file.string() + ": not a readable dense checkpoint: " + first_line(e));
  }
  const json want = meta(iteration);  // named: items() refers to it
  for (const auto& [key, value] : want.items()) {
    if (!found.contains(key) || found[key] != value) {
      throw ConfigError("--resume: " + file.string() + " was written by a job with " + key + " " +
                        (found.contains(key) ? found[key].dump() : "unset") + ", this one has " + value.dump());
    }
  }
  try {
    model.load(model_archive);
    optimizer.load(optimizer_archive);
  } catch (const std::exception& e) {
    throw ConfigError("--resume: " + file.string() + " does not fit this model (" + first_line(e) + ")");
  }
  spdlog::info("worker {}: resuming at iteration {}: dense model and optimizer from {}", rank_, iteration, file.string());
}

DenseState read_dense_state(const fs::path& file) {
  DenseState s;
  torch::serialize::InputArchive root, model_archive;
  try {
    root.load_from(file.string(), torch::kCPU);
    c10::IValue m, config, seed;
    root.read("meta", m);
    s.meta = json::parse(m.toStringRef());
    if (!root.try_read("model_config", config) || !root.try_read("ps_seed", seed)) {
      throw DataError(file.string() +
                      ": written by an older ember-worker, without the model's layers and the PS's seed; export from the "
                      "final model (ember-worker --dump-dir) or a checkpoint of a newer job");
    }
    s.model = parse_model_config(config.toStringRef(), file.string());
    s.ps_seed = static_cast<std::uint64_t>(seed.toInt());
    root.read("model", model_archive);
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(file.string() + ": not a readable dense checkpoint: " + first_line(e));
  }
  s.weights = make_model(s.model);
  try {
    s.weights->load(model_archive);
  } catch (const std::exception& e) {
    throw DataError(file.string() + ": its weights do not fit its model configuration (" + first_line(e) + ")");
  }
  return s;
}

}  // namespace ember::worker
