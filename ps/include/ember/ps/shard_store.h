// ShardStore: one PS shard's rows of every embedding table, with their optimizer state,
// and the BSP aggregation of gradient pushes. Pure logic (no sockets): the ember-ps
// daemon puts requests in, the tests drive it directly.
//
// Placement: row key k belongs to shard k mod S and is stored at local index k div S, so
// each shard's rows are one flat array (ids from ember-data are dense and ordered by
// frequency, so round-robin spreads every table's hot rows over all shards).
//
// Gradients: a push carries the iteration that computed it and how many workers trained
// the row then. Contributions are summed (three or more in an order fixed by their bits,
// not by their arrival: runs give the same rows); once all have arrived the row is ready, and
// the next commit applies each ready row's sum once, with that iteration's learning
// rate, as vanilla BSP would have. A row cannot be trained again before its aggregation
// is applied (it must be pulled as latest first), so per-row updates stay in order.
//
// Applying after the commit: commit_deferred() takes the ready rows out of the push path
// and parks each thread's with that thread (see push_grad: a thread appends the rows it
// completes to its own ready list); each thread applies its own with
// apply_deferred_here(), the daemon once it has sent its next ack (the commit's, or any
// other request's). So a row's gradient is applied on the core that received it, where
// the gradient and the buffers are in cache (one thread applying every row would pull
// the gradients, the row states and the buffers across cores). commit_async()
// hands the rows to the store's applier threads instead (a small commit is applied on the
// spot: cheaper than waking that thread). Whoever reads or writes a row whose update is
// not applied yet (pulls, write-backs, a next push of the row, checkpoints) applies what
// is parked itself, or waits for the apply in progress: a pull after commit(t) sees every
// update of t, whether or not the thread that parked a row ever comes back.
// commit() is commit_async() and that wait.
//
// Concurrency: every method may be called from several handler threads at once, with no
// store-wide lock. Rows live in chunks allocated once (atomically) and never moved, each
// row initialized exactly once; pending aggregations are split over stripes, each behind
// its own TBB spin lock. What the store does not arbitrate is BSP itself: a row being
// pulled while another request overwrites it gives a torn copy, which the protocol rules
// out (pulls of t follow commit(t); write-backs precede the barrier). save() waits for
// applies in flight and holds new ones off; load() needs the store quiet (the daemon
// calls it before serving).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ember/common/fast_div.h"
#include "ember/common/flat_map.h"
#include "ember/common/huge_pages.h"
#include "ember/common/types.h"
#include "ember/ps/row_arena.h"
#include "ember/ps/row_lending.h"
#include "ember/ps/serving_delta.h"
#include "ember/ps/sparse_optimizer.h"

namespace ember::ps {

struct StoreConfig {
  std::uint64_t num_keys = 0;  // rows of all tables
  std::uint32_t dim = 16;
  std::uint32_t shard = 0, shards = 1;
  std::uint64_t seed = 1;  // initial rows from (seed, key)
  OptimizerConfig optimizer;
  // Learning rate of an iteration (default: optimizer.lr throughout).
  std::function<float(std::uint64_t iteration)> lr_at;
  // Allocate and initialize every row of this shard at construction (else on first use).
  bool allocate_up_front = false;
  // A commit with fewer gradient floats than this is applied on the committing thread
  // (waking an applier costs more); larger ones on the applier threads.
  std::uint64_t inline_apply_floats = 16384;
  // Applier threads (commit_async): one applies a commit's batches in turn; more apply
  // the batches of different receiving threads at once (1 to 256).
  std::uint32_t apply_threads = 1;
  // Called once for each chunk of rows allocated (by the thread that allocated it, as it
  // is installed), with its memory: a transport that sends rows in place learns where
  // they live (ember-ps adds them to its RDMA send regions; replies from a chunk before
  // that are copied). Chunks stay in place until the store is destroyed.
  std::function<void(const void* addr, std::size_t bytes)> on_chunk;
  // Track which rows change between checkpoints (a bit a row), for incremental ones
  // (save with a base).
  bool track_changes = false;
  // Serving deltas (serving_delta.h): each save also writes the rows changed since the
  // last save or load beside the checkpoint file (turns track_changes on).
  bool serving_deltas = false;
  // A disk tier under the rows (disk_tier.h): with tier.dir set, the rows live in a file
  // there and at most tier.ram_budget_bytes of them in memory; on_chunk is not called.
  TierConfig tier;
  // Dynamic tables (a dataset of hashed ids): keys are slots, and each slot names the id
  // it holds (reset_rows). Checkpoints carry the ids, so that ember-export writes (id,
  // row) tables and a checkpoint restores on another shard count (load()).
  bool hashed_ids = false;
};

inline std::uint32_t owner_shard(Key key, std::uint32_t shards) { return static_cast<std::uint32_t>(key % shards); }

class ShardStore {
  struct Batch;  // complete aggregations taken by a commit (below)

