// DiskTier: a shard's rows on local disk, at most a RAM budget of them in memory (ember-ps
// --store-dir DIR --ram-budget-mb N). Used by RowArena and ShardStore only.
//
// Layout: one fixed-stride file per shard (DIR/shard-S-of-N.rows, the row at local index
// i at byte i * row bytes: ids are dense, so no index), read and written with direct I/O
// (O_DIRECT: the page cache stays out of it), by the row's disk sectors, not by pages.
// In memory the tier keeps rows, not pages: a budget of N MB holds N MB / row bytes
// rows in slots, whichever rows are used, however scattered over the table they are.
//
// A row in a slot moves (it goes back to disk and its slot serves another row), so a
// user pins it (pin(), unpin()) while it reads or writes it; a pinned row stays. Each row
// has one word: its slot, its pins, whether it is dirty, and whether it is busy (being
// read in, or written out); a row busy is waited for. Who does what:
//   - a request pins the rows it uses; one not in memory is read there and then (a miss
//     on the critical path), as is one whose hinted read is still in flight (waited for);
//   - hint(): rows a worker will pull iterations ahead (protocol.h kHint) are read in by
//     the loader thread, on several I/O threads at once (the disk's queue depth), and kept
//     until the iteration named;
//   - the pager thread keeps a reserve of free slots: it takes the least recently used
//     rows that nobody pins, writes the dirty ones back (sector-aligned extents, on the I/O
//     threads), and frees their slots. It is the file's only writer, so a read and a
//     write-back of neighbouring rows in one sector never lose a row.
// A row never written (RowArena initializes it from (seed, key)) is never read: its
// first pin takes a slot without I/O.
//
// The file is scratch space, not state: a run starts from the initial rows or a
// checkpoint, as an all-RAM shard does. The whole file is reserved up front (fallocate),
// so a full disk fails the shard at start, naming the file. DIR/shard-S-of-N.json says
// which table the file holds; a directory holding another table's file, or one in use by
// a running shard (flock), is refused.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ember/common/huge_pages.h"
#include "ember/common/unique_fd.h"

namespace ember::ps {

struct TierConfig {
  std::filesystem::path dir;           // empty: no tier
  std::uint64_t ram_budget_bytes = 0;  // rows and state in memory, at most
  // What the file holds, checked against DIR's record of it (a directory of another
  // table is refused): the dataset's fingerprint, dim, optimizer, key count.
  std::string table;
  // Ask the workers for hints (JobConfig::disk_tier); off, the tier reads a row when it is
  // first asked for (an LRU alone), to measure what the hints buy.
  bool hints = true;
  // Threads that read and write rows at once (the disk's queue depth).
  std::uint32_t io_threads = 4;
};

// Totals since start (relaxed counters: for monitoring).
struct TierStats {
  std::uint64_t rows_touched = 0;   // rows used by requests (pins)
  std::uint64_t misses = 0;         // of those, rows a request waited for the disk for (read, or in flight)
  std::uint64_t hinted_rows = 0;    // rows named by hints
  std::uint64_t hint_loads = 0;     // rows read in by hints before use
  std::uint64_t evicted = 0;        // rows dropped from memory
  std::uint64_t written_back = 0;   // of those, rows dirty (written to the file)
  std::uint64_t resident = 0;       // rows in memory now
  std::uint64_t budget_rows = 0;    // the slots: the budget, in rows
  std::uint64_t hint_queue = 0;     // hints waiting for the loader thread
  std::uint64_t slot_waits = 0;     // requests that waited for the pager to free a slot
  std::uint64_t bytes_read = 0;     // from the file (whole sectors)
  std::uint64_t bytes_written = 0;  // to the file
  std::uint64_t file_bytes = 0;
  std::uint64_t row_bytes = 0;  // a row and its optimizer state
};

class DiskTier {
 public:
  static constexpr std::uint64_t kMinBudget = 64 << 10;
  // Slots at least (a budget below this many rows gets this many): every thread that
  // pins holds one row at a time, so this many slots never all stay pinned.
  static constexpr std::uint64_t kMinSlots = 256;
  // Opens (creating) the shard's file for `rows` rows of `row_bytes`. ConfigError for a
  // directory that cannot be used (unwritable, another table's, in use, too small a
  // budget) or a disk without room for the file, naming the file.
  DiskTier(const TierConfig& config, std::uint32_t shard, std::uint32_t shards, std::uint64_t rows, std::uint64_t row_bytes);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::filesystem::path& file() const { return file_; }

