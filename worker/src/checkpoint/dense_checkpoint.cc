#include "checkpoint/dense_checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
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

std::uint32_t crc32_of(const char* data, std::size_t n) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ static_cast<unsigned char>(data[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Little-endian fields of a zip archive; DataError past its end.
std::uint64_t field(const std::string& b, std::uint64_t at, int bytes, const std::string& name) {
  if (at > b.size() || static_cast<std::uint64_t>(bytes) > b.size() - at)
    throw DataError(name + ": not a readable dense checkpoint (a zip record past its end)");
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(b[at + i]);
  return v;
}

constexpr const char* kDirectoryRecord = "key_directory";
constexpr const char* kStreamRecord = "stream_position";

std::string directory_state_of(torch::serialize::InputArchive& root) {
  at::Tensor t;
  if (!root.try_read(kDirectoryRecord, t)) return {};
  t = t.contiguous();
  return std::string(reinterpret_cast<const char*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(t.numel()));
}

}  // namespace

// A .pt file is a zip archive (LibTorch writes its records stored, each with its CRC-32):
// every record's bytes are checked against the CRC its central directory lists, so a
// flipped byte anywhere in the data (or in the listed CRCs) is found before the file is
// loaded. Python's zipfile.testzip() checks the same (ember_job.py resume_point).
void verify_dense_file(const fs::path& file) {
  const std::string name = file.string();
  const std::string b = read_file(file);
  // The end of central directory record (with a zip64 locator before it when used).
  std::uint64_t eocd = std::string::npos;
  for (std::uint64_t back = 22; back <= std::min<std::uint64_t>(b.size(), 22 + 0xFFFF); ++back) {
    if (field(b, b.size() - back, 4, name) == 0x06054b50) {
      eocd = b.size() - back;
      break;
    }
  }
  if (eocd == std::string::npos) throw DataError(name + ": not a readable dense checkpoint (no zip directory: truncated or corrupt)");
  std::uint64_t entries = field(b, eocd + 10, 2, name), cd = field(b, eocd + 16, 4, name);
  if ((entries == 0xFFFF || cd == 0xFFFFFFFF) && eocd >= 20 && field(b, eocd - 20, 4, name) == 0x07064b50) {
    const std::uint64_t z = field(b, eocd - 12, 8, name);
    if (field(b, z, 4, name) != 0x06064b50) throw DataError(name + ": not a readable dense checkpoint (zip64 directory corrupt)");
    entries = field(b, z + 32, 8, name);
    cd = field(b, z + 48, 8, name);
  }
  std::uint64_t at = cd;
  for (std::uint64_t i = 0; i < entries; ++i) {
    if (field(b, at, 4, name) != 0x02014b50) throw DataError(name + ": not a readable dense checkpoint (zip directory corrupt)");
    const std::uint64_t method = field(b, at + 10, 2, name), crc = field(b, at + 16, 4, name);
    std::uint64_t size = field(b, at + 20, 4, name), raw = field(b, at + 24, 4, name), local = field(b, at + 42, 4, name);
    const std::uint64_t n = field(b, at + 28, 2, name), e = field(b, at + 30, 2, name), c = field(b, at + 32, 2, name);
    const std::string record = b.substr(std::min<std::uint64_t>(at + 46, b.size()), n);
    // Zip64: the fields that overflowed follow in the extra field 0x0001, in this order.
    for (std::uint64_t x = at + 46 + n; x + 4 <= at + 46 + n + e;) {
      const std::uint64_t id = field(b, x, 2, name), len = field(b, x + 2, 2, name);
      if (id == 1) {
        std::uint64_t y = x + 4;
        if (raw == 0xFFFFFFFF) raw = field(b, y, 8, name), y += 8;
        if (size == 0xFFFFFFFF) size = field(b, y, 8, name), y += 8;
        if (local == 0xFFFFFFFF) local = field(b, y, 8, name);
      }
      x += 4 + len;
    }
    if (field(b, local, 4, name) != 0x04034b50) throw DataError(name + ": not a readable dense checkpoint (record " + record + " corrupt)");
    const std::uint64_t data = local + 30 + field(b, local + 26, 2, name) + field(b, local + 28, 2, name);
    if (data + size > b.size()) throw DataError(name + ": not a readable dense checkpoint (record " + record + " past its end)");
    if (method == 0 && (size != raw || crc32_of(b.data() + data, size) != crc)) {
      throw DataError(name + ": checksum mismatch (corrupt dense checkpoint: record " + record + ")");
    }
    at += 46 + n + e + c;
  }
}

fs::path dense_checkpoint_file(const fs::path& dir, std::uint32_t rank, std::uint64_t iteration) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%09llu", static_cast<unsigned long long>(iteration));
  return dir / (file_prefix(rank) + digits + ".pt");
}

