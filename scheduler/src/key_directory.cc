#include "ember/scheduler/key_directory.h"

#include <algorithm>
#include <cstring>

#include "ember/common/binary_header.h"
#include "ember/common/byte_io.h"
#include "ember/common/error.h"
#include "ember/common/hash.h"

namespace ember::scheduler {
namespace {

constexpr BinaryFormat kDirectoryFormat{{'E', 'M', 'B', 'R', 'K', 'D', 'I', 'R'}, "key directory", 1, 1};

// Keys set to KeyDirectory::kNoId leave their bags: one-hot keys (`bags` empty) take
// bags of 0 or 1 keys.
void leave_bags(std::vector<Key>& keys, std::vector<std::uint32_t>& bags, std::uint32_t samples, std::uint32_t tables) {
  const std::size_t n = static_cast<std::size_t>(samples) * tables;
  std::vector<std::uint32_t> out(n + 1);
  std::size_t w = 0;
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t begin = bags.empty() ? b : bags[b];
    const std::size_t end = bags.empty() ? b + 1 : bags[b + 1];
    out[b] = static_cast<std::uint32_t>(w);
    for (std::size_t i = begin; i < end; ++i) {
      if (keys[i] != KeyDirectory::kNoId) keys[w++] = keys[i];
    }
  }
  out[n] = static_cast<std::uint32_t>(w);
  keys.resize(w);
  bags = std::move(out);
}

}  // namespace

DirectoryCounts& DirectoryCounts::operator+=(const DirectoryCounts& o) {
  live += o.live;
  created += o.created;
  refused += o.refused;
  expired += o.expired;
  capped += o.capped;
  return *this;
}

KeyDirectory::KeyDirectory(DynamicTableOptions options, std::uint64_t slots_per_shard)
    : o_(options), recency_(options.expire_after > 0 || options.shard_max_rows > 0), per_shard_(slots_per_shard) {
  if (o_.shards == 0) throw ConfigError("dynamic tables need at least one PS shard");
  if (o_.create_after == 0 || o_.create_after > 255) throw ConfigError("--create-after must be in [1, 255]");
  if (o_.create_after > 1 && o_.create_filter_bytes < 64) throw ConfigError("--create-filter-mb: the filter needs at least 64 bytes");
  if (per_shard_ == 0 || per_shard_ >= kNone) throw ConfigError("slots per shard must be in [1, 2^32 - 1)");
  if (o_.shard_max_rows > 0 && per_shard_ < o_.shard_max_rows) {
    throw ConfigError("--shard-max-rows " + std::to_string(o_.shard_max_rows) + " is above the shard's " + std::to_string(per_shard_) +
                      " slots");
  }
  shards_.resize(o_.shards);
  for (Shard& sh : shards_) {
    sh.id.assign(per_shard_, kNoId);
    sh.node.assign(per_shard_, Node{kNone, kNone, 0});
    sh.free.resize(per_shard_);
    // The stack's back is taken first: slots 0, 1, 2, ... in order.
    for (std::uint64_t j = 0; j < per_shard_; ++j) sh.free[j] = static_cast<std::uint32_t>(per_shard_ - 1 - j);
  }
  if (o_.create_after > 1) filter_.assign(o_.create_filter_bytes, 0);
}

void KeyDirectory::unlink(Shard& sh, std::uint32_t j) {
  const std::uint32_t p = sh.node[j].prev, n = sh.node[j].next;
  (p == kNone ? sh.head : sh.node[p].next) = n;
  (n == kNone ? sh.tail : sh.node[n].prev) = p;
  sh.node[j].prev = sh.node[j].next = kNone;
}

void KeyDirectory::touch(Shard& sh, std::uint32_t j, std::uint32_t iteration) {
  // Met before in this batch: it stays where its first appearance put it (rows of one
  // iteration are ordered by first appearance).
  Node& x = sh.node[j];
  if (!recency_) return;
  const bool linked = x.prev != kNone || sh.head == j;
  if (x.last == iteration && linked) return;
  x.last = iteration;
  if (sh.head == j) return;
  if (linked) unlink(sh, j);
  x.next = sh.head;
  if (sh.head != kNone) sh.node[sh.head].prev = j;
  sh.head = j;
  if (sh.tail == kNone) sh.tail = j;
}

