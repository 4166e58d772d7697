// A PS shard's disk tier as `ember-ps --store-dir --ram-budget-mb` runs it
// (ps/src/row_tier.cc), for ember-sim's prediction of disk reads: the shard's rows at
// local index k div S in one fixed-stride file, read and dropped by 4 KiB pages, at most
// the budget's pages in memory, the least recently used dropped first. A hinted row's
// pages are read when the hint comes and kept until the iteration it names. Private to
// the simulator.
//
// Simpler than the pager: it drops a page the moment the budget is full, where the pager
// drops a batch down to 7/8 of it; a page read ahead is counted at once, where the
// shard's loader reads it in the background.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>

#include "ember/common/types.h"

namespace ember::scheduler {

class TierModel {
 public:
  static constexpr std::uint64_t kPageBytes = 4096;
  TierModel(std::uint64_t budget_bytes, std::uint64_t row_bytes);

  // A request of iteration `iteration` reads or writes the row at local index `local`:
  // each of its pages not in memory is a read on the critical path.
  void touch(std::uint64_t iteration, std::uint64_t local);
  // A hint, at iteration `now`, names the row for iteration `until`: its pages out are
  // read now, off the critical path, and none is dropped before `until` is done.
  void hint(std::uint64_t now, std::uint64_t until, std::uint64_t local);

  std::uint64_t reads() const { return reads_; }              // every page read, critical or hinted
  std::uint64_t critical_reads() const { return critical_; }  // pages a request waited for
  std::uint64_t pages_touched() const { return touched_; }    // pages requests used
  std::uint64_t budget_pages() const { return budget_; }

 private:
  struct Page {
    std::list<std::uint64_t>::iterator at;  // in lru_, the most recent first
    std::uint64_t keep_before;              // kept while iterations before it run (0: none)
  };
  // Brings `page` in (a read when out) as the most recently used at `iteration`, kept
  // while iterations before `keep_before` run; true when it was out.
  bool use(std::uint64_t page, std::uint64_t iteration, std::uint64_t keep_before);
  void make_room(std::uint64_t iteration);
  std::pair<std::uint64_t, std::uint64_t> pages_of(std::uint64_t local) const;  // the first and last page of a row

  std::uint64_t budget_, row_bytes_;
  std::list<std::uint64_t> lru_;
  std::unordered_map<std::uint64_t, Page> in_;
  std::uint64_t reads_ = 0, critical_ = 0, touched_ = 0;
};

}  // namespace ember::scheduler