json DenseCheckpoints::meta(std::uint64_t iteration) const {
  return {{"iteration", iteration},
          {"model", c_.model.effective_kind()},
          {"dense_optimizer", c_.dense_optimizer},
          {"dense_lr", c_.dense_lr},
          {"seed", c_.seed},
          {"workers", c_.workers},
          {"batch_per_worker", c_.batch_per_worker},
          {"shuffle", c_.shuffle},
          {"num_keys", num_keys_},
          {"dim", dim_}};
}

bool DenseCheckpoints::save(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer,
                            const std::string& directory_state, const std::string& stream_position) const {
  torch::serialize::OutputArchive root, model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  root.write("model", model_archive);
  root.write("optimizer", optimizer_archive);
  root.write("meta", c10::IValue(meta(iteration).dump()));
  root.write("model_config", c10::IValue(model_config_json(c_.model)));
  root.write("ps_seed", c10::IValue(static_cast<std::int64_t>(ps_seed_)));
  if (!directory_state.empty()) {
    // Bytes as a tensor: the archive checks them by their CRC (verify_dense_file).
    auto* p = const_cast<char*>(directory_state.data());
    root.write(kDirectoryRecord, torch::from_blob(p, {static_cast<std::int64_t>(directory_state.size())}, torch::kUInt8).clone());
  }
  if (!stream_position.empty()) root.write(kStreamRecord, c10::IValue(stream_position));
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

DenseRestore DenseCheckpoints::load(std::uint64_t iteration, CtrModel& model, torch::optim::Optimizer& optimizer,
                                    torch::Device device) const {
  // This worker's file, then another worker's of the same iteration (the replicas hold the
  // same state): one missing is skipped, one corrupt (its CRCs fail, or LibTorch cannot
  // read it) is passed over with one line naming it, so a worker whose own copy went bad
  // resumes from an intact one.
  const fs::path own = dense_checkpoint_file(c_.checkpoint_dir, rank_, iteration);
  std::vector<fs::path> candidates{own};
  for (std::uint32_t r = 0; r < c_.workers; ++r) {
    if (r != rank_) candidates.push_back(dense_checkpoint_file(c_.checkpoint_dir, r, iteration));
  }
  std::vector<std::string> passed;
  for (const fs::path& file : candidates) {
    if (!fs::exists(file)) continue;
    torch::serialize::InputArchive root, model_archive, optimizer_archive;
    json found;
    DenseRestore restored;
    std::string& directory = restored.directory;
    try {
      verify_dense_file(file);
      try {
        root.load_from(file.string(), device);
        c10::IValue m;
        root.read("meta", m);
        found = json::parse(m.toStringRef());
        root.read("model", model_archive);
        root.read("optimizer", optimizer_archive);
        directory = directory_state_of(root);
        c10::IValue position;
        if (root.try_read(kStreamRecord, position)) restored.stream_position = position.toStringRef();
      } catch (const std::exception& e) {
        throw DataError(file.string() + ": not a readable dense checkpoint: " + first_line(e));
      }
    } catch (const DataError& e) {
      spdlog::warn("worker {}: --resume: passing over {}", rank_, e.what());
      passed.push_back(e.what());
      continue;
    }
    const json want = meta(iteration);  // named: items() refers to it
    for (const auto& [key, value] : want.items()) {
      if (key == "num_keys" && !directory.empty()) continue;  // its key directory is placed on this job's shards
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
    spdlog::info("worker {}: resuming at iteration {}: dense model and optimizer from {}{}", rank_, iteration, file.string(),
                 file == own ? "" : (fs::exists(own) ? " (its own file is corrupt)" : " (its own file is missing)"));
    return restored;
  }
  if (passed.empty()) {
    throw ConfigError("--resume: the PS restored iteration " + std::to_string(iteration) + " but " + c_.checkpoint_dir +
                      " holds no worker's dense state of it (" + own.filename().string() +
                      "); restore the PS from a checkpoint the workers also wrote (ember-worker --checkpoint-dir)");
  }
  std::string why;
  for (const std::string& p : passed) why += (why.empty() ? "" : "; ") + p;
  throw DataError("--resume: the PS restored iteration " + std::to_string(iteration) + " but no worker's dense state of it in " +
                  c_.checkpoint_dir + " is intact: " + why);
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
