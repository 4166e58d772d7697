// A PS shard's disk tier as `ember-ps --store-dir --ram-budget-mb` runs it
// (ps/src/disk_tier.cc), for ember-sim's prediction of disk reads: at most the budget's
// rows in memory (budget / row bytes, rows of this shard whichever they are), the least
// recently used dropped first; a row never used before is not read (its first use
// initializes it). A hinted row is read when the hint comes and kept until the iteration
// it names. Private to the simulator.
//
// Simpler than the pager: it drops a row the moment the budget is full, where the pager
// keeps a reserve of free slots; a row read ahead is counted at once, where the shard's
// loader reads it in the background.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <unordered_set>

#include "ember/common/types.h"

namespace ember::scheduler {

class TierModel {
 public:
  TierModel(std::uint64_t budget_bytes, std::uint64_t row_bytes);

  // A request of iteration `iteration` reads or writes the row at local index `local`:
  // if it was used before and is not in memory, a read on the critical path.
  void touch(std::uint64_t iteration, std::uint64_t local);
  // A hint, at iteration `now`, names the row for iteration `until`: if it was used
  // before and is not in memory, read now, off the critical path; it is not dropped
  // before `until` is done.
  void hint(std::uint64_t now, std::uint64_t until, std::uint64_t local);

  std::uint64_t reads() const { return reads_; }              // every row read, critical or hinted
  std::uint64_t critical_reads() const { return critical_; }  // rows a request waited for
  std::uint64_t rows_touched() const { return touched_; }     // rows requests used
  std::uint64_t budget_rows() const { return budget_; }

 private:
  struct Row {
    std::list<std::uint64_t>::iterator at;  // in lru_, the most recent first
    std::uint64_t keep_before;              // kept while iterations before it run (0: none)
  };
  // Brings the row in as the most recently used at `iteration`, kept while iterations
  // before `keep_before` run; true when it was read (out, and `on_disk`).
  bool use(std::uint64_t local, std::uint64_t iteration, std::uint64_t keep_before, bool on_disk);
  void make_room(std::uint64_t iteration);

  std::uint64_t budget_;
  std::list<std::uint64_t> lru_;
  std::unordered_map<std::uint64_t, Row> in_;
  std::unordered_set<std::uint64_t> used_;  // rows used at least once (on disk once dropped)
  std::uint64_t reads_ = 0, critical_ = 0, touched_ = 0;
};

}  // namespace ember::scheduler