 public:
  // The most workers that may train one row in one iteration (a push's trainer count).
  // (The scheduler's most workers, Scheduler::kMaxWorkers.)
  static constexpr std::uint32_t kMaxTrainers = 4096;
  // How many rows ahead an apply fetches rows of `row_bytes` (value and state): 16 for
  // rows of up to 256 B, enough to hide a scattered row's miss behind the rows before it;
  // 8 for larger rows, each of which takes several of the core's line fill buffers, so
  // fewer in flight fill them as well. (ember-bench ps's bare update uses the same
  // distance.)
  static constexpr std::size_t rows_to_fetch_ahead(std::size_t row_bytes) { return row_bytes <= 256 ? 16 : 8; }

  explicit ShardStore(StoreConfig config);

  const StoreConfig& config() const { return config_; }
  std::uint32_t row_floats() const { return config_.dim + state_; }  // value + state
  bool owns(Key key) const { return arena_.owns(key); }

  // Copies each row's value (dim floats) into out[i * dim]. Throws ProtocolError for a
  // key this shard does not own or beyond the tables.
  void pull(std::span<const Key> keys, float* out);
  // Same, value and optimizer state (row_floats() each): for a worker that will own the row.
  void pull_with_state(std::span<const Key> keys, float* out);
  // Where each row lives (value, then state), for replies sent straight from the store.
  // Not with a tier (tiered()): Error.
  void row_pointers(std::span<const Key> keys, const float** out);
  // Prefetch (protocol.h kPrefetch): the rows are about to be served for `iteration`
  // before its commit. ProtocolError if one has an update not applied yet (the commit
  // would change it); else, until end_lending(iteration), push_grad and push_value of
  // any of them are refused.
  void lend_ahead(std::span<const Key> keys, std::uint64_t iteration);
  // commit(iteration) is in: rows lent for it (or earlier) may be updated again.
  void end_lending(std::uint64_t iteration);
  // Rows a worker will pull for `iteration` (protocol.h kHint): a tier reads them in
  // before they are asked for. ProtocolError for a key this shard does not hold; without
  // a tier, nothing else.
  void hint(std::span<const Key> keys, std::uint64_t iteration);
  // The tier's counters, if the store has one.
  std::optional<TierStats> tier_stats() const;
  // Adds `grads` (dim floats per key) for rows trained in `iteration` by `trainers` workers.
  // With `grads_owner` (it keeps `grads` valid while it lives), rows that complete with
  // this push keep their gradients where they are, held until applied, instead of copying
  // them (the daemon passes a TCP request's payload, lent by the transport). `shares`
  // (empty: 1 each): how many of the trainers' gradients each pushed gradient sums (a
  // host that summed its workers' parts, per-host aggregation); the row's update is
  // complete once the shares pushed reach its trainers. `group` (0: none): the host of
  // an aggregating host's gradients, whether summed there or pushed one by one. A row of
  // three or more trainers sums each group's gradients first, then the groups' sums
  // (store_stripes.h), so a host's sum is the same whether its workers' gradients left
  // together (a sync, a flush) or one by one (evictions): with two workers a host, the
  // model then does not depend on when flushes come.
  void push_grad(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers, const float* grads,
                 std::shared_ptr<const void> grads_owner = nullptr, std::span<const std::uint32_t> shares = {}, std::uint32_t group = 0);
  // Overwrites rows (value + state, row_floats() each) written back by their owner.
  void push_value(std::span<const Key> keys, const float* rows);
  // Dynamic tables (KeyDirectory): each slot keys[i] now holds the row of id ids[i], new:
  // initial_row(seed, id) and a fresh optimizer state (id kNoId: zeros, the row
  // dropped). Any update of the slot's old id is applied first, and an aggregation of it
  // still waiting for contributions (which will never come: the old id's copies were
  // dropped) is discarded. Called at commit(iteration), before the pulls of the iteration
  // that made the rows (PsService). A checkpoint of that same commit holds the rows made
  // here as free: they are no part of the model before `iteration`, and a resumed job's
  // first step makes them again.
  void reset_rows(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint64_t> ids);
  // With StoreConfig::hashed_ids: the id slot `key` holds (kNoId: free).
  std::uint64_t slot_id(Key key) const { return slot_ids_[local_of(key)] - 1; }
  // Applies every complete aggregation; returns how many rows were updated.
  std::uint64_t commit();
  // The same, returning once the rows are handed to the applier (see above).
  std::uint64_t commit_async();
  // Takes every complete aggregation out of the push path and parks it with the thread
  // that completed it (see above); returns how many rows.
  std::uint64_t commit_deferred();
  // Applies the parked rows of the calling thread; returns how many.
  std::uint64_t apply_deferred_here();
  // Whether the calling thread has parked rows (one atomic load).
  bool deferred_here() const;
  // Rows whose gradients are not applied yet (waiting for contributions, or complete and
  // waiting for the commit). Applies parked rows first (see above).
  std::size_t pending();

