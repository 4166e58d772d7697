#include "ember/ps/shard_store.h"

#include <tbb/spin_mutex.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <thread>

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

struct ShardStore::Stripe {
  mutable tbb::spin_mutex mu;
  U64Map<Pending> pending;
  std::vector<float> grads;
  std::vector<std::uint32_t> free_offsets;
};

std::size_t ShardStore::stripe_index(Key key) const { return (key / config_.shards) % kStripes; }
ShardStore::Stripe& ShardStore::stripe_of(Key key) const { return stripes_[stripe_index(key)]; }

ShardStore::~ShardStore() {
  for (std::uint64_t c = 0; chunks_ && c < chunk_count_; ++c) delete[] chunks_[c].load();
}

ShardStore::ShardStore(ShardStore&& o) noexcept
    : config_(std::move(o.config_)),
      state_(o.state_),
      local_rows_(o.local_rows_),
      chunks_(std::move(o.chunks_)),
      chunk_count_(o.chunk_count_),
      initialized_(std::move(o.initialized_)),
      initialized_count_(o.initialized_count_.load()),
      stripes_(std::move(o.stripes_)) {
  o.chunk_count_ = 0;
}

std::uint64_t ShardStore::local_rows(const StoreConfig& c) {
  return c.num_keys > c.shard ? (c.num_keys - 1 - c.shard) / c.shards + 1 : 0;
}

std::uint64_t ShardStore::bytes_when_full(const StoreConfig& c) {
  return local_rows(c) * ((c.dim + state_floats(c.optimizer.kind, c.dim)) * sizeof(float) + 1);
}

std::size_t ShardStore::pending() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kStripes; ++i) {
    tbb::spin_mutex::scoped_lock lock(stripes_[i].mu);
    n += stripes_[i].pending.size();
  }
  return n;
}

