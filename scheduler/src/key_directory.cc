#include "ember/scheduler/key_directory.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "ember/common/binary_header.h"
#include "ember/common/byte_io.h"
#include "ember/common/error.h"
#include "ember/common/fast_div.h"
#include "ember/common/hash.h"

namespace ember::scheduler {
namespace {

constexpr BinaryFormat kDirectoryFormat{{'E', 'M', 'B', 'R', 'K', 'D', 'I', 'R'}, "key directory", 2, 2};

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
    sh.last.assign(per_shard_, kNone);
    sh.free.resize(per_shard_);
    // The stack's back is taken first: slots 0, 1, 2, ... in order.
    for (std::uint64_t j = 0; j < per_shard_; ++j) sh.free[j] = static_cast<std::uint32_t>(per_shard_ - 1 - j);
  }
  if (o_.create_after > 1) filter_.assign(o_.create_filter_bytes, 0);
}

void KeyDirectory::touch(Shard& sh, std::uint32_t j, std::uint32_t iteration) {
  // Met before in this batch: it keeps the place its first appearance gave it (rows of
  // one iteration are ordered by first appearance).
  if (!recency_) return;
  std::uint32_t& last = sh.last[j];
  if (last == iteration) return;
  last = iteration;
  sh.log.push_back({j, iteration});
}

std::uint32_t KeyDirectory::least_recent(Shard& sh) {
  // Most records read are stale (their rows appeared since): each reads a slot that
  // misses the cache, so fetch the slots of records a few ahead.
  constexpr std::size_t kAhead = 16;
  while (sh.log_front < sh.log.size()) {
    if (sh.log_front + kAhead < sh.log.size()) __builtin_prefetch(&sh.last[sh.log[sh.log_front + kAhead].slot]);
    const Touch& r = sh.log[sh.log_front];
    if (sh.last[r.slot] == r.iteration) return r.slot;
    ++sh.log_front;
  }
  return kNone;
}

void KeyDirectory::compact(Shard& sh) {
  // Only once the consumed records, or the stale ones, outnumber the current: a record
  // costs O(1) over its life.
  const std::size_t records = sh.log.size() - sh.log_front;
  if (sh.log_front <= records && records <= 2 * sh.counts.live + 4096) return;
  std::size_t w = 0;
  for (std::size_t i = sh.log_front; i < sh.log.size(); ++i) {
    const Touch r = sh.log[i];
    if (sh.last[r.slot] == r.iteration) sh.log[w++] = r;
  }
  sh.log.resize(w);
  sh.log_front = 0;
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
    return *slot;  // touched by admit()'s second pass
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
  // With recency, a `last` other than this iteration: the second pass logs it in the
  // batch's order. (Without, `last` is never read: 0, as saved.)
  sh.id[j] = id;
  sh.last[j] = recency_ ? ~iteration : 0;
  ++sh.counts.created;
  ++sh.counts.live;
  const Key slot = key_of(s, j);
  index_.try_emplace(id, slot);
  if (created != nullptr) created->push_back({slot, id});
  return slot;
}

void KeyDirectory::admit(std::uint64_t iteration, GlobalBatch& batch, std::vector<SlotAssignment>* created) {
  // Appearances are kept as 32-bit iterations, kNone meaning none.
  if (iteration >= kNone) throw Error("dynamic tables count iterations below 2^32 - 1, not " + std::to_string(iteration));
  const auto it = static_cast<std::uint32_t>(iteration);
  batch_refused_.clear();
  bool refused = false;
  // The index and the slots miss the cache on nearly every id: fetch 16 ids ahead.
  constexpr std::size_t kAhead = 16;
  const std::size_t n = batch.keys.size();
  std::size_t i = 0;
  try {
    for (; i < n; ++i) {
      if (i + kAhead < n) index_.prefetch(U64Map<Key>::hash(batch.keys[i + kAhead]));
      Key& k = batch.keys[i];
      k = resolve(k, it, created);
      refused |= k == kNoId;
    }
  } catch (...) {
    touch_all(std::span<const Key>(batch.keys.data(), i), it);  // the rows made so far stay consistent
    throw;
  }
  if (refused) leave_bags(batch.keys, batch.bags, batch.samples, batch.tables);
  touch_all(batch.keys, it);
}