std::uint32_t KeyDirectory::count_appearance(std::uint64_t id) {
  const std::uint64_t n = filter_.size();
  const std::size_t a = mix64(id ^ 0x243f6a8885a308d3ULL) % n, b = mix64(id ^ 0x13198a2e03707344ULL) % n;
  const std::uint32_t now = std::min<std::uint32_t>(255, std::min(filter_[a], filter_[b]) + 1u);
  // Conservative update: raise only the counters below the new estimate.
  filter_[a] = static_cast<std::uint8_t>(std::max<std::uint32_t>(filter_[a], now));
  filter_[b] = static_cast<std::uint8_t>(std::max<std::uint32_t>(filter_[b], now));
  return now;
}

Key KeyDirectory::resolve(std::uint64_t id, std::uint32_t iteration, std::vector<SlotAssignment>* created) {
  if (const Key* slot = index_.find_hashed(id, U64Map<Key>::hash(id))) {
    Shard& sh = shards_[*slot % o_.shards];
    touch(sh, static_cast<std::uint32_t>(*slot / o_.shards), iteration);
    return *slot;
  }
  if (batch_refused_.find(id) != nullptr) return kNoId;
  if (o_.create_after > 1 && count_appearance(id) < o_.create_after) {
    batch_refused_.try_emplace(id, 1);
    ++shards_[shard_of_id(id, o_.shards)].counts.refused;
    return kNoId;
  }
  const std::uint32_t s = shard_of_id(id, o_.shards);
  Shard& sh = shards_[s];
  if (sh.free.empty()) {
    throw Error("PS shard " + std::to_string(s) + " has no free slot for a new row (" + std::to_string(per_shard_) +
                " slots); raise ember-ps --slots-per-shard or lower --shard-max-rows");
  }
  const std::uint32_t j = sh.free.back();
  sh.free.pop_back();
  sh.id[j] = id;
  touch(sh, j, iteration);
  ++sh.counts.created;
  ++sh.counts.live;
  const Key slot = key_of(s, j);
  index_.try_emplace(id, slot);
  if (created != nullptr) created->push_back({slot, id});
  return slot;
}

void KeyDirectory::admit(std::uint64_t iteration, GlobalBatch& batch, std::vector<SlotAssignment>* created) {
  const auto it = static_cast<std::uint32_t>(iteration);
  batch_refused_.clear();
  bool refused = false;
  // The index misses the cache on nearly every id: fetch a few ids ahead.
  // The index and the recency nodes miss the cache on nearly every id: fetch the index
  // slot 16 ids ahead, then the node of what it holds 8 ids ahead.
  constexpr std::size_t kIndexAhead = 16, kNodeAhead = 8;
  const std::size_t n = batch.keys.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kIndexAhead < n) index_.prefetch(U64Map<Key>::hash(batch.keys[i + kIndexAhead]));
    if (recency_ && i + kNodeAhead < n) {
      if (const Key* slot = index_.find(batch.keys[i + kNodeAhead]))
        __builtin_prefetch(&shards_[*slot % o_.shards].node[*slot / o_.shards], 1);
    }
    Key& k = batch.keys[i];
    k = resolve(k, it, created);
    refused |= k == kNoId;
  }
  if (refused) leave_bags(batch.keys, batch.bags, batch.samples, batch.tables);
}

void KeyDirectory::lookup(std::vector<Key>& keys, std::vector<std::uint32_t>& bags, std::uint32_t samples, std::uint32_t tables) const {
  bool absent = false;
  for (Key& k : keys) {
    const Key* slot = index_.find(k);
    k = slot != nullptr ? *slot : kNoId;
    absent |= k == kNoId;
  }
  if (absent) leave_bags(keys, bags, samples, tables);
}

void KeyDirectory::drop(std::uint32_t s, std::uint32_t j, std::vector<Key>* dropped) {
  Shard& sh = shards_[s];
  unlink(sh, j);
  index_.erase(sh.id[j]);
  sh.id[j] = kNoId;
  sh.free.push_back(j);
  --sh.counts.live;
  if (dropped != nullptr) dropped->push_back(key_of(s, j));
}