ShardStore::ShardStore(StoreConfig config) : config_(std::move(config)) {
  if (config_.shards == 0 || config_.shard >= config_.shards) throw ConfigError("shard index out of range");
  if (config_.dim == 0) throw ConfigError("embedding dimension must be positive");
  if (!config_.lr_at) {
    const float lr = config_.optimizer.lr;
    config_.lr_at = [lr](std::uint64_t) { return lr; };
  }
  state_ = state_floats(config_.optimizer.kind, config_.dim);
  local_rows_ = local_rows(config_);
  chunk_count_ = (local_rows_ + kChunkRows - 1) / kChunkRows;
  try {
    chunks_ = std::make_unique<std::atomic<float*>[]>(chunk_count_);
    initialized_ = std::make_unique<std::atomic<std::uint8_t>[]>(local_rows_);
  } catch (const std::bad_alloc&) {
    throw ConfigError("cannot allocate the row index of shard " + std::to_string(config_.shard) + " (" + std::to_string(local_rows_) +
                      " rows): add shards");
  }
  for (std::uint64_t c = 0; c < chunk_count_; ++c) chunks_[c].store(nullptr);
  for (std::uint64_t i = 0; i < local_rows_; ++i) initialized_[i].store(0, std::memory_order_relaxed);
  stripes_ = std::make_unique<Stripe[]>(kStripes);
  if (config_.allocate_up_front) {
    try {
      for (std::uint64_t local = 0; local < local_rows_; ++local) row_ptr(local * config_.shards + config_.shard);
    } catch (const std::bad_alloc&) {
      throw ConfigError("cannot allocate the " + std::to_string(bytes_when_full() >> 20) + " MiB of shard " + std::to_string(config_.shard) +
                        "'s rows up front: add shards, or allocate on first use");
    }
  }
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
  const std::uint32_t rf = row_floats();
  std::atomic<float*>& slot = chunks_[local / kChunkRows];
  float* chunk = slot.load(std::memory_order_acquire);
  if (chunk == nullptr) {
    // First touch of this chunk: whoever installs it first wins; the others free theirs.
    float* fresh = new float[kChunkRows * rf];
    if (slot.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      chunk = fresh;
    } else {
      delete[] fresh;
    }
  }
  float* p = chunk + (local % kChunkRows) * rf;
  std::atomic<std::uint8_t>& init = initialized_[local];
  if (init.load(std::memory_order_acquire) != 2) {
    std::uint8_t expected = 0;
    if (init.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      initial_row(config_.seed, key, config_.dim, p);
      init_state(config_.optimizer, config_.dim, p + config_.dim);
      init.store(2, std::memory_order_release);
      initialized_count_.fetch_add(1, std::memory_order_relaxed);
    } else {
      while (init.load(std::memory_order_acquire) != 2) std::this_thread::yield();  // another thread is initializing it
    }
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

void ShardStore::row_pointers(std::span<const Key> keys, const float** out) {
  for (Key k : keys) check_key(k);
  for (std::size_t i = 0; i < keys.size(); ++i) out[i] = row_ptr(keys[i]);
}

void ShardStore::push_grad(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers,
                           const float* grads) {
  if (trainers.size() != keys.size()) throw ProtocolError("push-grad: one trainer count per key is required");
  // The request's keys grouped by stripe, so each stripe's lock is taken once per pass
  // (a lock per key makes handler threads fight over the same cache lines).
  thread_local std::vector<std::uint32_t> order;
  std::array<std::uint32_t, kStripes + 1> start{};
  for (Key k : keys) ++start[stripe_index(k) + 1];
  for (std::size_t s = 0; s < kStripes; ++s) start[s + 1] += start[s];
  order.resize(keys.size());
  {
    std::array<std::uint32_t, kStripes> fill{};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::size_t s = stripe_index(keys[i]);
      order[start[s] + fill[s]++] = static_cast<std::uint32_t>(i);
    }
  }
  // Validate everything first: a refused request changes nothing (unless another
  // request races it on the same keys, which BSP rules out).
  for (std::size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    if (trainers[i] == 0) throw ProtocolError("push-grad: key " + std::to_string(keys[i]) + " with zero trainers");
  }
  for (std::size_t s = 0; s < kStripes; ++s) {
    if (start[s] == start[s + 1]) continue;
    Stripe& st = stripes_[s];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    for (std::uint32_t j = start[s]; j < start[s + 1]; ++j) {
      const Key k = keys[order[j]];
      if (const Pending* p = st.pending.find(k)) {
        if (p->iteration != iteration) {
          throw ProtocolError("push-grad: key " + std::to_string(k) + " from iteration " + std::to_string(iteration) +
                              " while the aggregation of iteration " + std::to_string(p->iteration) + " is incomplete");
        }
        if (p->received >= p->expected) throw ProtocolError("push-grad: key " + std::to_string(k) + " has all its contributions");
      }
    }
  }
  const std::uint32_t dim = config_.dim;
  for (std::size_t s = 0; s < kStripes; ++s) {
    if (start[s] == start[s + 1]) continue;
    Stripe& st = stripes_[s];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    for (std::uint32_t j = start[s]; j < start[s + 1]; ++j) {
      const std::uint32_t i = order[j];
      auto [p, fresh] = st.pending.try_emplace(keys[i], Pending{iteration, trainers[i], 0, 0});
      const float* g = grads + static_cast<std::size_t>(i) * dim;
      if (fresh) {
        if (!st.free_offsets.empty()) {
          p->offset = st.free_offsets.back();
          st.free_offsets.pop_back();
        } else {
          p->offset = static_cast<std::uint32_t>(st.grads.size());
          st.grads.resize(st.grads.size() + dim);
        }
        std::memcpy(st.grads.data() + p->offset, g, dim * sizeof(float));  // the first contribution
      } else {
        float* __restrict acc = st.grads.data() + p->offset;
        for (std::uint32_t d = 0; d < dim; ++d) acc[d] += g[d];
      }
      ++p->received;
    }
  }
}

void ShardStore::push_value(std::span<const Key> keys, const float* rows) {
  for (Key k : keys) {
    check_key(k);
    Stripe& st = stripe_of(k);
    tbb::spin_mutex::scoped_lock lock(st.mu);
    if (st.pending.find(k)) throw ProtocolError("push-value: key " + std::to_string(k) + " has an incomplete gradient aggregation");
  }
  const std::uint32_t rf = row_floats();
  for (std::size_t i = 0; i < keys.size(); ++i) std::memcpy(row_ptr(keys[i]), rows + i * rf, sizeof(float) * rf);
}

std::uint64_t ShardStore::commit() {
  std::uint64_t applied = 0;
  for (std::size_t s = 0; s < kStripes; ++s) {
    Stripe& st = stripes_[s];
    tbb::spin_mutex::scoped_lock lock(st.mu);
    std::vector<Key> ready;
    st.pending.for_each([&](std::uint64_t k, const Pending& p) {
      if (p.received == p.expected) ready.push_back(k);
    });
    std::sort(ready.begin(), ready.end());  // a fixed order, though rows are independent
    for (Key k : ready) {
      Pending p = *st.pending.find(k);
      float* r = row_ptr(k);
      apply(config_.optimizer, config_.lr_at(p.iteration), config_.dim, r, r + config_.dim, st.grads.data() + p.offset);
      st.free_offsets.push_back(p.offset);
      st.pending.erase(k);
    }
    applied += ready.size();
  }
  return applied;
}

void ShardStore::save(const std::filesystem::path& file) const {
  if (std::size_t n = pending(); n > 0) {
    throw Error("cannot checkpoint shard " + std::to_string(config_.shard) + ": " + std::to_string(n) +
                " rows have incomplete gradient aggregations");
  }
  const std::uint32_t rf = row_floats();
  const std::size_t record = sizeof(Key) + rf * sizeof(float);
  std::uint64_t rows = 0;
  for (std::uint64_t local = 0; local < local_rows_; ++local) rows += initialized_[local].load() == 2;
  std::string buf(sizeof(CheckpointHeader) + rows * record + sizeof(std::uint64_t), '\0');
  CheckpointHeader h{};
  std::memcpy(h.magic, kCheckpointMagic, sizeof h.magic);
  h.version = kCheckpointVersion;
  h.dim = config_.dim;
  h.state = state_;
  h.optimizer = static_cast<std::uint32_t>(config_.optimizer.kind);
  h.shard = config_.shard;
  h.shards = config_.shards;
  h.num_keys = config_.num_keys;
  h.rows = rows;
  std::memcpy(buf.data(), &h, sizeof h);
  char* p = buf.data() + sizeof h;
  for (std::uint64_t local = 0; local < local_rows_; ++local) {
    if (initialized_[local].load() != 2) continue;
    const Key key = local * config_.shards + config_.shard;
    std::memcpy(p, &key, sizeof key);
    std::memcpy(p + sizeof key, chunks_[local / kChunkRows].load() + (local % kChunkRows) * rf, rf * sizeof(float));
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
