#include "ember/ps/shard_store.h"

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/ps/placement.h"

namespace ember::ps {
namespace {

constexpr char kCheckpointMagic[8] = {'E', 'M', 'B', 'R', 'C', 'K', 'P', 'T'};
constexpr std::uint32_t kCheckpointVersion = 1;

struct CheckpointHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t dim;
  std::uint32_t state;
  std::uint32_t optimizer;
  std::uint32_t shard;
  std::uint32_t shards;
  std::uint64_t num_keys;
  std::uint64_t rows;
};
static_assert(sizeof(CheckpointHeader) == 48);

}  // namespace

ShardStore::ShardStore(StoreConfig config) : config_(std::move(config)) {
  if (config_.shards == 0 || config_.shard >= config_.shards) throw ConfigError("shard index out of range");
  if (config_.dim == 0) throw ConfigError("embedding dimension must be positive");
  if (!config_.lr_at) {
    const float lr = config_.optimizer.lr;
    config_.lr_at = [lr](std::uint64_t) { return lr; };
  }
  state_ = state_floats(config_.optimizer.kind, config_.dim);
  local_rows_ = config_.num_keys > config_.shard ? (config_.num_keys - 1 - config_.shard) / config_.shards + 1 : 0;
  chunks_.resize((local_rows_ + kChunkRows - 1) / kChunkRows);
  initialized_.assign(local_rows_, 0);
}

void ShardStore::check_key(Key key) const {
  if (key >= config_.num_keys) {
    throw ProtocolError("key " + std::to_string(key) + " is beyond the " + std::to_string(config_.num_keys) + " rows of the tables");
  }
  if (!owns(key)) {
    throw ProtocolError("key " + std::to_string(key) + " belongs to shard " + std::to_string(owner_shard(key, config_.shards)) +
                        ", not " + std::to_string(config_.shard));
  }
}

float* ShardStore::row_ptr(Key key) {
  const std::uint64_t local = key / config_.shards;
  auto& chunk = chunks_[local / kChunkRows];
  const std::uint32_t rf = row_floats();
  if (!chunk) chunk = std::make_unique_for_overwrite<float[]>(kChunkRows * rf);
  float* p = chunk.get() + (local % kChunkRows) * rf;
  if (!initialized_[local]) {
    initial_row(config_.seed, key, config_.dim, p);
    init_state(config_.optimizer, config_.dim, p + config_.dim);
    initialized_[local] = 1;
    ++initialized_count_;
  }
  return p;
}

const float* ShardStore::row(Key key) {
  check_key(key);
  return row_ptr(key);
}

void ShardStore::pull(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * config_.dim, row_ptr(keys[i]), sizeof(float) * config_.dim);
}

void ShardStore::pull_with_state(std::span<const Key> keys, float* out) {
  for (Key k : keys) check_key(k);
  const std::uint32_t rf = row_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(out + i * rf, row_ptr(keys[i]), sizeof(float) * rf);
}

void ShardStore::push_grad(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers,
                           const float* grads) {
  if (trainers.size() != keys.size()) throw ProtocolError("push-grad: one trainer count per key is required");
  // Validate everything first: a refused request changes nothing.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    if (trainers[i] == 0) throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " with zero trainers");
    if (const Pending* p = pending_.find(keys[i])) {
      if (p->iteration != iteration) {
        throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " from iteration " + std::to_string(iteration) +
                            " while the aggregation of iteration " + std::to_string(p->iteration) + " is incomplete");
      }
      if (p->received >= p->expected) throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " has all its contributions");
    }
  }
  const std::uint32_t dim = config_.dim;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto [p, fresh] = pending_.try_emplace(keys[i], Pending{iteration, trainers[i], 0, 0});
    if (fresh) {
      if (!free_offsets_.empty()) {
        p->offset = free_offsets_.back();
        free_offsets_.pop_back();
        std::fill_n(pending_grads_.begin() + p->offset, dim, 0.0f);
      } else {
        p->offset = static_cast<std::uint32_t>(pending_grads_.size());
        pending_grads_.resize(pending_grads_.size() + dim, 0.0f);
      }
    }
    float* acc = pending_grads_.data() + p->offset;
    const float* g = grads + i * dim;
    for (std::uint32_t j = 0; j < dim; ++j) acc[j] += g[j];
    ++p->received;
  }
}

void ShardStore::push_value(std::span<const Key> keys, const float* rows) {
  for (Key k : keys) {
    check_key(k);
    if (pending_.find(k)) throw ProtocolError("push-value: key " + std::to_string(k) + " has an incomplete gradient aggregation");
  }
  const std::uint32_t rf = row_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(row_ptr(keys[i]), rows + i * rf, sizeof(float) * rf);
}

