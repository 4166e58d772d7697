#include "ember/ps/disk_tier.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/huge_pages.h"

namespace ember::ps {
namespace {

constexpr std::uint64_t kPage = 4096;
// An extent read or written in one system call: at most this many bytes (neighbouring
// rows of a hint or of a round of write-backs; a checkpoint's scan reads its own blocks).
constexpr std::uint64_t kMaxExtent = 1 << 20;
// A hint's rows are read in chunks of this many: a request waiting for one of them waits
// for its chunk, not the whole hint.
constexpr std::size_t kHintChunk = 512;

std::uint64_t align_down(std::uint64_t x, std::uint64_t a) { return x / a * a; }
std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

// Memory aligned for direct I/O (a thread's buffer, grown as needed).
class AlignedBuffer {
 public:
  ~AlignedBuffer() { std::free(p_); }
  char* get(std::uint64_t bytes) {
    if (bytes > size_) {
      std::free(p_);
      size_ = align_up(bytes, kPage);
      p_ = static_cast<char*>(std::aligned_alloc(kPage, size_));
      if (p_ == nullptr) throw std::bad_alloc();
    }
    return p_;
  }

 private:
  char* p_ = nullptr;
  std::uint64_t size_ = 0;
};

thread_local AlignedBuffer io_buffer;

}  // namespace

DiskTier::DiskTier(const TierConfig& c, std::uint32_t shard, std::uint32_t shards, std::uint64_t rows, std::uint64_t row_bytes)
    : rows_(rows), row_bytes_(row_bytes), io_threads_(std::max<std::uint32_t>(c.io_threads, 1)) {
  const std::string name = "shard-" + std::to_string(shard) + "-of-" + std::to_string(shards);
  if (c.ram_budget_bytes < kMinBudget) throw ConfigError("--ram-budget-mb: at least 0.0625 MB of rows in memory");
  open_file(c, name);
  open_for_io();
  make_slots(c, name);
  pager_ = std::thread([this] { pager_loop(); });
  loader_ = std::thread([this] { loader_loop(); });
  spdlog::info("disk tier: {} rows of {} B in {} ({} MiB, {}), {} rows in memory ({} MiB)", rows, row_bytes, file_.string(),
               file_bytes_ >> 20, direct_ ? "direct I/O, " + std::to_string(sector_) + " B sectors" : "buffered I/O", slot_count_,
               slot_count_ * row_bytes_ >> 20);
}

void DiskTier::open_file(const TierConfig& c, const std::string& name) {
  file_ = c.dir / (name + ".rows");
  const std::filesystem::path record = c.dir / (name + ".json");
  std::error_code ec;
  std::filesystem::create_directories(c.dir, ec);
  if (ec) throw ConfigError("--store-dir " + c.dir.string() + ": " + ec.message());
  lock_fd_.reset(::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_.valid()) throw ConfigError(errno_message("--store-dir: " + file_.string()));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    throw ConfigError("--store-dir: " + file_.string() + " is in use by another ember-ps (" + std::strerror(errno) + ")");
  }
  // The record of what the file holds: another table's directory is refused (its file
  // may be needed by whoever made it), the same table's is reused.
  const nlohmann::json mine{{"table", c.table}, {"rows", rows_}, {"row_bytes", row_bytes_}};
  if (std::filesystem::exists(record)) {
    nlohmann::json theirs;
    try {
      std::ifstream in(record);
      theirs = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw ConfigError("--store-dir: " + record.string() + ": not a disk tier record (" + e.what() + ")");
    }
    if (theirs != mine) {
      throw ConfigError("--store-dir: " + record.string() + " holds another table (" + theirs.dump() + "; this shard: " + mine.dump() +
                        "): give an empty directory");
    }
  }
  write_file_atomic(record, mine.dump() + "\n");
  file_bytes_ = align_up(std::max<std::uint64_t>(rows_ * row_bytes_, 1), kPage);
  if (::ftruncate(lock_fd_.get(), static_cast<off_t>(file_bytes_)) != 0) {
    throw ConfigError(errno_message("--store-dir: " + file_.string() + ": cannot size it to " + std::to_string(file_bytes_) + " bytes"));
  }
  // Reserve every block now: a full disk then fails here, not in the middle of a job.
  if (::fallocate(lock_fd_.get(), 0, 0, static_cast<off_t>(file_bytes_)) != 0) {
    if (errno != EOPNOTSUPP) {
      throw ConfigError(
          errno_message("--store-dir: " + file_.string() + ": cannot reserve " + std::to_string(file_bytes_ >> 20) + " MiB for the rows"));
    }
    spdlog::warn("disk tier: {}: the file system cannot reserve space (fallocate); a full disk will fail the shard later", file_.string());
  }
}

