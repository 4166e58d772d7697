// RowTier: a shard's rows on local disk, at most a RAM budget of them in memory (ember-ps
// --store-dir DIR --ram-budget-mb N). Used by RowArena only.
//
// Layout: one fixed-stride file per shard (DIR/shard-S-of-N.rows, row at local index i
// at i * row bytes: ids are dense and ordered by frequency, so a table's hot rows share
// pages), mapped MAP_SHARED. A row's address never changes, so every path of the store
// (replies sent from the rows in place, lending for prefetch, deferred applies,
// checkpoints) works on the tier as on RAM, and a row is never torn between two copies:
// the kernel moves whole pages between the file and memory; the tier only decides which
// pages stay, and when dirty ones are written back:
//   - touch(): a request marks the pages of the rows it uses (two relaxed stores); one
//     not in memory is a miss on the critical path (the request faults it in);
//   - hint(): rows a worker will pull iterations ahead (protocol.h kHint) are read in on
//     the tier's loader thread (MADV_WILLNEED: queued at once) before they are asked for;
//   - the pager thread: over the budget, writes the least recently used pages back
//     (sync_file_range) and drops them (MADV_DONTNEED, then POSIX_FADV_DONTNEED so that
//     the page cache does not keep them either), down to 7/8 of the budget.
// Kernel readahead is off (MADV_RANDOM): rows are used at random.
//
// The file is scratch space, not state: a run starts from the initial rows or a
// checkpoint, as an all-RAM shard does. The whole file is reserved up front
// (fallocate), so a full disk fails the shard at start, naming the file, never later
// inside a page fault. DIR/shard-S-of-N.json says which table the file holds; a
// directory holding another table's file, or one in use by a running shard (flock), is
// refused.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace ember::ps {

struct TierConfig {
  std::filesystem::path dir;           // empty: no tier
  std::uint64_t ram_budget_bytes = 0;  // rows and state in memory, at most
  // What the file holds, checked against DIR's record of it (a directory of another
  // table is refused): the dataset's fingerprint, dim, optimizer, key count.
  std::string table;
  // Ask the workers for hints (JobConfig::row_tier); off, the tier reads a row when it is
  // first asked for (an LRU alone), to measure what the hints buy.
  bool hints = true;
};

// Totals since start (relaxed counters: for monitoring).
struct TierStats {
  std::uint64_t rows_touched = 0;  // rows used by requests
  std::uint64_t misses = 0;        // pages a request found on disk (faulted in on the critical path)
  std::uint64_t hinted_rows = 0;   // rows named by hints
  std::uint64_t hint_loads = 0;    // pages read in by hints before use
  std::uint64_t evicted = 0;       // pages dropped from memory
  std::uint64_t written_back = 0;  // of those, pages dirty (written to the file)
  std::uint64_t resident = 0;      // pages in memory now (as the tier counts them)
  std::uint64_t budget_pages = 0;  // the budget, in pages
  std::uint64_t hint_queue = 0;    // hints waiting for the loader thread
  std::uint64_t file_bytes = 0;
  std::uint64_t bytes_read() const { return (misses + hint_loads) * kPage; }
  std::uint64_t bytes_written() const { return written_back * kPage; }
  static constexpr std::uint64_t kPage = 4096;
};

class RowTier {
 public:
  static constexpr std::uint64_t kPage = TierStats::kPage;
  static constexpr std::uint64_t kMinBudget = 64 << 10;  // 16 pages
  // Opens (creating) the shard's file for `rows` rows of `row_bytes`. ConfigError for a
  // directory that cannot be used (unwritable, another table's, in use, too small a
  // budget) or a disk without room for the file, naming the file.
  RowTier(const TierConfig& config, std::uint32_t shard, std::uint32_t shards, std::uint64_t rows, std::uint64_t row_bytes);
  ~RowTier();
  RowTier(const RowTier&) = delete;
  RowTier& operator=(const RowTier&) = delete;

  // Where the rows live (row i at base() + i * row_bytes).
  char* base() const { return base_; }
  const std::filesystem::path& file() const { return file_; }

  // A request uses the row at local index `local` (`write`: it will change it).
  void touch(std::uint64_t local, bool write) {
    const std::uint64_t first = local * row_bytes_ / kPage, last = (local * row_bytes_ + row_bytes_ - 1) / kPage;
    touched_.fetch_add(1, std::memory_order_relaxed);
    for (std::uint64_t p = first; p <= last; ++p) touch_page(p, write);
  }
  // Rows to be used in iteration `iteration` (a hint): read in on the loader thread.
  void hint(std::span<const std::uint64_t> locals, std::uint64_t iteration);
  // The shard's commits reached `iteration`: pages last used before it may go first.
  void advance(std::uint64_t iteration) {
    if (iteration > now_.load(std::memory_order_relaxed)) now_.store(iteration, std::memory_order_relaxed);
  }
  // Drops pages the tier does not count as resident (those a checkpoint's scan read
  // through the mapping), between first and last row inclusive.
  void release_scanned(std::uint64_t first_row, std::uint64_t end_row);
  // Whether the tier's threads met an I/O error, and the first one (the store then
  // refuses requests with IoError).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  std::string error() const;
  TierStats stats() const;

 private:
  enum PageState : std::uint8_t { kOut = 0, kClean = 1, kDirty = 2 };
  void touch_page(std::uint64_t p, bool write) {
    last_use_[p].store(static_cast<std::uint32_t>(now_.load(std::memory_order_relaxed)), std::memory_order_relaxed);
    std::uint8_t s = state_[p].load(std::memory_order_relaxed);
    if (s == kDirty || (s == kClean && !write)) return;
    if (s == kOut) {
      if (state_[p].compare_exchange_strong(s, write ? kDirty : kClean, std::memory_order_relaxed)) {
        misses_.fetch_add(1, std::memory_order_relaxed);
        became_resident();
        return;
      }
      if (s == kDirty || !write) return;
    }
    state_[p].store(kDirty, std::memory_order_relaxed);
  }
  void became_resident() {
    if (resident_.fetch_add(1, std::memory_order_relaxed) + 1 > budget_pages_) wake_pager();
  }
  void wake_pager();
  void pager_loop();
  void loader_loop();
  void evict_to(std::uint64_t target);
  void evict_run(std::uint64_t first, std::uint64_t count);
  void fail(const std::string& what);

  std::filesystem::path file_;
  int fd_ = -1, lock_fd_ = -1;
  char* base_ = nullptr;
  std::uint64_t bytes_ = 0, pages_ = 0, row_bytes_ = 0, budget_pages_ = 0;
  std::unique_ptr<std::atomic<std::uint8_t>[]> state_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> last_use_;  // the iteration of its last use (or the one hinted)
  std::atomic<std::uint64_t> now_{0}, resident_{0};
  std::atomic<std::uint64_t> touched_{0}, misses_{0}, hinted_{0}, hint_loads_{0}, evicted_{0}, written_back_{0};

  mutable std::mutex mu_;  // guards the queues, error_ and stop_
  std::condition_variable pager_cv_, loader_cv_;
  std::vector<std::pair<std::vector<std::uint64_t>, std::uint64_t>> hints_;  // pages, iteration
  std::atomic<std::uint64_t> hint_queue_{0};
  bool pager_wanted_ = false, stop_ = false;
  std::atomic<bool> failed_{false};
  std::string error_;
  std::thread pager_, loader_;
};

}  // namespace ember::ps
