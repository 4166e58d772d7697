// A shard's checkpoint files (ShardStore::save, load): a header naming the table
// geometry, the optimizer, the iteration and the base (an incremental checkpoint's: the
// iteration of the same shard's checkpoint it adds to), then every initialized row of
// the shard (an incremental one: every row changed since its base) as its key, its id
// (a shard of hashed ids: kHashedIds), its value and optimizer state, then a checksum of
// everything before it.
// The store's serving side is shard_store.cc.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <shared_mutex>
#include <string>

#include "ember/common/binary_header.h"
#include "ember/common/byte_io.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {
namespace {

// Version 4 carries flags (kHashedIds); version 3 files (the base), version 2 files (the
// iteration, no base) and version 1 files (48-byte header, no iteration) still load.
constexpr BinaryFormat kCheckpointFormat{{'E', 'M', 'B', 'R', 'C', 'K', 'P', 'T'}, "checkpoint", 4, 1};
// A flag: each record holds the slot's id after its key (kNoId: the slot is free).
constexpr std::uint64_t kHashedIds = 1;
constexpr std::int64_t kNoBase = std::numeric_limits<std::int64_t>::min();

struct CheckpointHeader {
  char magic[8];  // binary_header.h's
  std::uint32_t version;
  std::uint32_t dim;
  std::uint32_t state;
  std::uint32_t optimizer;
  std::uint32_t shard;
  std::uint32_t shards;
  std::uint64_t num_keys;
  std::uint64_t rows;
  std::int64_t iteration;  // last iteration committed into the rows (-1: none, or a version 1 file)
  std::int64_t base;       // an incremental checkpoint's base iteration; kNoBase: whole (and before version 3)
  std::uint64_t flags;     // kHashedIds (0 before version 4)
};
static_assert(sizeof(CheckpointHeader) == 72 && offsetof(CheckpointHeader, dim) == kBinaryHeaderBytes);
constexpr std::size_t kHeaderV1Bytes = 48, kHeaderV2Bytes = 56, kHeaderV3Bytes = 64;

std::size_t header_bytes(std::uint32_t version) {
  return version == 1 ? kHeaderV1Bytes : version == 2 ? kHeaderV2Bytes : version == 3 ? kHeaderV3Bytes : sizeof(CheckpointHeader);
}

bool hashed(const CheckpointHeader& h) { return (h.flags & kHashedIds) != 0; }

// The bytes of one row's record: key, id (hashed ids), value and state.
std::size_t record_bytes(const CheckpointHeader& h) {
  return sizeof(Key) + (hashed(h) ? sizeof(std::uint64_t) : 0) + (static_cast<std::size_t>(h.dim) + h.state) * sizeof(float);
}

// The header of a checkpoint file (its first bytes), checked for magic and version.
CheckpointHeader read_header(const std::string& name, const std::string& buf) {
  CheckpointHeader h{};
  if (buf.size() < kHeaderV1Bytes + sizeof(std::uint64_t)) throw DataError(name + ": truncated checkpoint");
  read_binary_header(kCheckpointFormat, name, buf);
  std::memcpy(&h, buf.data(), kHeaderV1Bytes);
  h.iteration = -1;
  h.base = kNoBase;
  h.flags = 0;
  if (h.version != 1) {
    const std::size_t n = header_bytes(h.version);
    if (buf.size() < n + sizeof(std::uint64_t)) throw DataError(name + ": truncated checkpoint");
    std::memcpy(&h, buf.data(), n);
  }
  if (h.base != kNoBase && h.base >= h.iteration) {
    throw DataError(name + ": an incremental checkpoint of iteration " + std::to_string(h.iteration) + " on a base of iteration " +
                    std::to_string(h.base) + " (not older: corrupt)");
  }
  return h;
}

// The header of a file of `rows` rows of a store of `c` (`state` floats a row).
CheckpointHeader header_for(const StoreConfig& c, std::uint32_t state, std::uint64_t rows, std::int64_t iteration, std::int64_t base) {
  CheckpointHeader h{};
  write_binary_header(kCheckpointFormat, &h);
  h.dim = c.dim;
  h.state = state;
  h.optimizer = static_cast<std::uint32_t>(c.optimizer.kind);
  h.shard = c.shard;
  h.shards = c.shards;
  h.num_keys = c.num_keys;
  h.rows = rows;
  h.iteration = iteration;
  h.base = base;
  h.flags = c.hashed_ids ? kHashedIds : 0;
  return h;
}

// The header of a checkpoint file, read without the rest of it.
CheckpointHeader header_of(const std::filesystem::path& file) {
  return read_header(file.string(), read_file_head(file, sizeof(CheckpointHeader) + sizeof(std::uint64_t)));
}

// Reads bytes [from, to) of `file` in blocks of `block` bytes (the last may be shorter),
// handing each to `take`: a checkpoint of a tiered shard may not fit in memory.
void read_blocks(const std::filesystem::path& file, std::uint64_t from, std::uint64_t to, std::size_t block,
                 const std::function<void(const char*, std::size_t)>& take) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError(errno_message("open " + file.string()));
  in.seekg(static_cast<std::streamoff>(from));
  std::string buf(block, '\0');
  for (std::uint64_t at = from; at < to;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block, to - at));
    if (!in.read(buf.data(), static_cast<std::streamsize>(n))) throw DataError(file.string() + ": truncated checkpoint (read failed)");
    take(buf.data(), n);
    at += n;
  }
}