// Direct I/O where the file system has it (the page cache would hold what the budget
// does not allow), with the smallest alignment it takes: a row is read by its sectors.
void DiskTier::open_for_io() {
  fd_.reset(::open(file_.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT));
  if (fd_.valid()) {
    char* probe = io_buffer.get(kPage);
    sector_ = 0;
    for (std::uint64_t a : {std::uint64_t{512}, kPage}) {
      if (::pread(fd_.get(), probe, a, static_cast<off_t>(a == kPage ? 0 : 512)) == static_cast<ssize_t>(a)) {
        sector_ = a;
        break;
      }
    }
    if (sector_ == 0) fd_.reset();
  }
  if (fd_.valid()) return;
  direct_ = false;
  sector_ = 1;
  fd_.reset(::dup(lock_fd_.get()));
  if (!fd_.valid()) throw ConfigError(errno_message("--store-dir: " + file_.string()));
  ::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_RANDOM);
  spdlog::warn("disk tier: {}: no direct I/O on this file system; rows pass through the page cache", file_.string());
}

void DiskTier::make_slots(const TierConfig& c, const std::string& name) {
  slot_count_ = std::max<std::uint64_t>(c.ram_budget_bytes / row_bytes_, kMinSlots);
  if (slot_count_ > kSlotMask - 1) throw ConfigError("--ram-budget-mb: more than 2^32 rows in memory");
  if (c.ram_budget_bytes / row_bytes_ >= rows_) {
    spdlog::warn(
        "disk tier: --ram-budget-mb {:g} holds all {} rows of {} ({:.1f} MB): the disk tier only adds its I/O; "
        "leave out --store-dir and --ram-budget-mb to keep them in RAM",
        static_cast<double>(c.ram_budget_bytes) / (1 << 20), rows_, name, static_cast<double>(rows_ * row_bytes_) / (1 << 20));
  }
  low_ = std::max<std::uint64_t>(slot_count_ / 16, 8);
  high_ = std::max<std::uint64_t>(slot_count_ / 8, 16);
  slot_memory_ = huge_array<char>(slot_count_ * row_bytes_);
  slots_ = slot_memory_.get();
  word_ = std::make_unique<std::atomic<std::uint64_t>[]>(rows_);
  for (std::uint64_t i = 0; i < rows_; ++i) word_[i].store(0, std::memory_order_relaxed);
  owner_ = std::make_unique<std::atomic<std::uint64_t>[]>(slot_count_);
  last_use_ = std::make_unique<std::atomic<std::uint32_t>[]>(slot_count_);
  free_.reserve(slot_count_);
  for (std::uint64_t s = slot_count_; s-- > 0;) {
    owner_[s].store(kNoOwner, std::memory_order_relaxed);
    last_use_[s].store(0, std::memory_order_relaxed);
    free_.push_back(static_cast<std::uint32_t>(s));
  }
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  pager_cv_.notify_all();
  loader_cv_.notify_all();
  free_cv_.notify_all();
  if (pager_.joinable()) pager_.join();
  if (loader_.joinable()) loader_.join();
  // The slots and the files (the lock with them) go with their owners.
}