void KeyDirectory::touch_all(std::span<const Key> slots, std::uint32_t iteration) {
  if (!recency_) return;
  // The rows' appearances, in the order the batch met them: a second pass over slots
  // (their addresses known ahead) costs less than touching them while resolving.
  constexpr std::size_t kAhead = 16;
  const std::size_t n = slots.size();
  const FastDiv shards(o_.shards);  // a slot's shard and place without a hardware divide
  const auto at = [&](Key k) -> std::uint32_t& {
    const std::uint64_t j = shards.quotient(k);
    return shards_[k - j * shards.divisor()].last[j];
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && slots[i + kAhead] != kNoId) __builtin_prefetch(&at(slots[i + kAhead]), 1);
    const Key k = slots[i];
    if (k != kNoId) {
      const std::uint64_t j = shards.quotient(k);
      touch(shards_[k - j * shards.divisor()], static_cast<std::uint32_t>(j), iteration);
    }
  }
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
  gone_.push_back(sh.id[j]);  // leaves the index at the end of end_iteration()
  sh.id[j] = kNoId;
  sh.last[j] = kNone;  // its records are stale
  sh.free.push_back(j);
  --sh.counts.live;
  if (dropped != nullptr) dropped->push_back(key_of(s, j));
}

void KeyDirectory::end_iteration(std::uint64_t iteration, std::vector<Key>* dropped) {
  if (!recency_) return;
  const auto t = static_cast<std::uint32_t>(iteration);
  for (std::uint32_t s = 0; s < o_.shards; ++s) {
    Shard& sh = shards_[s];
    if (o_.expire_after > 0) {
      for (std::uint32_t j; (j = least_recent(sh)) != kNone && static_cast<std::uint64_t>(sh.last[j]) + o_.expire_after <= t;) {
        drop(s, j, dropped);
        ++sh.counts.expired;
      }
    }
    if (o_.shard_max_rows > 0) {
      for (std::uint32_t j; sh.counts.live > o_.shard_max_rows && (j = least_recent(sh)) != kNone && sh.last[j] != t;) {
        drop(s, j, dropped);
        ++sh.counts.capped;
      }
    }
    compact(sh);
  }
  // The index misses the cache on each: fetch the slot of the id 8 ahead.
  constexpr std::size_t kAhead = 8;
  for (std::size_t i = 0; i < gone_.size(); ++i) {
    if (i + kAhead < gone_.size()) index_.prefetch(U64Map<Key>::hash(gone_[i + kAhead]));
    index_.erase(gone_[i]);
  }
  gone_.clear();
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
  std::size_t b = index_.memory_bytes() + filter_.size() + batch_refused_.memory_bytes() + gone_.capacity() * 8;
  for (const Shard& sh : shards_) {
    b += sh.id.capacity() * 8 + sh.last.capacity() * 4 + sh.log.capacity() * sizeof(Touch) + sh.free.capacity() * 4;
  }
  return b;
}

// The saved state: the options and slots, then per shard its counts, its live slots
// (slot, id, last appearance) from the most recent down (by slot without recency)
// and its free stack, then the filter.
std::string KeyDirectory::save() const {
  std::string out(kBinaryHeaderBytes, '\0');
  write_binary_header(kDirectoryFormat, out.data());
  put(out, o_.shards);
  put(out, o_.create_after);
  put(out, o_.create_filter_bytes);
  put(out, o_.expire_after);
  put(out, o_.shard_max_rows);
  put(out, per_shard_);
  put(out, placed_at_);
  for (const Shard& sh : shards_) {
    put(out, sh.counts);
    std::vector<LiveSlot> live;
    for_each_live(sh, [&](std::uint32_t j) { live.push_back({j, sh.last[j], sh.id[j]}); });
    put_vector(out, live);
    put_vector(out, sh.free);
  }
  put_vector(out, filter_);
  return out;
}

