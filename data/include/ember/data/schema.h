// What each supported source format contains: label, dense features, categorical tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember::data {

enum class SourceFormat {
  kCriteoTsv,  // Criteo Kaggle / 1TB: label, I1-I13, C1-C26, tab-separated (test.txt: no label)
  kCriteoCsv,  // Kaggle competition CSV (Id,Label,I1..C26) or DeepCTR CSV (label,I1..C26), header
  kAvazu,      // Avazu train.csv / test.csv: id,click,hour,C1,...,C21, header
};

// "criteo", "criteo-csv", "avazu"; throws ConfigError otherwise.
SourceFormat parse_source_format(std::string_view name);
std::string_view format_name(SourceFormat format);

// Upper bounds, so that a parsed record fits in fixed arrays on the hot path.
inline constexpr int kMaxDense = 16;
inline constexpr int kMaxTables = 64;

struct Schema {
  SourceFormat format;
  std::vector<std::string> dense_names;  // I1..I13 for Criteo, none for Avazu
  std::vector<std::string> table_names;  // one embedding table per categorical feature
  int num_dense() const { return static_cast<int>(dense_names.size()); }
  int num_tables() const { return static_cast<int>(table_names.size()); }
};

// Criteo: 13 dense, 26 tables (C1..C26). Avazu: 0 dense, 23 tables: the 21 raw
// categorical columns (C1, banner_pos, ..., C21) then `hour` (hour of day, from the
// YYMMDDHH field) and `weekday`.
const Schema& schema_for(SourceFormat format);

// The header line of a CSV format's public files, in their column order (Avazu's train
// file: id,click,hour,C1,banner_pos,...,C21; criteo-csv: label,I1..I13,C1..C26), without
// a newline; empty for Criteo TSV (no header). Lines without a header (a Kafka message's)
// are read in this order.
std::string standard_header(SourceFormat format);

// Row ids every table reserves before the values it saw.
inline constexpr std::uint64_t kMissingRow = 0;  // the field was empty
inline constexpr std::uint64_t kOovRow = 1;      // seen fewer than --min-count times
inline constexpr std::uint64_t kFirstValueRow = 2;

}  // namespace ember::data