float* DiskTier::pin(std::uint64_t local, bool write, bool no_read) {
  std::atomic<std::uint64_t>& w = word_[local];
  touched_.fetch_add(1, std::memory_order_relaxed);
  bool waited = false;
  for (int spins = 0;;) {
    std::uint64_t v = w.load(std::memory_order_acquire);
    if ((v & kBusy) != 0) {
      // Being read in (a hint's read in flight) or written out: the request waits for the disk.
      if (!waited) waited = true, misses_.fetch_add(1, std::memory_order_relaxed);
      if (++spins < 32)
        std::this_thread::yield();
      else
        w.wait(v, std::memory_order_acquire);
      continue;
    }
    const auto now = static_cast<std::uint32_t>(now_.load(std::memory_order_relaxed));
    if ((v & kSlotMask) != 0) {
      if (!w.compare_exchange_weak(v, (v + kPin) | (write ? kDirty : 0), std::memory_order_acq_rel)) continue;
      const std::uint64_t s = (v & kSlotMask) - 1;
      if (last_use_[s].load(std::memory_order_relaxed) < now) last_use_[s].store(now, std::memory_order_relaxed);
      return reinterpret_cast<float*>(slot(s));
    }
    if (!w.compare_exchange_weak(v, kBusy, std::memory_order_acq_rel)) continue;
    // Not in memory, and ours to bring in.
    std::uint32_t s = 0;
    bool have_slot = false;
    try {
      s = take_slot();
      have_slot = true;
      if (!no_read) {
        if (!waited) misses_.fetch_add(1, std::memory_order_relaxed);
        read_rows({local}, {s});
      }
    } catch (const std::exception& e) {
      if (have_slot) give_slots({s});
      w.store(0, std::memory_order_release);
      w.notify_all();
      fail(e.what());
      throw IoError("disk tier " + file_.string() + ": " + e.what());
    }
    owner_[s].store(local, std::memory_order_relaxed);
    last_use_[s].store(now, std::memory_order_relaxed);
    resident_.fetch_add(1, std::memory_order_relaxed);
    w.store((s + 1) | kPin | (write || no_read ? kDirty : 0), std::memory_order_release);
    w.notify_all();
    return reinterpret_cast<float*>(slot(s));
  }
}