template <typename F>
void KeyDirectory::for_each_live(const Shard& sh, F&& f) const {
  if (recency_) {
    for (std::size_t i = sh.log.size(); i-- > sh.log_front;) {
      const Touch r = sh.log[i];
      if (sh.last[r.slot] == r.iteration) f(r.slot);
    }
  } else {
    for (std::uint32_t j = 0; j < sh.id.size(); ++j)
      if (sh.id[j] != kNoId) f(j);
  }
}

void KeyDirectory::place(std::uint32_t s, std::uint32_t j, std::uint64_t id, std::uint32_t last) {
  Shard& sh = shards_[s];
  sh.id[j] = id;
  sh.last[j] = last;
  if (recency_) sh.log.push_back({j, last});
  index_.try_emplace(id, key_of(s, j));
}

void KeyDirectory::end_placing(std::uint32_t s) {
  // Placed from the most recent down: the log runs the other way.
  std::reverse(shards_[s].log.begin(), shards_[s].log.end());
}

KeyDirectory KeyDirectory::load(const std::string& bytes, const std::string& origin) {
  read_binary_header(kDirectoryFormat, origin, bytes);
  ByteReader r(bytes, kBinaryHeaderBytes, origin, "key directory");
  DynamicTableOptions o;
  o.shards = r.get<std::uint32_t>();
  o.create_after = r.get<std::uint32_t>();
  o.create_filter_bytes = r.get<std::uint64_t>();
  o.expire_after = r.get<std::uint64_t>();
  o.shard_max_rows = r.get<std::uint64_t>();
  const auto per_shard = r.get<std::uint64_t>();
  const auto placed_at = r.get<std::uint64_t>();
  std::optional<KeyDirectory> made;
  try {
    made.emplace(o, per_shard);
  } catch (const ConfigError& e) {
    throw DataError(origin + ": " + e.what());
  }
  KeyDirectory& d = *made;
  d.placed_at_ = placed_at;
  for (std::uint32_t s = 0; s < o.shards; ++s) {
    Shard& sh = d.shards_[s];
    sh.counts = r.get<DirectoryCounts>();
    const auto live = r.get_vector<LiveSlot>();
    sh.free = r.get_vector<std::uint32_t>();
    bool bad = live.size() != sh.counts.live || live.size() + sh.free.size() != per_shard;
    for (const LiveSlot& x : live) {
      bad = bad || x.slot >= per_shard || sh.id[x.slot] != kNoId || x.id == kNoId || x.last == kNone || d.index_.find(x.id) != nullptr;
      if (!bad) d.place(s, x.slot, x.id, x.last);
    }
    // Saved from the most recent down: an older `last` after a newer one is corrupt.
    for (std::size_t i = 1; i < live.size() && d.recency_; ++i) bad = bad || live[i].last > live[i - 1].last;
    d.end_placing(s);
    std::vector<bool> freed(per_shard);
    for (std::uint32_t j : sh.free) {
      bad = bad || j >= per_shard || sh.id[j] != kNoId || freed[j];
      if (!bad) freed[j] = true;
    }
    if (bad) throw DataError(origin + ": key directory shard " + std::to_string(s) + " is inconsistent (corrupt)");
  }
  d.filter_ = r.get_vector<std::uint8_t>();
  if (d.filter_.size() != (o.create_after > 1 ? o.create_filter_bytes : 0))
    throw DataError(origin + ": the creation filter's size is wrong");
  if (!r.done()) throw DataError(origin + ": trailing bytes after the key directory");
  return std::move(*made);
}

