#include "ember/ps/serving_delta.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "ember/common/binary_header.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"

namespace ember::ps {
namespace {

constexpr BinaryFormat kDeltaFormat{{'E', 'M', 'B', 'R', 'D', 'L', 'T', 'A'}, "serving delta", 2, 2};
constexpr std::uint64_t kHashedIds = 1;

struct DeltaHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t dim;
  std::uint32_t shard;
  std::uint32_t shards;
  std::uint64_t num_keys;
  std::int64_t iteration;
  std::int64_t previous;
  std::uint64_t flags;
  std::uint64_t updated, created, freed;
  std::uint64_t previous_sum;
  std::uint64_t own_sum;
};
static_assert(sizeof(DeltaHeader) == 96 && offsetof(DeltaHeader, dim) == kBinaryHeaderBytes);

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

DeltaInfo info_of(const DeltaHeader& h, std::uint64_t bytes) {
  DeltaInfo i;
  i.dim = h.dim;
  i.shard = h.shard;
  i.shards = h.shards;
  i.num_keys = h.num_keys;
  i.iteration = h.iteration;
  i.previous = h.previous;
  i.hashed_ids = (h.flags & kHashedIds) != 0;
  i.updated = h.updated;
  i.created = h.created;
  i.freed = h.freed;
  i.previous_sum = h.previous_sum;
  i.own_sum = h.own_sum;
  i.bytes = bytes;
  return i;
}

DeltaHeader parse_header(const std::string& name, const std::string& head) {
  read_binary_header(kDeltaFormat, name, head);
  if (head.size() < sizeof(DeltaHeader)) throw DataError(name + ": truncated serving delta");
  DeltaHeader h;
  std::memcpy(&h, head.data(), sizeof h);
  if (h.shards == 0 || h.shard >= h.shards || h.dim == 0) {
    throw DataError(name + ": shard " + std::to_string(h.shard) + " of " + std::to_string(h.shards) + ", dim " + std::to_string(h.dim) +
                    " (corrupt serving delta)");
  }
  return h;
}

}  // namespace

std::string delta_file_name(std::uint32_t shard, std::uint32_t shards) {
  return "shard-" + std::to_string(shard) + "-of-" + std::to_string(shards) + ".delta";
}

void DeltaWriter::add(std::uint64_t local, DeltaKind kind, std::uint64_t id, const float* row) {
  if (local < next_) throw Error("serving delta: slots out of order");
  put_varint(body_, (local - next_) << 2 | static_cast<std::uint64_t>(kind));
  next_ = local + 1;
  if (kind == DeltaKind::kNewId) body_.append(reinterpret_cast<const char*>(&id), sizeof id);
  if (kind != DeltaKind::kFreed) body_.append(reinterpret_cast<const char*>(row), info_.dim * sizeof(float));
  (kind == DeltaKind::kRow ? info_.updated : kind == DeltaKind::kNewId ? info_.created : info_.freed) += 1;
}

DeltaInfo DeltaWriter::write(const std::filesystem::path& file) {
  DeltaHeader h{};
  write_binary_header(kDeltaFormat, &h);
  h.dim = info_.dim;
  h.shard = info_.shard;
  h.shards = info_.shards;
  h.num_keys = info_.num_keys;
  h.iteration = info_.iteration;
  h.previous = info_.previous;
  h.flags = info_.hashed_ids ? kHashedIds : 0;
  h.updated = info_.updated;
  h.created = info_.created;
  h.freed = info_.freed;
  h.previous_sum = info_.previous_sum;
  h.own_sum = info_.own_sum;
  Checksum64 sum;
  sum.update(&h, sizeof h);
  sum.update(body_.data(), body_.size());
  const std::uint64_t digest = sum.digest();
  write_file_atomic(file, [&](const std::function<void(std::string_view)>& out) {
    out(std::string_view(reinterpret_cast<const char*>(&h), sizeof h));
    out(body_);
    out(std::string_view(reinterpret_cast<const char*>(&digest), sizeof digest));
  });
  info_.bytes = sizeof h + body_.size() + sizeof digest;
  return info_;
}

DeltaInfo delta_info(const std::filesystem::path& file) {
  const std::string name = file.string();
  const DeltaHeader h = parse_header(name, read_file_head(file, sizeof(DeltaHeader)));
  std::error_code ec;
  const std::uint64_t bytes = std::filesystem::file_size(file, ec);
  if (ec) throw IoError(name + ": " + ec.message());
  return info_of(h, bytes);
}

DeltaInfo read_delta(const std::filesystem::path& file, const DeltaRecord& take) {
  const std::string name = file.string();
  const std::string bytes = read_file(file);
  const DeltaHeader h = parse_header(name, bytes);
  if (bytes.size() < sizeof h + sizeof(std::uint64_t)) throw DataError(name + ": truncated serving delta");
  const std::size_t end = bytes.size() - sizeof(std::uint64_t);
  Checksum64 sum;
  sum.update(bytes.data(), end);
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + end, sizeof stored);
  if (stored != sum.digest()) throw DataError(name + ": checksum mismatch (corrupt or truncated serving delta)");
  const auto corrupt = [&](const char* what) { return DataError(name + ": " + what + " (corrupt serving delta)"); };
  const std::size_t row_bytes = h.dim * sizeof(float);
  std::vector<float> row(h.dim);
  std::uint64_t next = 0, records = 0;
  for (std::size_t at = sizeof h; at < end; ++records) {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= end || shift > 63) throw corrupt("a record cut short");
      const auto byte = static_cast<std::uint8_t>(bytes[at++]);
      v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
    }
    const auto kind = static_cast<DeltaKind>(v & 3);
    if ((v & 3) == 3) throw corrupt("a record of unknown kind");
    const std::uint64_t local = next + (v >> 2);
    next = local + 1;
    std::uint64_t id = kNoId;
    const std::size_t need = (kind == DeltaKind::kNewId ? sizeof id : 0) + (kind == DeltaKind::kFreed ? 0 : row_bytes);
    if (end - at < need) throw corrupt("a record cut short");
    if (kind == DeltaKind::kNewId) std::memcpy(&id, bytes.data() + at, sizeof id), at += sizeof id;
    const float* r = nullptr;
    if (kind != DeltaKind::kFreed) {
      std::memcpy(row.data(), bytes.data() + at, row_bytes);  // aligned for the caller
      at += row_bytes;
      r = row.data();
    }
    const Key key = local * h.shards + h.shard;
    if (key >= h.num_keys) throw corrupt("a slot beyond the tables");
    take(key, kind, id, r);
  }
  if (records != h.updated + h.created + h.freed) throw corrupt("records do not match the header's counts");
  return info_of(h, bytes.size());
}

}  // namespace ember::ps