// The header of a checkpoint file, after checking that its size fits its rows and that
// its checksum holds, read in blocks.
CheckpointHeader read_checked(const std::filesystem::path& file) {
  const std::string name = file.string();
  const CheckpointHeader h = header_of(file);
  const std::size_t record = record_bytes(h);
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(file, ec);
  if (ec) throw IoError(name + ": " + ec.message());
  if (size != header_bytes(h.version) + h.rows * record + sizeof(std::uint64_t)) {
    throw DataError(name + ": size does not match its " + std::to_string(h.rows) + " rows (truncated or corrupt)");
  }
  Checksum64 sum;
  read_blocks(file, 0, size - sizeof(std::uint64_t), 4u << 20, [&](const char* p, std::size_t n) { sum.update(p, n); });
  std::uint64_t stored = 0;
  read_blocks(file, size - sizeof stored, size, sizeof stored, [&](const char* p, std::size_t) { std::memcpy(&stored, p, sizeof stored); });
  if (stored != sum.digest()) throw DataError(name + ": checksum mismatch (corrupt checkpoint)");
  return h;
}

// The file an incremental checkpoint `file` adds to: the same shard's file of its base
// iteration, beside its own checkpoint directory (checkpoints.h's layout). DataError
// naming both when it is not there, or is not that shard's checkpoint of that iteration.
std::filesystem::path base_file(const std::filesystem::path& file, const CheckpointHeader& h) {
  const std::filesystem::path base = checkpoint_dir(file.parent_path().parent_path(), h.base) / file.filename();
  std::error_code ec;
  if (!std::filesystem::exists(base, ec)) {
    throw DataError(file.string() + ": an incremental checkpoint on iteration " + std::to_string(h.base) + "'s, whose file " +
                    base.string() + " is missing (restore a whole checkpoint, or put it back)");
  }
  const CheckpointHeader b = header_of(base);
  if (b.iteration != h.base || b.shard != h.shard || b.shards != h.shards || b.flags != h.flags) {
    throw DataError(file.string() + ": its base " + base.string() + " holds shard " + std::to_string(b.shard) + " of " +
                    std::to_string(b.shards) + " at iteration " + std::to_string(b.iteration) + ", not shard " + std::to_string(h.shard) +
                    " of " + std::to_string(h.shards) + " at " + std::to_string(h.base));
  }
  return base;
}

}  // namespace