KeyDirectory KeyDirectory::load(const std::string& bytes, DynamicTableOptions options, std::uint64_t slots_per_shard,
                                const std::string& origin) {
  KeyDirectory d = load(bytes, origin);
  if (d.o_.shards != options.shards || d.per_shard_ != slots_per_shard || !d.decides_as(options)) {
    throw DataError(origin +
                    ": saved with other dynamic-table options (shards, --create-after, --create-filter-mb, --expire-after, "
                    "--shard-max-rows or slots); resume with the job's own");
  }
  return d;
}

bool KeyDirectory::decides_as(const DynamicTableOptions& o) const {
  return o.create_after == o_.create_after && o.create_filter_bytes == o_.create_filter_bytes && o.expire_after == o_.expire_after &&
         o.shard_max_rows == o_.shard_max_rows;
}

KeyDirectory KeyDirectory::reshard(DynamicTableOptions options, std::uint64_t slots_per_shard, std::uint64_t headroom,
                                   std::uint64_t iteration) const {
  if (!decides_as(options)) {
    throw ConfigError("dynamic tables made with --create-after " + std::to_string(o_.create_after) + ", --create-filter-mb " +
                      std::to_string(o_.create_filter_bytes >> 20) + ", --expire-after " + std::to_string(o_.expire_after) +
                      ", --shard-max-rows " + std::to_string(o_.shard_max_rows) + " go on with the same");
  }
  KeyDirectory d(options, slots_per_shard);
  d.placed_at_ = iteration;
  // Each live row, in the order the new recency logs take them: the most recent first,
  // ties by old shard, then by the old list's order.
  struct Row {
    std::uint64_t id;
    std::uint32_t last, old_shard, rank;
  };
  std::vector<std::vector<Row>> to(options.shards);
  for (std::uint32_t s = 0; s < o_.shards; ++s) {
    std::uint32_t rank = 0;
    for_each_live(shards_[s], [&](std::uint32_t j) {
      const std::uint64_t id = shards_[s].id[j];
      to[shard_of_id(id, options.shards)].push_back({id, shards_[s].last[j], s, rank++});
    });
    // Counts of what happened go to the shard of the same number, modulo the new count.
    DirectoryCounts& c = d.shards_[s % options.shards].counts;
    const DirectoryCounts& old = shards_[s].counts;
    c.created += old.created, c.refused += old.refused, c.expired += old.expired, c.capped += old.capped;
  }
  for (std::uint32_t s = 0; s < options.shards; ++s) {
    std::vector<Row>& rows = to[s];
    if (rows.size() + headroom > slots_per_shard) {
      throw ConfigError("PS shard " + std::to_string(s) + " of " + std::to_string(options.shards) + " takes " +
                        std::to_string(rows.size()) + " live rows and needs room for " + std::to_string(headroom) +
                        " new ones a batch; it has " + std::to_string(slots_per_shard) + " slots (ember-ps --slots-per-shard)");
    }
    // Slots by ascending id, as a PS shard re-places a checkpoint's rows (ShardStore::load).
    std::vector<std::uint64_t> ids(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) ids[i] = rows[i].id;
    std::sort(ids.begin(), ids.end());
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.last != b.last ? a.last > b.last : a.old_shard != b.old_shard ? a.old_shard < b.old_shard : a.rank < b.rank;
    });
    Shard& sh = d.shards_[s];
    for (const Row& x : rows) {
      const auto j = static_cast<std::uint32_t>(std::lower_bound(ids.begin(), ids.end(), x.id) - ids.begin());
      d.place(s, j, x.id, x.last);
    }
    d.end_placing(s);
    sh.counts.live = rows.size();
    // The stack's back is taken first: the lowest free slot next.
    sh.free.clear();
    for (std::uint64_t j = slots_per_shard; j-- > rows.size();) sh.free.push_back(static_cast<std::uint32_t>(j));
  }
  d.filter_ = filter_;
  return d;
}

}  // namespace ember::scheduler