  // Checkpoints (shard_store_io.cc).
  // Every initialized row of this shard with its state, atomically written
  // (temp file, fsync, rename), checksummed, tagged with `iteration` (the last one
  // committed into the rows; -1: none). Aggregations not applied yet are refused, or
  // with kLeaveOut left out (the rows as of the last commit are written; returns how
  // many rows'). A file already there is replaced whole (a checkpoint per directory keeps
  // the earlier ones: checkpoints.h).
  // With `base` (needs StoreConfig::track_changes): an incremental checkpoint, only the
  // rows changed since the last save, on the last save's checkpoint of iteration `base`,
  // which must be this shard's file in checkpoint_dir(ROOT, base) beside `file`'s
  // directory (load finds it there). Every save starts the changes afresh.
  enum class Unapplied { kRefuse, kLeaveOut };
  std::size_t save(const std::filesystem::path& file, std::int64_t iteration = -1, Unapplied leave = Unapplied::kRefuse,
                   std::optional<std::int64_t> base = std::nullopt);
  // Loads the rows this shard owns from one checkpoint written by any number of shards:
  // the files of its every shard, all of one iteration (an incremental file with its
  // bases, oldest first). Returns that iteration.
  // With StoreConfig::hashed_ids, a checkpoint of another shard count or slots per shard
  // is re-placed: the ids that shard_of_id() gives this shard take its slots 0, 1, ... in
  // ascending order of id (KeyDirectory::reshard places them alike); DataError when they
  // are more than its slots. Throws DataError for a corrupt,
  // truncated or mismatched file, a base missing, a shard's file missing or given twice,
  // or files of different checkpoints.
  // With `own_file_only`, `files` is this shard's own file (same shard and shard count)
  // of a checkpoint the caller knows is whole (its manifest lists every shard's file,
  // written elsewhere): it holds every row this shard owns.
  std::int64_t load(const std::vector<std::filesystem::path>& files, bool own_file_only = false);
  // The iteration of a checkpoint's files after the checks of load(), reading only their
  // headers.
  static std::int64_t check_checkpoint_set(const std::vector<std::filesystem::path>& files);
  // What one checkpoint file was written by, from its header alone (a store that loads
  // it needs the same dim, optimizer and keys). DataError if it is not a checkpoint.
  struct CheckpointInfo {
    std::uint32_t dim = 0;
    OptimizerKind optimizer = OptimizerKind::kSgd;
    std::uint32_t shard = 0, shards = 1;
    std::uint64_t num_keys = 0;
    std::uint64_t rows = 0;            // rows written (the rows touched; an incremental file: those changed)
    std::int64_t iteration = -1;       // as load() returns it
    std::optional<std::int64_t> base;  // an incremental checkpoint's base iteration
    bool hashed_ids = false;           // each row names its id (StoreConfig::hashed_ids)
  };
  static CheckpointInfo checkpoint_info(const std::filesystem::path& file);