std::size_t ShardStore::save(const std::filesystem::path& file, std::int64_t iteration, Unapplied leave, std::optional<std::int64_t> base) {
  if (base && !changed_) throw Error("an incremental checkpoint of shard " + std::to_string(config_.shard) + " without tracked changes");
  if (base && *base >= iteration) throw Error("an incremental checkpoint's base must be older than it");
  // Every commit so far applied, and no apply while the rows are written out: a commit
  // meanwhile waits (its rows belong to the next checkpoint).
  const std::unique_lock<std::shared_mutex> no_applies = hold_off_applies();
  const std::size_t left_out = unapplied();
  if (left_out > 0 && leave == Unapplied::kRefuse) {
    throw Error("cannot checkpoint shard " + std::to_string(config_.shard) + ": " + std::to_string(left_out) +
                " rows have incomplete gradient aggregations");
  }
  const std::uint32_t rf = row_floats();
  const bool ids = config_.hashed_ids;
  const std::size_t record = sizeof(Key) + (ids ? sizeof(std::uint64_t) : 0) + rf * sizeof(float);
  // Hashed ids: the rows the resets of this very commit made are no part of the model
  // before `iteration`; they are written as free (a whole checkpoint leaves free slots
  // out), and a resumed job's first step makes them again.
  std::vector<bool> fresh;
  if (ids && iteration >= 0 && made_iteration_ == static_cast<std::uint64_t>(iteration) && !made_.empty()) {
    fresh.resize(local_rows());
    for (std::uint64_t local : made_) fresh[local] = true;
  }
  const auto id_of = [&](std::uint64_t local) { return !fresh.empty() && fresh[local] ? kNoId : slot_ids_[local] - 1; };
  // The rows to write, listed once: pulls may initialize rows meanwhile (a worker that
  // had its commit acknowledged reads on). Those are left out; they hold their initial
  // values, which a restore gives them again from (seed, key).
  // (A bit a row: a tiered shard's rows may be more than its memory holds.) An
  // incremental checkpoint lists the rows changed since the last one (its base).
  std::vector<bool> listed(local_rows());
  std::uint64_t rows = 0;
  for (std::uint64_t local = 0; local < local_rows(); ++local) {
    if (arena_.state(local).load(std::memory_order_acquire) < kIdle) continue;
    if (base ? changed(local) : !ids || id_of(local) != kNoId) listed[local] = true, ++rows;
  }
  const CheckpointHeader h = header_for(config_, state_, rows, iteration, base.value_or(kNoBase));
  std::uint64_t written_sum = 0;
  // Written as it is made, in blocks of 4 MiB (a tiered shard holds more rows than its
  // memory). With deltas: under a staging name, then the delta (naming its checksum),
  // then renamed in: once every shard's file is in (a manifest), so are the deltas.
  const std::filesystem::path staged = config_.serving_deltas ? std::filesystem::path(file.string() + ".staged") : file;
  write_file_atomic(staged, [&](const std::function<void(std::string_view)>& write) {
    Checksum64 sum;
    const auto out = [&](const char* p, std::size_t n) {
      sum.update(p, n);
      write(std::string_view(p, n));
    };
    out(reinterpret_cast<const char*>(&h), sizeof h);
    const std::size_t per_block = std::max<std::size_t>(1, (4u << 20) / record);
    std::string block;
    block.reserve(per_block * record);
    std::uint64_t written = 0;
    const auto add = [&](std::uint64_t local, const char* row) {
      const Key key = local * config_.shards + config_.shard;
      put(block, key);
      if (ids) put(block, id_of(local));
      block.append(row, rf * sizeof(float));
      if (++written == rows || block.size() >= per_block * record) {
        out(block.data(), block.size());
        block.clear();
      }
    };
    for_each_listed(listed, per_block, add);
    const std::uint64_t digest = sum.digest();
    write(std::string_view(reinterpret_cast<const char*>(&digest), sizeof digest));
    written_sum = digest;
  });
  if (config_.serving_deltas) {
    try {
      write_delta(file, iteration, fresh, written_sum);
      std::filesystem::rename(staged, file);
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(staged, ec);
      throw;
    }
    fsync_dir(file.parent_path());
  }
  changes_saved(iteration, written_sum, fresh);
  return left_out;
}

void ShardStore::changes_saved(std::int64_t iteration, std::uint64_t sum, const std::vector<bool>& fresh) {
  // The next incremental checkpoint and delta count changes from here (none can come
  // meanwhile: applies and write-backs are held off).
  if (changed_) {
    clear_changes();
    for (std::uint64_t local = 0; local < fresh.size(); ++local)
      if (fresh[local]) mark_changed(local);  // written free: the next one writes them as made
  }
  if (id_changed_) {
    for (std::uint64_t w = 0; w < (local_rows() + 63) / 64; ++w) id_changed_[w].store(0, std::memory_order_relaxed);
    for (std::uint64_t local = 0; local < fresh.size(); ++local)
      if (fresh[local]) id_changed_[local >> 6].fetch_or(std::uint64_t{1} << (local & 63), std::memory_order_relaxed);
  }
  delta_previous_ = iteration;
  delta_previous_sum_ = sum;
}

