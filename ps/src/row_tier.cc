#include "ember/ps/row_tier.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"

namespace ember::ps {

RowTier::RowTier(const TierConfig& c, std::uint32_t shard, std::uint32_t shards, std::uint64_t rows, std::uint64_t row_bytes)
    : row_bytes_(row_bytes) {
  const std::string name = "shard-" + std::to_string(shard) + "-of-" + std::to_string(shards);
  file_ = c.dir / (name + ".rows");
  const std::filesystem::path record = c.dir / (name + ".json");
  if (c.ram_budget_bytes < kMinBudget) throw ConfigError("--ram-budget-mb: at least 0.0625 MB (16 pages) of rows in memory");
  std::error_code ec;
  std::filesystem::create_directories(c.dir, ec);
  if (ec) throw ConfigError("--store-dir " + c.dir.string() + ": " + ec.message());
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw ConfigError(errno_message("--store-dir: " + file_.string()));
  try {
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      throw ConfigError("--store-dir: " + file_.string() + " is in use by another ember-ps (" + std::strerror(errno) + ")");
    }
    // The record of what the file holds: another table's directory is refused (its file
    // may be needed by whoever made it), the same table's is reused.
    const nlohmann::json mine{{"table", c.table}, {"rows", rows}, {"row_bytes", row_bytes}};
    if (std::filesystem::exists(record)) {
      nlohmann::json theirs;
      try {
        std::ifstream in(record);
        theirs = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        throw ConfigError("--store-dir: " + record.string() + ": not a row tier record (" + e.what() + ")");
      }
      if (theirs != mine) {
        throw ConfigError("--store-dir: " + record.string() + " holds another table (" + theirs.dump() + "; this shard: " + mine.dump() +
                          "): give an empty directory");
      }
    }
    write_file_atomic(record, mine.dump() + "\n");
    bytes_ = rows * row_bytes;
    pages_ = (bytes_ + kPage - 1) / kPage;
    budget_pages_ = c.ram_budget_bytes / kPage;
    if (::ftruncate(fd_, static_cast<off_t>(pages_ * kPage)) != 0) {
      throw ConfigError(
          errno_message("--store-dir: " + file_.string() + ": cannot size it to " + std::to_string(pages_ * kPage) + " bytes"));
    }
    // Reserve every block now: a full disk then fails here, not in a page fault (SIGBUS).
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(pages_ * kPage)) != 0) {
      if (errno != EOPNOTSUPP) {
        throw ConfigError(errno_message("--store-dir: " + file_.string() + ": cannot reserve " + std::to_string(pages_ * kPage >> 20) +
                                        " MiB for the rows"));
      }
      spdlog::warn("row tier: {}: the file system cannot reserve space (fallocate); a full disk will fail the shard later", file_.string());
    }
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
    void* p = ::mmap(nullptr, pages_ * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw ConfigError(errno_message("--store-dir: " + file_.string() + ": cannot map it"));
    base_ = static_cast<char*>(p);
    ::madvise(base_, pages_ * kPage, MADV_RANDOM);
    // Whatever an earlier run left in memory is not counted: drop it.
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    state_ = std::make_unique<std::atomic<std::uint8_t>[]>(pages_);
    last_use_ = std::make_unique<std::atomic<std::uint32_t>[]>(pages_);
    for (std::uint64_t i = 0; i < pages_; ++i)
      state_[i].store(kOut, std::memory_order_relaxed), last_use_[i].store(0, std::memory_order_relaxed);
  } catch (...) {
    if (base_ != nullptr) ::munmap(base_, pages_ * kPage);
    ::close(fd_);
    throw;
  }
  pager_ = std::thread([this] { pager_loop(); });
  loader_ = std::thread([this] { loader_loop(); });
  spdlog::info("row tier: {} rows of {} B in {} ({} MiB), at most {} MiB in memory", rows, row_bytes, file_.string(), pages_ * kPage >> 20,
               budget_pages_ * kPage >> 20);
}