  // Direct access for tests and the daemon's stats. Not with a tier (its rows move):
  // Error.
  const float* row(Key key);
  // Whether the rows live on a disk tier (replies of them are then copied).
  bool tiered() const { return tier_ != nullptr; }
  std::uint64_t initialized_rows() const { return arena_.initialized(); }
  // Rows this shard owns, and the bytes they take once all are allocated (values and
  // optimizer state, plus one byte of row state each; on a tier, its budget and 9 bytes
  // a row).
  std::uint64_t local_rows() const { return arena_.local_rows(); }
  std::uint64_t bytes_when_full() const { return bytes_when_full(config_); }
  // The same from a configuration alone (before deciding to build a store).
  static std::uint64_t local_rows(const StoreConfig& c);
  static std::uint64_t bytes_when_full(const StoreConfig& c);

  ~ShardStore();
  // Only while no commit is being applied (stores are built, then serve).
  ShardStore(ShardStore&&) noexcept;

 private:
  // The store's jobs, each in a class or a file of its own: rows (RowArena), lending for
  // prefetch (RowLending), stripe aggregation (store_stripes.h, push_grad below), the
  // apply queue (apply_queue.h, shard_store_apply.cc), checkpoint I/O (shard_store_io.cc).
  static constexpr auto kIdle = RowArena::kIdle;
  static constexpr auto kAggregating = RowArena::kAggregating;
  static StoreConfig checked(StoreConfig config);

  float* row_ptr(Key key) { return arena_.row(key); }
  float* row_address(std::uint64_t local) const { return arena_.row_address(local); }
  void check_key(Key key) const { arena_.check_key(key); }
  std::uint64_t local_of(Key key) const { return arena_.local_of(key); }
  bool claim(std::uint64_t local) { return arena_.claim(local); }
  bool aggregating(std::uint64_t local) const { return arena_.state(local).load(std::memory_order_acquire) == kAggregating; }

  // Returns once the row's update is applied, if one is in flight (its state says
  // aggregating and a commit took rows): applies parked rows meanwhile, or waits for the
  // apply in progress. Returns at once in the common case.
  void wait_applied(std::uint64_t local) {
    if (aggregating(local)) [[unlikely]]
      help_until_applied(&arena_.state(local));
  }
  // A row in use: with a tier, pinned in memory while this lives (disk_tier.h).
  class RowRef {
   public:
    RowRef(float* p, DiskTier* tier, std::uint64_t local) : p_(p), tier_(tier), local_(local) {}
    RowRef(RowRef&& o) noexcept : p_(o.p_), tier_(std::exchange(o.tier_, nullptr)), local_(o.local_) {}
    RowRef(const RowRef&) = delete;
    RowRef& operator=(const RowRef&) = delete;
    RowRef& operator=(RowRef&&) = delete;
    ~RowRef() {
      if (tier_ != nullptr) tier_->unpin(local_);
    }
    float* get() const { return p_; }