void ShardStore::for_each_listed(const std::vector<bool>& listed, std::size_t per_block,
                                 const std::function<void(std::uint64_t, const char*)>& add) const {
  if (tier_ == nullptr) {
    for (std::uint64_t local = 0; local < listed.size(); ++local)
      if (listed[local]) add(local, reinterpret_cast<const char*>(row_address(local)));
    return;
  }
  // A block of the table at a time, read from the file, rows in memory from there.
  for (std::uint64_t first = 0; first < listed.size(); first += per_block)
    tier_->scan(first, std::min<std::uint64_t>(first + per_block, listed.size()), listed, add);
}

void ShardStore::write_delta(const std::filesystem::path& checkpoint_file, std::int64_t iteration, const std::vector<bool>& fresh,
                             std::uint64_t checkpoint_sum) {
  DeltaInfo info;
  info.dim = config_.dim;
  info.shard = config_.shard;
  info.shards = config_.shards;
  info.num_keys = config_.num_keys;
  info.iteration = iteration;
  info.previous = delta_previous_;
  info.previous_sum = delta_previous_sum_;
  info.own_sum = checkpoint_sum;
  info.hashed_ids = config_.hashed_ids;
  DeltaWriter delta(info);
  const std::filesystem::path file = checkpoint_file.parent_path() / delta_file_name(config_.shard, config_.shards);
  // After a fresh start no follower holds what the changes count from: a header only (a
  // first delta would be every row trained, held in memory).
  if (delta_previous_ == DeltaInfo::kNoPrevious) {
    delta.write(file);
    return;
  }
  std::vector<bool> listed(local_rows());
  for (std::uint64_t local = 0; local < local_rows(); ++local)
    listed[local] = changed(local) && arena_.state(local).load(std::memory_order_acquire) >= kIdle;
  for_each_listed(listed, std::max<std::size_t>(1, (4u << 20) / (row_floats() * sizeof(float))), [&](std::uint64_t local, const char* row) {
    const auto* values = reinterpret_cast<const float*>(row);
    if (!config_.hashed_ids) return delta.add(local, DeltaKind::kRow, kNoId, values);
    // Written free as the checkpoint writes it: made by this very commit, or dropped.
    const std::uint64_t id = !fresh.empty() && fresh[local] ? kNoId : slot_ids_[local] - 1;
    const bool new_id = (id_changed_[local >> 6].load(std::memory_order_relaxed) >> (local & 63) & 1) != 0;
    if (id == kNoId)
      delta.add(local, DeltaKind::kFreed, kNoId, nullptr);
    else
      delta.add(local, new_id ? DeltaKind::kNewId : DeltaKind::kRow, id, values);
  });
  delta.write(file);
}

std::int64_t ShardStore::load(const std::vector<std::filesystem::path>& files, bool own_file_only) {
  wait_all_applied();
  std::int64_t iteration = 0;
  if (own_file_only) {
    if (files.size() != 1) throw DataError("a restore from this shard's own file takes that file alone");
    const CheckpointHeader h = header_of(files[0]);
    if (h.shard != config_.shard || h.shards != config_.shards) {
      throw DataError(files[0].string() + " holds shard " + std::to_string(h.shard) + " of " + std::to_string(h.shards) + ", not shard " +
                      std::to_string(config_.shard) + " of " + std::to_string(config_.shards));
    }
    iteration = h.iteration;
  } else {
    iteration = check_checkpoint_set(files);
  }
  if (config_.hashed_ids) {
    // Another shard count, or other slots per shard: the ids are placed anew.
    const CheckpointHeader h = header_of(files[0]);
    if (h.shards != config_.shards || h.num_keys != config_.num_keys) return load_replaced(files, iteration);
  }
  const std::uint32_t rf = row_floats();
  read_records(files, [&](const std::string& name, Key key, std::uint64_t id, const char* row) {
    if (key >= config_.num_keys) throw DataError(name + ": key " + std::to_string(key) + " beyond the tables");
    if (!owns(key)) return;
    std::memcpy(read_row(key, true, true).get(), row, rf * sizeof(float));
    if (config_.hashed_ids) set_slot_id(local_of(key), id);
  });
  // The next delta applies to this checkpoint: its iteration, and this shard's file of it.
  delta_previous_ = DeltaInfo::kNoPrevious;
  for (const auto& f : files) {
    const CheckpointHeader h = header_of(f);
    if (h.shard == config_.shard && h.shards == config_.shards) delta_previous_ = iteration, delta_previous_sum_ = checkpoint_checksum(f);
  }
  return iteration;
}