void KeyDirectory::end_iteration(std::uint64_t iteration, std::vector<Key>* dropped) {
  const auto t = static_cast<std::uint32_t>(iteration);
  for (std::uint32_t s = 0; s < o_.shards; ++s) {
    Shard& sh = shards_[s];
    if (o_.expire_after > 0) {
      while (sh.tail != kNone && static_cast<std::uint64_t>(sh.node[sh.tail].last) + o_.expire_after <= t) {
        drop(s, sh.tail, dropped);
        ++sh.counts.expired;
      }
    }
    if (o_.shard_max_rows > 0) {
      while (sh.counts.live > o_.shard_max_rows && sh.tail != kNone && sh.node[sh.tail].last != t) {
        drop(s, sh.tail, dropped);
        ++sh.counts.capped;
      }
    }
  }
}

std::uint64_t KeyDirectory::id_of(Key slot) const {
  const Shard& sh = shards_[slot % o_.shards];
  return sh.id[slot / o_.shards];
}

DirectoryCounts KeyDirectory::totals() const {
  DirectoryCounts c;
  for (const Shard& sh : shards_) c += sh.counts;
  return c;
}

std::size_t KeyDirectory::memory_bytes() const {
  std::size_t b = index_.memory_bytes() + filter_.size() + batch_refused_.memory_bytes();
  for (const Shard& sh : shards_) {
    b += sh.id.capacity() * 8 + sh.node.capacity() * sizeof(Node) + sh.free.capacity() * 4;
  }
  return b;
}

std::string KeyDirectory::save() const {
  std::string out(kBinaryHeaderBytes, '\0');
  write_binary_header(kDirectoryFormat, out.data());
  put(out, o_.shards);
  put(out, o_.create_after);
  put(out, o_.create_filter_bytes);
  put(out, o_.expire_after);
  put(out, o_.shard_max_rows);
  put(out, per_shard_);
  for (const Shard& sh : shards_) {
    put_vector(out, sh.id);
    put_vector(out, sh.node);
    put_vector(out, sh.free);
    put(out, sh.head);
    put(out, sh.tail);
    put(out, sh.counts);
  }
  put_vector(out, filter_);
  return out;
}

KeyDirectory KeyDirectory::load(const std::string& bytes, DynamicTableOptions options, std::uint64_t slots_per_shard,
                                const std::string& origin) {
  read_binary_header(kDirectoryFormat, origin, bytes);
  ByteReader r(bytes, kBinaryHeaderBytes, origin, "key directory");
  DynamicTableOptions saved;
  saved.shards = r.get<std::uint32_t>();
  saved.create_after = r.get<std::uint32_t>();
  saved.create_filter_bytes = r.get<std::uint64_t>();
  saved.expire_after = r.get<std::uint64_t>();
  saved.shard_max_rows = r.get<std::uint64_t>();
  const auto per_shard = r.get<std::uint64_t>();
  if (saved.shards != options.shards || saved.create_after != options.create_after ||
      saved.create_filter_bytes != options.create_filter_bytes || saved.expire_after != options.expire_after ||
      saved.shard_max_rows != options.shard_max_rows || per_shard != slots_per_shard) {
    throw DataError(origin +
                    ": saved with other dynamic-table options (shards, --create-after, --create-filter-mb, --expire-after, "
                    "--shard-max-rows or slots); resume with the job's own");
  }
  KeyDirectory d(options, slots_per_shard);
  for (std::uint32_t s = 0; s < options.shards; ++s) {
    Shard& sh = d.shards_[s];
    sh.id = r.get_vector<std::uint64_t>();
    sh.node = r.get_vector<Node>();
    sh.free = r.get_vector<std::uint32_t>();
    sh.head = r.get<std::uint32_t>();
    sh.tail = r.get<std::uint32_t>();
    sh.counts = r.get<DirectoryCounts>();
    if (sh.id.size() != per_shard || sh.node.size() != per_shard) {
      throw DataError(origin + ": key directory shard " + std::to_string(s) + " has the wrong number of slots");
    }
    for (std::uint32_t j = 0; j < per_shard; ++j) {
      if (sh.id[j] != kNoId) d.index_.try_emplace(sh.id[j], d.key_of(s, j));
    }
  }
  d.filter_ = r.get_vector<std::uint8_t>();
  if (!r.done()) throw DataError(origin + ": trailing bytes after the key directory");
  return d;
}

}  // namespace ember::scheduler
