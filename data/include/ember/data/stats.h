// `ember-data stats`: skew and infrequency of a prepared dataset's tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/data/dataset.h"

namespace ember::data {

struct StatsOptions {
  Split split = Split::kTrain;
  int workers = 8;           // for DoI: samples one worker trains per epoch = rows / workers
  double cache_ratio = 0.1;  // for DoI: a worker caches this share of each table's rows
  std::uint64_t window = 0;  // > 0: also the mean share of distinct values per window of rows
};

struct TableStats {
  std::string name;
  std::uint64_t rows = 0;         // embedding rows of the table
  std::uint64_t distinct = 0;     // rows accessed at least once in the split
  double top1_share = 0;          // accesses taken by the most popular 1% of rows
  double top10_share = 0;         // ... and 10%
  std::uint64_t cached_rows = 0;  // ceil(cache_ratio * rows)
  // Herald's degree of infrequency: among the cached_rows most popular rows, the share
  // accessed fewer times in the epoch than one worker's samples per epoch.
  double doi = 0;
  double window_distinct = 0;  // mean distinct non-missing ids per window / window
  // The same, expected if the split's rows were in random order (same counts). The
  // ratio window_distinct / window_distinct_random measures temporal locality: 1 = none,
  // lower = values come in bursts.
  double window_distinct_random = 0;
  double missing_share = 0;  // accesses of the reserved "missing" row
  double mean_bag = 1;       // ids per sample (multi-hot datasets; 1 when one-hot)
  std::uint32_t max_bag = 1;
};

struct DatasetStats {
  std::string split;
  std::uint64_t samples = 0;
  double positive_rate = 0;
  int workers = 0;
  double cache_ratio = 0;
  std::uint64_t window = 0;
  std::vector<TableStats> tables;
  double doi = 0;  // over the union of every table's cached rows
  bool multi_hot = false;
};

// How many times the samples of `split` access each row of table `table` (index = row;
// saturates at UINT32_MAX); with `once_per_sample`, how many samples do (an id repeated
// in a bag counts once; the same for one-hot data). Throws DataError for an id beyond the
// table's rows.
std::vector<std::uint32_t> row_counts(const Dataset& dataset, Split split, int table, bool once_per_sample = false);

DatasetStats compute_stats(const Dataset& dataset, const StatsOptions& options);
std::string stats_json(const DatasetStats& stats);   // one JSON object
std::string stats_table(const DatasetStats& stats);  // human-readable

}  // namespace ember::data