void ShardStore::read_records(const std::vector<std::filesystem::path>& files,
                              const std::function<void(const std::string&, Key, std::uint64_t, const char*)>& take) const {
  const std::uint32_t rf = row_floats();
  // An incremental checkpoint's file: its base's rows first (recursively), then its own.
  std::function<void(const std::filesystem::path&)> load_file = [&](const std::filesystem::path& f) {
    const std::string name = f.string();
    const CheckpointHeader h = read_checked(f);
    if (h.base != kNoBase) load_file(base_file(f, h));
    if (h.dim != config_.dim || h.state != state_ || h.optimizer != static_cast<std::uint32_t>(config_.optimizer.kind) ||
        (h.num_keys != config_.num_keys && !config_.hashed_ids)) {
      throw DataError(name + ": written for dim " + std::to_string(h.dim) + ", optimizer " +
                      optimizer_name(static_cast<OptimizerKind>(h.optimizer)) + ", " + std::to_string(h.num_keys) +
                      " keys; this PS has dim " + std::to_string(config_.dim) + ", " + optimizer_name(config_.optimizer.kind) + ", " +
                      std::to_string(config_.num_keys) + " keys");
    }
    if (config_.hashed_ids && !hashed(h) && h.version < 4) {
      throw DataError(name + ": a checkpoint of version " + std::to_string(h.version) +
                      ", written before its rows named their ids (format 4); this PS serves hashed ids and cannot tell its "
                      "rows' ids: restore it with the ember-ps that wrote it");
    }
    if (hashed(h) != config_.hashed_ids) {
      throw DataError(name + ": written for a dataset of " + (hashed(h) ? "hashed ids (dynamic tables)" : "vocabulary ids") +
                      ", and this PS serves one of " + (config_.hashed_ids ? "hashed ids" : "vocabulary ids"));
    }
    const std::size_t hb = header_bytes(h.version), record = record_bytes(h);
    const std::size_t at_row = record - rf * sizeof(float);
    const std::size_t block = std::max<std::size_t>(1, (4u << 20) / record) * record;
    read_blocks(f, hb, hb + h.rows * record, block, [&](const char* p, std::size_t n) {
      for (const char* end = p + n; p < end; p += record) {
        Key key;
        std::uint64_t id = kNoId;
        std::memcpy(&key, p, sizeof key);
        if (hashed(h)) std::memcpy(&id, p + sizeof key, sizeof id);
        take(name, key, id, p + at_row);
      }
    });
  };
  for (const auto& f : files) load_file(f);
}

std::int64_t ShardStore::load_replaced(const std::vector<std::filesystem::path>& files, std::int64_t iteration) {
  const std::uint32_t rf = row_floats();
  delta_previous_ = DeltaInfo::kNoPrevious;  // slots placed anew: a follower must load the next checkpoint whole
  // Two passes, so that no row is held twice (a tiered shard's rows exceed its memory).
  // First each old slot's last id, where it is one this shard takes (a later file of a
  // chain replaces its base's record of a slot: a new id, or the slot freed).
  U64Map<std::uint64_t> id_at;  // old slot -> id
  read_records(files, [&](const std::string&, Key key, std::uint64_t id, const char*) {
    if (id != kNoId && shard_of_id(id, config_.shards) == config_.shard)
      *id_at.try_emplace(key).first = id;
    else
      id_at.erase(key);
  });
  std::vector<std::pair<std::uint64_t, Key>> by_id;  // (id, old slot), ascending
  id_at.for_each([&](std::uint64_t key, std::uint64_t id) { by_id.emplace_back(id, key); });
  std::sort(by_id.begin(), by_id.end());
  const std::string where = files[0].parent_path().string();
  if (by_id.size() > local_rows()) {
    throw DataError(where + ": shard " + std::to_string(config_.shard) + " of " + std::to_string(config_.shards) + " takes " +
                    std::to_string(by_id.size()) + " of its rows and has " + std::to_string(local_rows()) +
                    " slots (ember-ps --slots-per-shard)");
  }
  U64Map<std::uint64_t> slot_of;  // old slot -> this shard's local slot
  for (std::size_t j = 0; j < by_id.size(); ++j) {
    if (j > 0 && by_id[j].first == by_id[j - 1].first)
      throw DataError(where + ": id " + std::to_string(by_id[j].first) + " in two slots (corrupt checkpoint)");
    *slot_of.try_emplace(by_id[j].second).first = j;
    set_slot_id(j, by_id[j].first);
  }
  // Then the rows: each old slot's records of its last id, in order (the last wins).
  read_records(files, [&](const std::string&, Key key, std::uint64_t id, const char* row) {
    const std::uint64_t* j = slot_of.find(key);
    if (j == nullptr || slot_ids_[*j] - 1 != id) return;
    std::memcpy(read_row(arena_.key_of(*j), true, true).get(), row, rf * sizeof(float));
  });
  return iteration;
}

