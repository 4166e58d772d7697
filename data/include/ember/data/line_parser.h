// Parses one text line of a Criteo or Avazu file into a Record: label, transformed dense
// features, and one 64-bit value key per categorical table. Allocation-free on the hot path.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ember/data/schema.h"

namespace ember::data {

// Key of a categorical field that was empty.
inline constexpr std::uint64_t kMissingKey = ~std::uint64_t{0};

struct Record {
  std::uint8_t label = 0;
  std::array<float, kMaxDense> dense{};          // log(1 + max(x, 0)); missing -> 0
  std::array<std::uint64_t, kMaxTables> keys{};  // one-hot: raw value key per table, kMissingKey if empty
  // Multi-hot parsers: the raw value keys of each table's bag (an empty field is an
  // empty bag). Cleared, not freed, from line to line.
  std::array<std::vector<std::uint64_t>, kMaxTables> bags;
};

class LineParser {
 public:
  // `first_line` is the file's first line: the header of a CSV format (consumed: call
  // header_consumed()), or the first record of a TSV file (decides whether the file
  // has labels). Throws DataError("...: <why>") when it cannot be a valid start.
  // `multi_hot_sep` != 0: every categorical field is a bag of values separated by it.
  LineParser(SourceFormat format, std::string_view first_line, char multi_hot_sep = 0);
  // ConfigError when `multi_hot_sep` cannot split bags in `format` (its field separator,
  // a quote, a newline).
  static void check_bag_separator(SourceFormat format, char multi_hot_sep);

  // True when the first line was a header and must not be parsed as a record.
  bool header_consumed() const { return header_consumed_; }
  bool has_label() const { return label_col_ >= 0; }
  bool multi_hot() const { return bag_sep_ != 0; }
  const Schema& schema() const { return *schema_; }

  // Parses `line` (no newline; a trailing '\r' is tolerated). On failure returns false
  // and sets `error` to what is wrong, without file or line (the caller adds them).
  // With `dense_values` false, dense fields are validated but not converted (a
  // counting pass needs only the keys).
  bool parse(std::string_view line, Record& out, std::string& error, bool dense_values = true) const;

 private:
  enum class Role : std::uint8_t { kIgnore, kLabel, kDense, kTable, kHour, kId };
  struct Column {
    Role role = Role::kIgnore;
    std::uint16_t index = 0;  // dense or table index
  };

  void init_header(std::string_view header);
  bool split(std::string_view line, std::string& error) const;
  // The raw key of one categorical value (not empty) of table `table`.
  bool value_key(std::string_view f, std::uint16_t table, std::uint64_t& key, std::string& error) const;
  static char bag_separator_in(std::string_view f);
  bool parse_bag(std::string_view f, std::uint16_t table, std::vector<std::uint64_t>& bag, std::string& error) const;
  bool parse_hour(std::string_view f, Record& out, std::string& error) const;

  const Schema* schema_;
  SourceFormat format_;
  char sep_;
  char bag_sep_ = 0;
  bool header_consumed_ = false;
  int label_col_ = -1;
  int hour_table_ = -1;  // Avazu: table index of `hour`; `weekday` follows it
  std::vector<Column> columns_;
  // Scratch for split fields; mutable because parse() is logically const per call and
  // each thread owns its own parser copy.
  mutable std::vector<std::string_view> fields_;
  mutable std::string unquoted_;
};

// Splits one CSV line into fields with RFC 4180 quoting ("a,b" and "" escapes).
// Returns false with `error` set on bad quoting. Views may point into `scratch`.
bool split_csv(std::string_view line, std::vector<std::string_view>& fields, std::string& scratch, std::string& error);

}  // namespace ember::data
