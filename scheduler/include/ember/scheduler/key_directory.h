// KeyDirectory: the rows of dynamic tables (hashed 64-bit ids, `ember-data prep --ids
// hash`) and the decisions that make and drop them.
//
// Everything downstream of the loader (the scheduler's location map and cache models,
// the workers' caches, the PS arena) works on dense keys. For dynamic tables those keys
// are *slots*: each PS shard owns slots shard + shards * j, j < slots_per_shard, and the
// directory maps each live id to one. An id lives on shard shard_of_id(id) (its hash), so
// slots, and the state sized by them, follow the rows in play, not the id space.
//
// Decisions, taken from what appeared in global batches (never from what was pulled, so
// they do not depend on the policy), identically in every process that reads the same
// batches (each worker's scheduler, ember-sim, the one-process reference):
//  - creation: an id gets a row at the global batch where it has appeared in
//    `create_after` batches (counted by a counting filter of fixed size: a count-min
//    sketch with conservative updates, which may only count high, so a row may be made
//    early, never late). Until then its lookups leave the sample's bag: the sample sees
//    a zero vector and no gradient reaches a row.
//  - expiry: at the end of iteration t, a row whose last appearance is t - expire_after
//    or earlier is dropped.
//  - the cap: then, while a shard holds more than shard_max_rows rows, its least
//    recently appeared row is dropped (ties in the order the batch met them); rows of
//    iteration t itself are never capped.
// A dropped row's slot is free for the next batch; a later appearance makes the id anew.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/scheduler/global_batch.h"

namespace ember::scheduler {

struct DynamicTableOptions {
  std::uint32_t shards = 1;
  std::uint32_t create_after = 1;  // 1: a row at an id's first batch; at most 255
  std::uint64_t create_filter_bytes = 8u << 20;
  std::uint64_t expire_after = 0;    // iterations; 0: never
  std::uint64_t shard_max_rows = 0;  // 0: no cap
};

struct DirectoryCounts {
  std::uint64_t live = 0;
  std::uint64_t created = 0;
  std::uint64_t refused = 0;  // (batch, id) pairs kept out by the creation filter
  std::uint64_t expired = 0;
  std::uint64_t capped = 0;
  DirectoryCounts& operator+=(const DirectoryCounts& o);
  bool operator==(const DirectoryCounts&) const = default;
};

// A row made in this batch: its slot (the key downstream) and id. (A job's PS shards
// reset such slots, and clear dropped ones, named with id kNoId: protocol.h kResetRows.)
struct SlotAssignment {
  Key slot;
  std::uint64_t id;
};

class KeyDirectory {
 public:
  // `slots_per_shard`: the most rows one shard holds at once; with a cap, at least the
  // cap plus the new rows of one batch (slots_needed()). ConfigError for bad options.
  KeyDirectory(DynamicTableOptions options, std::uint64_t slots_per_shard);

  // Slots a shard needs for a cap of `shard_max_rows` and batches of at most
  // `batch_ids` ids each.
  static std::uint64_t slots_needed(std::uint64_t shard_max_rows, std::uint64_t batch_ids) { return shard_max_rows + batch_ids; }

  // Batch t's ids become slots, in place; ids the filter keeps out leave their bags (a
  // one-hot batch then takes bags). Rows made now are appended to `created` (if given),
  // in the order the batch met them. Error when a shard has no free slot (the rows made
  // before it stay consistent), or for an iteration of 2^32 - 1 or more.
  void admit(std::uint64_t iteration, GlobalBatch& batch, std::vector<SlotAssignment>* created = nullptr);
  // An evaluation's ids (samples x tables bags, `bags` empty: one-hot) to the slots of
  // their rows as they stand, ids without a row leaving their bags (their sample sees a
  // zero vector, as in training); nothing is made, touched or counted.
  void lookup(std::vector<Key>& keys, std::vector<std::uint32_t>& bags, std::uint32_t samples, std::uint32_t tables) const;
  // End of iteration t: rows expired, then capped, appended to `dropped` (slots, shard
  // by shard); their slots are free from now on.
  void end_iteration(std::uint64_t iteration, std::vector<Key>* dropped = nullptr);

  const DynamicTableOptions& options() const { return o_; }
  std::uint64_t slots_per_shard() const { return per_shard_; }
  // The dense key space downstream: shards * slots_per_shard.
  std::uint64_t slot_count() const { return per_shard_ * o_.shards; }
  // The id a live slot holds (kNoId: free).
  static constexpr std::uint64_t kNoId = ember::kNoId;
  std::uint64_t id_of(Key slot) const;
  DirectoryCounts totals() const;
  const DirectoryCounts& shard_counts(std::uint32_t shard) const { return shards_[shard].counts; }
  // Bytes held: the index, the per-slot arrays and the filter.
  std::size_t memory_bytes() const;