std::uint64_t checkpoint_checksum(const std::filesystem::path& file) {
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(file, ec);
  if (ec) throw IoError(file.string() + ": " + ec.message());
  if (size < kHeaderV1Bytes + sizeof(std::uint64_t)) throw DataError(file.string() + ": truncated checkpoint");
  std::uint64_t stored = 0;
  read_blocks(file, size - sizeof stored, size, sizeof stored, [&](const char* p, std::size_t) { std::memcpy(&stored, p, sizeof stored); });
  return stored;
}

void verify_checkpoint_file(const std::filesystem::path& file) {
  // The record size follows from the header (dim and optimizer state floats), so the file
  // is checked without a store of its geometry. An incremental one's bases are too.
  const CheckpointHeader h = read_checked(file);
  if (h.base != kNoBase) verify_checkpoint_file(base_file(file, h));
}

ShardStore::CheckpointInfo ShardStore::checkpoint_info(const std::filesystem::path& file) {
  const CheckpointHeader h = header_of(file);
  if (h.optimizer > static_cast<std::uint32_t>(OptimizerKind::kAdam)) {
    throw DataError(file.string() + ": unknown optimizer " + std::to_string(h.optimizer));
  }
  CheckpointInfo info;
  info.dim = h.dim;
  info.optimizer = static_cast<OptimizerKind>(h.optimizer);
  info.shard = h.shard;
  info.shards = h.shards;
  info.num_keys = h.num_keys;
  info.rows = h.rows;
  info.iteration = h.iteration;
  if (h.base != kNoBase) info.base = h.base;
  info.hashed_ids = hashed(h);
  return info;
}

std::int64_t ShardStore::check_checkpoint_set(const std::vector<std::filesystem::path>& files) {
  if (files.empty()) throw DataError("no checkpoint files to load");
  std::map<std::uint32_t, std::filesystem::path> by_shard;
  CheckpointHeader first{};
  for (std::size_t i = 0; i < files.size(); ++i) {
    const CheckpointHeader h = header_of(files[i]);
    if (i == 0) first = h;
    if (h.shards != first.shards || h.iteration != first.iteration) {
      throw DataError(files[i].string() + " (" + std::to_string(h.shards) + " shards, iteration " + std::to_string(h.iteration) + ") and " +
                      files[0].string() + " (" + std::to_string(first.shards) + " shards, iteration " + std::to_string(first.iteration) +
                      ") are not one checkpoint (restore one checkpoint's directory, or the --checkpoint-dir above them)");
    }
    if (h.shard >= h.shards) throw DataError(files[i].string() + ": shard " + std::to_string(h.shard) + " of " + std::to_string(h.shards));
    auto [at, fresh] = by_shard.emplace(h.shard, files[i]);
    if (!fresh) throw DataError(files[i].string() + " and " + at->second.string() + " both hold shard " + std::to_string(h.shard));
  }
  for (std::uint32_t s = 0; s < first.shards; ++s) {
    if (!by_shard.contains(s)) {
      throw DataError("checkpoint of " + std::to_string(first.shards) + " shards (iteration " + std::to_string(first.iteration) +
                      ") without shard " + std::to_string(s) + "'s file: its rows would keep their initial values");
    }
  }
  return first.iteration;
}

}  // namespace ember::ps