RowTier::~RowTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  pager_cv_.notify_all();
  loader_cv_.notify_all();
  if (pager_.joinable()) pager_.join();
  if (loader_.joinable()) loader_.join();
  if (base_ != nullptr) ::munmap(base_, pages_ * kPage);
  if (fd_ >= 0) ::close(fd_);  // and its lock
}

void RowTier::hint(std::span<const std::uint64_t> locals, std::uint64_t iteration) {
  std::vector<std::uint64_t> pages;
  pages.reserve(locals.size());
  for (std::uint64_t l : locals) {
    if (l * row_bytes_ >= bytes_) continue;
    pages.push_back(l * row_bytes_ / kPage);
    const std::uint64_t last = (l * row_bytes_ + row_bytes_ - 1) / kPage;
    if (last != pages.back()) pages.push_back(last);
  }
  hinted_.fetch_add(locals.size(), std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    hints_.emplace_back(std::move(pages), iteration);
  }
  hint_queue_.fetch_add(1, std::memory_order_relaxed);
  loader_cv_.notify_one();
}

void RowTier::loader_loop() {
  for (;;) {
    std::vector<std::pair<std::vector<std::uint64_t>, std::uint64_t>> work;
    {
      std::unique_lock lock(mu_);
      loader_cv_.wait(lock, [&] { return stop_ || !hints_.empty(); });
      if (stop_) return;
      work.swap(hints_);
    }
    for (auto& [pages, iteration] : work) {
      std::sort(pages.begin(), pages.end());
      pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
      // Kept until used: a page hinted for a later iteration is among the last to go.
      const auto until = static_cast<std::uint32_t>(iteration);
      for (std::uint64_t p : pages)
        if (last_use_[p].load(std::memory_order_relaxed) < until) last_use_[p].store(until, std::memory_order_relaxed);
      // Read the pages on disk in runs of consecutive pages.
      for (std::size_t i = 0; i < pages.size();) {
        if (state_[pages[i]].load(std::memory_order_relaxed) != kOut) {
          ++i;
          continue;
        }
        std::size_t j = i + 1;
        while (j < pages.size() && pages[j] == pages[j - 1] + 1 && state_[pages[j]].load(std::memory_order_relaxed) == kOut) ++j;
        // Queued, not waited for: the reads of a whole hint are in flight at once (the
        // disk's queue depth), and a request that comes first waits only for its page.
        if (::madvise(base_ + pages[i] * kPage, (j - i) * kPage, MADV_WILLNEED) != 0) {
          fail(errno_message("reading rows in from " + file_.string()));
        }
        for (std::size_t k = i; k < j; ++k) {
          std::uint8_t out = kOut;
          if (state_[pages[k]].compare_exchange_strong(out, kClean, std::memory_order_relaxed)) {
            hint_loads_.fetch_add(1, std::memory_order_relaxed);
            became_resident();
          }
        }
        i = j;
      }
      hint_queue_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

void RowTier::wake_pager() {
  {
    std::lock_guard lock(mu_);
    if (pager_wanted_) return;
    pager_wanted_ = true;
  }
  pager_cv_.notify_one();
}

void RowTier::pager_loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      pager_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || pager_wanted_; });
      if (stop_) return;
      pager_wanted_ = false;
    }
    if (resident_.load(std::memory_order_relaxed) > budget_pages_) evict_to(budget_pages_ - budget_pages_ / 8);
  }
}