   private:
    float* p_;
    DiskTier* tier_;
    std::uint64_t local_;
  };
  // The row of `key` once no update of it is being applied (`write`: the caller changes
  // it; `no_read`: it overwrites all of it). IoError once the tier failed.
  RowRef read_row(Key key, bool write = false, bool no_read = false) {
    wait_applied(local_of(key));
    if (tier_ == nullptr) [[likely]]
      return {row_ptr(key), nullptr, 0};
    return pin_tiered(key, write, no_read);
  }
  RowRef pin_tiered(Key key, bool write, bool no_read);
  // IoError, naming the tier's error, once the tier failed.
  void check_tier() const;
  // The row of `key` initialized (a push claims initialized rows only), with no update of
  // it being applied; a tier does not read it in (the apply will).
  void prepare_row(Key key);
  void wait_all_applied() { help_until_applied(nullptr); }
  // Returns once every commit so far is applied, with applies held off while the lock it
  // returns lives (their threads wait): save() writes rows no apply is changing.
  std::unique_lock<std::shared_mutex> hold_off_applies();
  // Returns once nothing is in flight, or (with `row`) once that row's state is no longer
  // aggregating: applies parked batches meanwhile, else waits for the applies in progress.
  void help_until_applied(const std::atomic<std::uint8_t>* row);
  // Applies one parked batch (the calling thread's first) if there is one.
  bool help_apply();
  // The stripe whose ready list a thread appends to, and whose parked rows it applies.
  static std::size_t home_stripe();
  struct Pending {
    std::uint64_t iteration;
    std::uint32_t expected;  // trainers
    std::uint32_t received;  // trainers whose gradients are in (the pushes' shares summed)
    std::uint32_t parts;     // pushes received (each holds a block when kept apart)
    std::uint32_t offset;    // into the stripe's partial_grads
  };
  // A complete aggregation, waiting for a commit: its gradient sum is where `lent` points
  // (a push's payload, held by the list's owners), or, if null, copied into the list's
  // grads (the next dim floats there: copies are kept in the rows' order).
  struct Ready {
    std::uint64_t local;  // the row's index in this shard (claimed rows are initialized)
    std::uint64_t iteration;
    const float* lent;
  };
  // Complete aggregations taken by a commit from one stripe's ready list.
  struct Batch {
    std::vector<Ready> rows;
    std::vector<float> grads;                         // the copied gradients, dim floats each
    std::vector<std::shared_ptr<const void>> owners;  // of the lent ones
    std::size_t stripe = 0;                           // where it came from, and where its buffers go back
  };
  void apply_batch(const Batch& b);
  template <OptimizerKind K>
  void apply_batch_as(const Batch& b);  // apply_batch, for the store's optimizer K
  // Applies a batch taken out of flight, gives its buffers back to its stripe, marks it done.
  void finish_batch(Batch& b);
  // Takes every ready list's rows (counted in `rows`) and marks them in flight, one
  // count per batch. With `park`, each stays in its stripe's parked list (an empty
  // result); else they are returned.
  std::vector<Batch> take_ready(std::uint64_t& rows, bool park);
  // Aggregations not applied yet, partial or complete (pending() without its wait).
  std::size_t unapplied() const;
  // One stripe: the partial aggregations of the keys that hash to it, and the ready and
  // parked rows of the handler thread whose stripe it is (home_stripe()).
  struct Stripe;
  std::size_t stripe_index(Key key) const;
  // Takes one batch parked in `st` (false if none).
  bool take_parked(Stripe& st, Batch& b);
  // push_grad's fast path: claims every row when all have one trainer and are idle (true;
  // ProtocolError for a row pushed twice), else undoes its claims (false).
  bool claim_single_trainer_rows(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers);
  // Appends claimed complete rows to this thread's ready list.
  void append_ready(std::uint64_t iteration, std::span<const Key> keys, const float* grads, std::shared_ptr<const void> owner);
  // push_grad's general path: validates in full, then adds each contribution under its
  // stripe's lock, one pass per stripe.
  struct PushPlan;
  void push_grad_general(std::uint64_t iteration, std::span<const Key> keys, std::span<const std::uint32_t> trainers, std::uint32_t group,
                         const float* grads, std::span<const std::uint32_t> shares);
  // ProtocolError for a bad key, trainer count or share, or a key twice; returns whether
  // a row already has an aggregation.
  bool validate_push(std::span<const Key> keys, std::span<const std::uint32_t> trainers, std::span<const std::uint32_t> shares);
  void group_by_stripe(std::span<const Key> keys, PushPlan& plan) const;
  void check_partial(const Stripe& st, Key k, std::uint64_t iteration, std::uint32_t share) const;
  void add_contribution(Stripe& st, std::uint64_t iteration, Key k, std::uint32_t trainers, std::uint32_t share, std::uint32_t group,
                        const float* g, PushPlan& plan);
  void flush_done(PushPlan& plan);
  struct Applier;