  // Pins the row at local index `local` in memory and returns where it is, until
  // unpin(local). `write`: the caller changes it (it goes back to disk when dropped).
  // `no_read`: the caller initializes or overwrites the whole row, so one not in memory
  // is not read. IoError if the read fails (the tier has then failed).
  float* pin(std::uint64_t local, bool write, bool no_read = false);
  void unpin(std::uint64_t local) { word_[local].fetch_sub(kPin, std::memory_order_release); }
  // Rows to be used in iteration `iteration` (a hint), all written before (initialized
  // rows): read in on the loader thread, which takes the list.
  void hint(std::vector<std::uint64_t> locals, std::uint64_t iteration);
  // The shard's commits reached `iteration`: rows last used before it may go first.
  void advance(std::uint64_t iteration) {
    if (iteration > now_.load(std::memory_order_relaxed)) now_.store(iteration, std::memory_order_relaxed);
  }
  // Calls fn(local, row) for each local in [first, end) with listed[local], in order,
  // with the row's bytes as they are (in memory, or on disk): a checkpoint's scan, which
  // reads the file directly. No row goes to disk meanwhile; the caller holds writers off.
  void scan(std::uint64_t first, std::uint64_t end, const std::vector<bool>& listed,
            const std::function<void(std::uint64_t local, const char* row)>& fn);
  // Whether the tier's threads met an I/O error, and the first one (the store then
  // refuses requests with IoError).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  std::string error() const;
  TierStats stats() const;

 private:
  // A row's word: slot + 1 (0: not in memory), pins, dirty, busy.
  static constexpr std::uint64_t kSlotMask = 0xffffffffull;
  static constexpr std::uint64_t kPin = 1ull << 32;
  static constexpr std::uint64_t kPinMask = 0xffffull << 32;
  static constexpr std::uint64_t kDirty = 1ull << 48;
  static constexpr std::uint64_t kBusy = 1ull << 49;
  static constexpr std::uint64_t kNoOwner = ~0ull;

  char* slot(std::uint64_t s) const { return slots_ + s * row_bytes_; }
  // A free slot (waits for the pager when there is none).
  std::uint32_t take_slot();
  void give_slots(const std::vector<std::uint32_t>& freed);
  // The bytes of a run of rows, [first, end), as the sectors that hold them.
  struct Extent {
    std::uint64_t first, end;  // rows
    std::uint64_t from, to;    // bytes of the file, sector-aligned
  };
  // Groups rows (sorted, unique) into extents of neighbouring sectors.
  std::vector<Extent> extents_of(const std::vector<std::uint64_t>& locals) const;
  // Reads the rows of `locals` (sorted) into `dest` (one slot each), on the I/O threads.
  void read_rows(const std::vector<std::uint64_t>& locals, const std::vector<std::uint32_t>& dest);
  // Writes the rows of `locals` (sorted) from `src` (their slots), on the I/O threads.
  void write_rows(const std::vector<std::uint64_t>& locals, const std::vector<std::uint32_t>& src);
  // fn(i) for i in [0, n), on up to io_threads threads; false if one threw.
  void on_io_threads(std::size_t n, const std::function<void(std::size_t)>& fn);
  void pread_all(char* buf, std::uint64_t bytes, std::uint64_t offset);
  void pwrite_all(const char* buf, std::uint64_t bytes, std::uint64_t offset);
  void pager_loop();
  void loader_loop();
  void evict(std::uint64_t want);
  void load_hinted(std::vector<std::uint64_t>& locals, std::uint64_t iteration);
  void fail(const std::string& what);
  // The constructor's steps: the file locked, checked against DIR's record and reserved;
  // the descriptor for I/O; the slots.
  void open_file(const TierConfig& c, const std::string& name);
  void open_for_io();
  void make_slots(const TierConfig& c, const std::string& name);

  std::filesystem::path file_;
  UniqueFd lock_fd_, fd_;       // the one holding the flock; I/O (direct where it can be)
  bool direct_ = true;          // O_DIRECT (false where the file system has none, e.g. tmpfs)
  std::uint64_t sector_ = 512;  // direct I/O's alignment
  std::uint64_t rows_ = 0, row_bytes_ = 0, file_bytes_ = 0, slot_count_ = 0, low_ = 0, high_ = 0;
  std::uint32_t io_threads_ = 4;
  HugeArray<char> slot_memory_;
  char* slots_ = nullptr;                                   // slot_memory_'s
  std::unique_ptr<std::atomic<std::uint64_t>[]> word_;      // per row
  std::unique_ptr<std::atomic<std::uint64_t>[]> owner_;     // per slot: its row, or kNoOwner
  std::unique_ptr<std::atomic<std::uint32_t>[]> last_use_;  // per slot: the iteration of its last use (or the one hinted)
  std::atomic<std::uint64_t> now_{0}, resident_{0};
  std::atomic<std::uint64_t> touched_{0}, misses_{0}, hinted_{0}, hint_loads_{0}, evicted_{0}, written_back_{0}, slot_waits_{0},
      bytes_read_{0}, bytes_written_{0};

  mutable std::mutex mu_;  // guards free_, the hint queue, the flags and error_
  std::condition_variable pager_cv_, loader_cv_, free_cv_;
  std::vector<std::uint32_t> free_;
  std::vector<std::pair<std::vector<std::uint64_t>, std::uint64_t>> hints_;  // rows, iteration
  std::atomic<std::uint64_t> hint_queue_{0};
  bool pager_wanted_ = false, stop_ = false;
  std::mutex evict_mu_;  // held by a pager round and by scan(): no row goes to disk during a scan
  std::atomic<bool> failed_{false};
  std::string error_;
  std::thread pager_, loader_;
};

}  // namespace ember::ps