std::uint32_t DiskTier::take_slot() {
  std::unique_lock lock(mu_);
  if (free_.size() <= low_ && !pager_wanted_) {
    pager_wanted_ = true;
    pager_cv_.notify_one();
  }
  if (free_.empty()) {
    slot_waits_.fetch_add(1, std::memory_order_relaxed);
    while (free_.empty()) {
      if (stop_) throw IoError("the disk tier is shutting down");
      if (failed_.load()) throw IoError(error_);
      pager_wanted_ = true;
      pager_cv_.notify_one();
      free_cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  const std::uint32_t s = free_.back();
  free_.pop_back();
  return s;
}

void DiskTier::give_slots(const std::vector<std::uint32_t>& freed) {
  if (freed.empty()) return;
  {
    std::lock_guard lock(mu_);
    free_.insert(free_.end(), freed.begin(), freed.end());
  }
  free_cv_.notify_all();
}

std::vector<DiskTier::Extent> DiskTier::extents_of(const std::vector<std::uint64_t>& locals) const {
  std::vector<Extent> out;
  for (std::size_t i = 0; i < locals.size(); ++i) {
    const std::uint64_t from = align_down(locals[i] * row_bytes_, sector_), to = align_up((locals[i] + 1) * row_bytes_, sector_);
    // Sectors shared with the extent before: the same extent (two threads must never
    // read-modify-write one sector); touching ones: joined while the extent is small.
    if (!out.empty() && (from < out.back().to || (from == out.back().to && to - out.back().from <= kMaxExtent))) {
      out.back().to = std::max(out.back().to, to);
      out.back().end = i + 1;
    } else {
      out.push_back({i, i + 1, from, to});
    }
  }
  return out;
}

void DiskTier::pread_all(char* buf, std::uint64_t bytes, std::uint64_t offset) {
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd_.get(), buf + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(n < 0 ? errno_message("reading rows from " + file_.string()) : file_.string() + ": ends early (truncated?)");
    done += static_cast<std::uint64_t>(n);
  }
  bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  if (!direct_) ::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
}

void DiskTier::pwrite_all(const char* buf, std::uint64_t bytes, std::uint64_t offset) {
  for (std::uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd_.get(), buf + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(errno_message("writing rows back to " + file_.string()));
    done += static_cast<std::uint64_t>(n);
  }
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  if (!direct_) {
    // Written through, then dropped: the page cache does not keep what the budget does not.
    const auto off = static_cast<off_t>(offset), len = static_cast<off_t>(bytes);
    if (::sync_file_range(fd_.get(), off, len, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
      throw IoError(errno_message("writing rows back to " + file_.string()));
    }
    ::posix_fadvise(fd_.get(), off, len, POSIX_FADV_DONTNEED);
  }
}

void DiskTier::on_io_threads(std::size_t n, const std::function<void(std::size_t)>& fn) {
  const std::size_t threads = std::min<std::size_t>(io_threads_, n);
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mu;
  auto work = [&] {
    try {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    } catch (...) {
      std::lock_guard lock(error_mu);
      if (!first_error) first_error = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

void DiskTier::read_rows(const std::vector<std::uint64_t>& locals, const std::vector<std::uint32_t>& dest) {
  const std::vector<Extent> extents = extents_of(locals);
  on_io_threads(extents.size(), [&](std::size_t i) {
    const Extent& e = extents[i];
    char* buf = io_buffer.get(e.to - e.from);
    pread_all(buf, e.to - e.from, e.from);
    for (std::size_t j = e.first; j < e.end; ++j) std::memcpy(slot(dest[j]), buf + (locals[j] * row_bytes_ - e.from), row_bytes_);
  });
}

void DiskTier::write_rows(const std::vector<std::uint64_t>& locals, const std::vector<std::uint32_t>& src) {
  const std::vector<Extent> extents = extents_of(locals);
  on_io_threads(extents.size(), [&](std::size_t i) {
    const Extent& e = extents[i];
    char* buf = io_buffer.get(e.to - e.from);
    // Sectors the rows do not cover whole are read first (the file's only writer is this
    // thread's round, so what it reads of other rows is what it writes back).
    const bool whole = locals[e.first] * row_bytes_ == e.from && (locals[e.end - 1] + 1) * row_bytes_ == e.to &&
                       locals[e.end - 1] - locals[e.first] == e.end - 1 - e.first;
    if (!whole) pread_all(buf, e.to - e.from, e.from);
    for (std::size_t j = e.first; j < e.end; ++j) std::memcpy(buf + (locals[j] * row_bytes_ - e.from), slot(src[j]), row_bytes_);
    pwrite_all(buf, e.to - e.from, e.from);
  });
}

void DiskTier::hint(std::vector<std::uint64_t> locals, std::uint64_t iteration) {
  hinted_.fetch_add(locals.size(), std::memory_order_relaxed);
  std::erase_if(locals, [&](std::uint64_t l) { return l >= rows_; });
  {
    std::lock_guard lock(mu_);
    hints_.emplace_back(std::move(locals), iteration);
  }
  hint_queue_.fetch_add(1, std::memory_order_relaxed);
  loader_cv_.notify_one();
}

void DiskTier::loader_loop() {
  for (;;) {
    std::vector<std::pair<std::vector<std::uint64_t>, std::uint64_t>> work;
    {
      std::unique_lock lock(mu_);
      loader_cv_.wait(lock, [&] { return stop_ || !hints_.empty(); });
      if (stop_) return;
      work.swap(hints_);
    }
    for (auto& [locals, iteration] : work) {
      if (!failed()) {
        try {
          load_hinted(locals, iteration);
        } catch (const std::exception& e) {
          {
            std::lock_guard lock(mu_);
            if (stop_) return;  // cut short by the shutdown: not an error
          }
          fail(e.what());
        }
      }
      hint_queue_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
}

void DiskTier::load_hinted(std::vector<std::uint64_t>& locals, std::uint64_t iteration) {
  std::sort(locals.begin(), locals.end());
  locals.erase(std::unique(locals.begin(), locals.end()), locals.end());
  const auto until = static_cast<std::uint32_t>(iteration);
  // At most half the slots for one hint: more would push out the hint's own rows.
  const std::size_t most = slot_count_ / 2;
  std::vector<std::uint64_t> mine;
  std::vector<std::uint32_t> slots;
  std::size_t taken = 0;
  auto read_chunk = [&] {
    if (mine.empty()) return;
    slots.clear();
    try {
      for (std::size_t i = 0; i < mine.size(); ++i) slots.push_back(take_slot());
      read_rows(mine, slots);
    } catch (...) {
      give_slots(slots);
      for (std::uint64_t l : mine) word_[l].store(0, std::memory_order_release), word_[l].notify_all();
      throw;
    }
    for (std::size_t i = 0; i < mine.size(); ++i) {
      owner_[slots[i]].store(mine[i], std::memory_order_relaxed);
      last_use_[slots[i]].store(until, std::memory_order_relaxed);
      word_[mine[i]].store(slots[i] + 1, std::memory_order_release);
      word_[mine[i]].notify_all();
    }
    resident_.fetch_add(mine.size(), std::memory_order_relaxed);
    hint_loads_.fetch_add(mine.size(), std::memory_order_relaxed);
    mine.clear();
  };
  for (std::uint64_t l : locals) {
    std::uint64_t v = word_[l].load(std::memory_order_acquire);
    if ((v & kSlotMask) != 0 && (v & kBusy) == 0) {
      // In memory: kept until the iteration named.
      std::atomic<std::uint32_t>& use = last_use_[(v & kSlotMask) - 1];
      if (use.load(std::memory_order_relaxed) < until) use.store(until, std::memory_order_relaxed);
      continue;
    }
    if (v != 0 || taken >= most || !word_[l].compare_exchange_strong(v, kBusy, std::memory_order_acq_rel)) continue;
    mine.push_back(l);
    ++taken;
    if (mine.size() == kHintChunk) read_chunk();
  }
  read_chunk();
}

void DiskTier::pager_loop() {
  for (;;) {
    std::uint64_t want = 0;
    {
      std::unique_lock lock(mu_);
      pager_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || pager_wanted_; });
      if (stop_) return;
      const bool asked = pager_wanted_;
      pager_wanted_ = false;
      if (free_.size() < high_ && (asked || free_.size() <= low_)) want = high_ - free_.size();
    }
    if (want > 0 && !failed()) evict(want);
  }
}

void DiskTier::evict(std::uint64_t want) {
  const std::lock_guard round(evict_mu_);
  // The least recently used rows that nobody pins (a row hinted for a later iteration
  // counts as used then).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> candidates;  // last use, slot
  candidates.reserve(slot_count_);
  for (std::uint64_t s = 0; s < slot_count_; ++s) {
    const std::uint64_t o = owner_[s].load(std::memory_order_acquire);
    if (o == kNoOwner) continue;
    const std::uint64_t v = word_[o].load(std::memory_order_relaxed);
    if ((v & (kBusy | kPinMask)) != 0 || (v & kSlotMask) != s + 1) continue;
    candidates.emplace_back(last_use_[s].load(std::memory_order_relaxed), static_cast<std::uint32_t>(s));
  }
  if (candidates.size() > want) {
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(want), candidates.end());
    candidates.resize(want);
  }
  std::vector<std::pair<std::uint64_t, std::uint32_t>> dirty;  // row, slot
  std::vector<std::uint32_t> freed;
  for (const auto& [use, s] : candidates) {
    const std::uint64_t o = owner_[s].load(std::memory_order_acquire);
    if (o == kNoOwner) continue;
    std::uint64_t v = word_[o].load(std::memory_order_acquire);
    if ((v & (kBusy | kPinMask)) != 0 || (v & kSlotMask) != s + 1) continue;
    if (!word_[o].compare_exchange_strong(v, v | kBusy, std::memory_order_acq_rel)) continue;  // pinned meanwhile
    if ((v & kDirty) != 0) {
      dirty.emplace_back(o, s);
      continue;
    }
    owner_[s].store(kNoOwner, std::memory_order_relaxed);
    word_[o].store(0, std::memory_order_release);
    word_[o].notify_all();
    freed.push_back(s);
  }
  const std::uint64_t clean = freed.size();
  give_slots(freed);
  std::sort(dirty.begin(), dirty.end());
  std::vector<std::uint64_t> rows(dirty.size());
  std::vector<std::uint32_t> from(dirty.size());
  for (std::size_t i = 0; i < dirty.size(); ++i) rows[i] = dirty[i].first, from[i] = dirty[i].second;
  try {
    write_rows(rows, from);
  } catch (const std::exception& e) {
    fail(e.what());
    // Nothing is lost: the rows stay in memory, dirty (the store refuses requests now).
    for (const auto& [o, s] : dirty) word_[o].store((s + 1) | kDirty, std::memory_order_release), word_[o].notify_all();
    resident_.fetch_sub(clean, std::memory_order_relaxed);
    evicted_.fetch_add(clean, std::memory_order_relaxed);
    return;
  }
  freed.clear();
  for (const auto& [o, s] : dirty) {
    owner_[s].store(kNoOwner, std::memory_order_relaxed);
    word_[o].store(0, std::memory_order_release);
    word_[o].notify_all();
    freed.push_back(s);
  }
  give_slots(freed);
  resident_.fetch_sub(clean + dirty.size(), std::memory_order_relaxed);
  evicted_.fetch_add(clean + dirty.size(), std::memory_order_relaxed);
  written_back_.fetch_add(dirty.size(), std::memory_order_relaxed);
}

void DiskTier::scan(std::uint64_t first, std::uint64_t end, const std::vector<bool>& listed,
                    const std::function<void(std::uint64_t, const char*)>& fn) {
  if (end <= first) return;
  const std::lock_guard no_writes(evict_mu_);  // what is on disk stays there, what is in memory stays there
  const std::uint64_t from = align_down(first * row_bytes_, sector_), to = align_up(end * row_bytes_, sector_);
  const std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(kPage, align_up(to - from, kPage))),
                                                        &std::free);
  if (!buf) throw std::bad_alloc();
  pread_all(buf.get(), to - from, from);
  for (std::uint64_t l = first; l < end; ++l) {
    if (!listed[l]) continue;
    const std::uint64_t v = word_[l].load(std::memory_order_acquire);
    // A row being read in is on disk as it is; none is being written out.
    if ((v & kSlotMask) != 0 && (v & kBusy) == 0)
      fn(l, slot((v & kSlotMask) - 1));
    else
      fn(l, buf.get() + (l * row_bytes_ - from));
  }
}

void DiskTier::fail(const std::string& what) {
  std::lock_guard lock(mu_);
  if (error_.empty()) {
    error_ = what;
    failed_.store(true);
    spdlog::error("disk tier: {}", what);
  }
}

std::string DiskTier::error() const {
  std::lock_guard lock(mu_);
  return error_;
}

TierStats DiskTier::stats() const {
  constexpr auto r = std::memory_order_relaxed;
  TierStats s;
  s.rows_touched = touched_.load(r);
  s.misses = misses_.load(r);
  s.hinted_rows = hinted_.load(r);
  s.hint_loads = hint_loads_.load(r);
  s.evicted = evicted_.load(r);
  s.written_back = written_back_.load(r);
  s.resident = resident_.load(r);
  s.budget_rows = slot_count_;
  s.hint_queue = hint_queue_.load(r);
  s.slot_waits = slot_waits_.load(r);
  s.bytes_read = bytes_read_.load(r);
  s.bytes_written = bytes_written_.load(r);
  s.file_bytes = file_bytes_;
  s.row_bytes = row_bytes_;
  return s;
}

}  // namespace ember::ps