  StoreConfig config_;
  std::uint32_t state_ = 0;  // optimizer state floats per row
  RowArena arena_;
  DiskTier* tier_ = nullptr;  // arena_'s, if any
  // With StoreConfig::track_changes: a bit per row changed since the last save.
  std::unique_ptr<std::atomic<std::uint64_t>[]> changed_;
  void mark_changed(std::uint64_t local) {
    if (changed_) changed_[local >> 6].fetch_or(std::uint64_t{1} << (local & 63), std::memory_order_relaxed);
  }
  bool changed(std::uint64_t local) const { return (changed_[local >> 6].load(std::memory_order_relaxed) >> (local & 63) & 1) != 0; }
  // No row changed (at the start, and once a save wrote the changes).
  void clear_changes() {
    for (std::uint64_t w = 0; w < (local_rows() + 63) / 64; ++w) changed_[w].store(0, std::memory_order_relaxed);
  }
  // With serving deltas on hashed ids: a bit per slot whose id changed since the last
  // save (its delta record names the new id); and the iteration the changes count from.
  std::unique_ptr<std::atomic<std::uint64_t>[]> id_changed_;
  std::int64_t delta_previous_ = DeltaInfo::kNoPrevious;
  std::uint64_t delta_previous_sum_ = 0;  // that checkpoint file's stored checksum
  // The serving delta of a save (`fresh`: slots written free; `checkpoint_sum`: the
  // checkpoint file's stored checksum), before that file is renamed in.
  void write_delta(const std::filesystem::path& checkpoint_file, std::int64_t iteration, const std::vector<bool>& fresh,
                   std::uint64_t checkpoint_sum);
  // After a save of `iteration` (its file's checksum `sum`): changes count from here.
  void changes_saved(std::int64_t iteration, std::uint64_t sum, const std::vector<bool>& fresh);
  // Calls add(local, row) for each listed row in ascending order (from the disk tier's
  // file, a block at a time, when there is one).
  void for_each_listed(const std::vector<bool>& listed, std::size_t per_block,
                       const std::function<void(std::uint64_t, const char*)>& add) const;
  // With StoreConfig::hashed_ids: each slot's id plus one (0: free; kNoId + 1 wraps to
  // 0), zeroed by calloc so that the pages of slots never used cost no memory; and the
  // slots the resets of the latest iteration made (a checkpoint of that iteration holds
  // them as free).
  struct FreeBytes {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::uint64_t[], FreeBytes> slot_ids_;
  void set_slot_id(std::uint64_t local, std::uint64_t id) { slot_ids_[local] = id + 1; }
  std::uint64_t made_iteration_ = 0;
  std::vector<std::uint64_t> made_;  // local indices
  // Each record of a checkpoint's files (each checked; an incremental file's bases before
  // it): the file's name, the key, the id (kNoId without hashed ids) and the row.
  void read_records(const std::vector<std::filesystem::path>& files,
                    const std::function<void(const std::string&, Key, std::uint64_t, const char*)>& take) const;
  // load()'s re-placement of a hashed-id checkpoint's rows (another shard count).
  std::int64_t load_replaced(const std::vector<std::filesystem::path>& files, std::int64_t iteration);
  RowLending lending_;
  static constexpr std::size_t kStripes = 64;
  std::unique_ptr<Stripe[]> stripes_;
  std::atomic<std::size_t> next_rotation_{0};  // where push_grad starts among the stripes
  std::unique_ptr<Applier> applier_;
};

}  // namespace ember::ps