  // The whole state (live rows with their last appearance, free slots, counts, the
  // filter), to resume a job exactly. load() checks what it reads (DataError naming
  // `origin`); the second also that it was saved with these options and slots.
  std::string save() const;
  static KeyDirectory load(const std::string& bytes, const std::string& origin);
  static KeyDirectory load(const std::string& bytes, DynamicTableOptions options, std::uint64_t slots_per_shard, const std::string& origin);
  // Whether `o` makes, expires and caps rows as this directory does (all but the shards).
  bool decides_as(const DynamicTableOptions& o) const;
  // The same rows on `options.shards` shards of `slots_per_shard` slots: each live id goes
  // to shard_of_id() of the new count, whose ids take its slots 0, 1, ... by ascending id
  // (as a PS shard re-places a checkpoint's rows), with their last appearance; the
  // recency logs keep the order of last appearance (ties: by old shard, then the old
  // order); the filter is kept, and each old shard's counts of rows made, kept out,
  // expired and capped go to the new shard of its number modulo the new count.
  // ConfigError when a shard's rows and `headroom` (a batch's new rows) exceed its
  // slots, or `options` decides otherwise (decides_as). `iteration`: the first the
  // result admits (placed_at()).
  KeyDirectory reshard(DynamicTableOptions options, std::uint64_t slots_per_shard, std::uint64_t headroom, std::uint64_t iteration) const;
  // 0 when the slots follow from the batches since iteration 0 (a replay of them makes
  // the same directory); else the iteration at which reshard() placed them anew, after
  // which a replay from 0 would not.
  std::uint64_t placed_at() const { return placed_at_; }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  // An appearance: slot j appeared (first in its batch) at `iteration`. Recency is a log
  // of them, oldest first, rather than a linked list: a touch appends one record instead
  // of relinking three nodes. A record is current while its slot's `last` is its
  // iteration (a free slot's is kNone); the others are passed over (and compacted away).
  struct Touch {
    std::uint32_t slot, iteration;
  };
  // One shard's slots and the log of their appearances (kept only when expiry or the
  // cap reads it): its current records, front to back, are the live rows from the least
  // recently appeared, ties in the order their batch met them.
  struct Shard {
    std::vector<std::uint64_t> id;    // per slot; kNoId: free
    std::vector<std::uint32_t> last;  // per slot: its last appearance (kNone: free), apart
                                      // from the ids: a touch writes 4 bytes of a small array
    std::vector<Touch> log;
    std::size_t log_front = 0;        // records before it are consumed
    std::vector<std::uint32_t> free;  // a stack; the next row takes the back
    DirectoryCounts counts;
  };
  // A live slot as saved.
  struct LiveSlot {
    std::uint32_t slot, last;
    std::uint64_t id;
  };
  // f(j) for each live slot of `sh`: from the most recent down (by slot without recency).
  template <typename F>
  void for_each_live(const Shard& sh, F&& f) const;
  // Slot j of shard s holds `id`, appeared last at `last`; the callers place a shard's
  // rows from the most recent down, then call end_placing(s).
  void place(std::uint32_t s, std::uint32_t j, std::uint64_t id, std::uint32_t last);
  void end_placing(std::uint32_t s);
  // Key (slot) of j on shard s, and back.
  Key key_of(std::uint32_t s, std::uint32_t j) const { return static_cast<Key>(s) + static_cast<Key>(o_.shards) * j; }
  void touch(Shard& sh, std::uint32_t j, std::uint32_t iteration);
  // touch() for each slot (kNoId: none) in order.
  void touch_all(std::span<const Key> slots, std::uint32_t iteration);
  // The least recently appeared live slot of `sh` (kNone: none), stale records consumed.
  static std::uint32_t least_recent(Shard& sh);
  // The log without its consumed and stale records, once they outnumber the current ones.
  static void compact(Shard& sh);
  void drop(std::uint32_t s, std::uint32_t j, std::vector<Key>* dropped);
  // The filter: count(id) after this batch's appearance, conservatively updated.
  std::uint32_t count_appearance(std::uint64_t id);
  Key resolve(std::uint64_t id, std::uint32_t iteration, std::vector<SlotAssignment>* created);

  DynamicTableOptions o_;
  std::uint64_t placed_at_ = 0;
  bool recency_;  // expiry or the cap: the recency logs are kept
  std::uint64_t per_shard_;
  std::vector<Shard> shards_;
  U64Map<Key> index_;  // id -> slot
  std::vector<std::uint8_t> filter_;
  U64Map<std::uint8_t> batch_refused_;  // ids kept out of the batch being admitted
  std::vector<std::uint64_t> gone_;     // ids dropped by end_iteration(), for the index
};

}  // namespace ember::scheduler