std::uint64_t ShardStore::commit() {
  std::vector<Key> ready;
  pending_.for_each([&](std::uint64_t k, const Pending& p) {
    if (p.received == p.expected) ready.push_back(k);
  });
  std::sort(ready.begin(), ready.end());  // a fixed order, though rows are independent
  for (Key k : ready) {
    Pending p = *pending_.find(k);
    float* r = row_ptr(k);
    apply(config_.optimizer, config_.lr_at(p.iteration), config_.dim, r, r + config_.dim, pending_grads_.data() + p.offset);
    free_offsets_.push_back(p.offset);
    pending_.erase(k);
  }
  return ready.size();
}

void ShardStore::save(const std::filesystem::path& file) const {
  if (!pending_.empty()) {
    throw Error("cannot checkpoint shard " + std::to_string(config_.shard) + ": " + std::to_string(pending_.size()) +
                " rows have incomplete gradient aggregations");
  }
  const std::uint32_t rf = row_floats();
  const std::size_t record = sizeof(Key) + rf * sizeof(float);
  std::string buf(sizeof(CheckpointHeader) + initialized_count_ * record + sizeof(std::uint64_t), '\0');
  CheckpointHeader h{};
  std::memcpy(h.magic, kCheckpointMagic, sizeof h.magic);
  h.version = kCheckpointVersion;
  h.dim = config_.dim;
  h.state = state_;
  h.optimizer = static_cast<std::uint32_t>(config_.optimizer.kind);
  h.shard = config_.shard;
  h.shards = config_.shards;
  h.num_keys = config_.num_keys;
  h.rows = initialized_count_;
  std::memcpy(buf.data(), &h, sizeof h);
  char* p = buf.data() + sizeof h;
  for (std::uint64_t local = 0; local < local_rows_; ++local) {
    if (!initialized_[local]) continue;
    const Key key = local * config_.shards + config_.shard;
    std::memcpy(p, &key, sizeof key);
    std::memcpy(p + sizeof key, chunks_[local / kChunkRows].get() + (local % kChunkRows) * rf, rf * sizeof(float));
    p += record;
  }
  std::uint64_t sum = checksum64(buf.data(), buf.size() - sizeof(std::uint64_t));
  std::memcpy(p, &sum, sizeof sum);
  write_file_atomic(file, buf);
}

void ShardStore::load(const std::vector<std::filesystem::path>& files) {
  const std::uint32_t rf = row_floats();
  const std::size_t record = sizeof(Key) + rf * sizeof(float);
  for (const auto& f : files) {
    const std::string buf = read_file(f);
    const std::string name = f.string();
    if (buf.size() < sizeof(CheckpointHeader) + sizeof(std::uint64_t)) throw DataError(name + ": truncated checkpoint");
    CheckpointHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    if (std::memcmp(h.magic, kCheckpointMagic, sizeof h.magic) != 0) throw DataError(name + ": not an Ember checkpoint");
    if (h.version != kCheckpointVersion) throw DataError(name + ": checkpoint version " + std::to_string(h.version) + " is not supported");
    if (buf.size() != sizeof h + h.rows * record + sizeof(std::uint64_t)) {
      throw DataError(name + ": size does not match its " + std::to_string(h.rows) + " rows (truncated or corrupt)");
    }
    std::uint64_t sum;
    std::memcpy(&sum, buf.data() + buf.size() - sizeof sum, sizeof sum);
    if (sum != checksum64(buf.data(), buf.size() - sizeof sum)) throw DataError(name + ": checksum mismatch (corrupt checkpoint)");
    if (h.dim != config_.dim || h.state != state_ || h.optimizer != static_cast<std::uint32_t>(config_.optimizer.kind) ||
        h.num_keys != config_.num_keys) {
      throw DataError(name + ": written for dim " + std::to_string(h.dim) + ", optimizer " +
                      optimizer_name(static_cast<OptimizerKind>(h.optimizer)) + ", " + std::to_string(h.num_keys) +
                      " keys; this PS has dim " + std::to_string(config_.dim) + ", " + optimizer_name(config_.optimizer.kind) + ", " +
                      std::to_string(config_.num_keys) + " keys");
    }
    const char* p = buf.data() + sizeof h;
    for (std::uint64_t i = 0; i < h.rows; ++i, p += record) {
      Key key;
      std::memcpy(&key, p, sizeof key);
      if (key >= config_.num_keys) throw DataError(name + ": key " + std::to_string(key) + " beyond the tables");
      if (!owns(key)) continue;
      std::memcpy(row_ptr(key), p + sizeof key, rf * sizeof(float));
    }
  }
}

}  // namespace ember::ps