void RowTier::evict_to(std::uint64_t target) {
  // The least recently used pages first (a page hinted for a later iteration counts as
  // used then).
  std::vector<std::pair<std::uint32_t, std::uint64_t>> in;  // last use, page
  in.reserve(resident_.load(std::memory_order_relaxed) + 1024);
  for (std::uint64_t p = 0; p < pages_; ++p)
    if (state_[p].load(std::memory_order_relaxed) != kOut) in.emplace_back(last_use_[p].load(std::memory_order_relaxed), p);
  if (in.size() <= target) return;
  const std::size_t n = in.size() - target;
  std::nth_element(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n - 1), in.end());
  std::vector<std::uint64_t> victims(n);
  for (std::size_t i = 0; i < n; ++i) victims[i] = in[i].second;
  std::sort(victims.begin(), victims.end());
  // A run spans victims with nothing resident between them: one set of system calls
  // (and one TLB shootdown) for the run, not one per page. With the table far larger
  // than the budget, most pages between two victims are on disk.
  const auto out_between = [&](std::uint64_t a, std::uint64_t b) {
    if (b - a > 1024) return false;
    for (std::uint64_t p = a + 1; p < b; ++p)
      if (state_[p].load(std::memory_order_relaxed) != kOut) return false;
    return true;
  };
  for (std::size_t i = 0; i < victims.size();) {
    std::size_t j = i + 1;
    while (j < victims.size() && out_between(victims[j - 1], victims[j])) ++j;
    evict_run(victims[i], victims[j - 1] + 1 - victims[i]);
    i = j;
  }
}

void RowTier::evict_run(std::uint64_t first, std::uint64_t count) {
  bool dirty = false;
  for (std::uint64_t p = first; p < first + count; ++p) {
    const std::uint8_t was = state_[p].exchange(kOut, std::memory_order_relaxed);
    if (was == kOut) continue;
    resident_.fetch_sub(1, std::memory_order_relaxed);
    evicted_.fetch_add(1, std::memory_order_relaxed);
    if (was == kDirty) written_back_.fetch_add(1, std::memory_order_relaxed), dirty = true;
  }
  // A request may write these rows meanwhile: the page stays the page cache's (dirty,
  // or mapped again), never lost; the kernel drops it only once clean and unmapped.
  const auto off = static_cast<off_t>(first * kPage), len = static_cast<off_t>(count * kPage);
  if (dirty && ::sync_file_range(fd_, off, len, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
    fail(errno_message("writing rows back to " + file_.string()));
  }
  ::madvise(base_ + first * kPage, static_cast<std::size_t>(len), MADV_DONTNEED);
  ::posix_fadvise(fd_, off, len, POSIX_FADV_DONTNEED);
}

void RowTier::release_scanned(std::uint64_t first_row, std::uint64_t end_row) {
  if (end_row <= first_row) return;
  const std::uint64_t first = first_row * row_bytes_ / kPage, end = std::min(pages_, (end_row * row_bytes_ + kPage - 1) / kPage);
  for (std::uint64_t p = first; p < end;) {
    if (state_[p].load(std::memory_order_relaxed) != kOut) {
      ++p;
      continue;
    }
    std::uint64_t q = p + 1;
    while (q < end && state_[q].load(std::memory_order_relaxed) == kOut) ++q;
    ::madvise(base_ + p * kPage, (q - p) * kPage, MADV_DONTNEED);
    ::posix_fadvise(fd_, static_cast<off_t>(p * kPage), static_cast<off_t>((q - p) * kPage), POSIX_FADV_DONTNEED);
    p = q;
  }
}

void RowTier::fail(const std::string& what) {
  std::lock_guard lock(mu_);
  if (error_.empty()) {
    error_ = what;
    failed_.store(true);
    spdlog::error("row tier: {}", what);
  }
}

std::string RowTier::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

TierStats RowTier::stats() const {
  constexpr auto r = std::memory_order_relaxed;
  TierStats s;
  s.rows_touched = touched_.load(r);
  s.misses = misses_.load(r);
  s.hinted_rows = hinted_.load(r);
  s.hint_loads = hint_loads_.load(r);
  s.evicted = evicted_.load(r);
  s.written_back = written_back_.load(r);
  s.resident = resident_.load(r);
  s.budget_pages = budget_pages_;
  s.hint_queue = hint_queue_.load(r);
  s.file_bytes = pages_ * kPage;
  return s;
}

}  // namespace ember::ps
