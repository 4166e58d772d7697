// The global batches of a stream: records, their ids hashed as `prep --ids hash` hashes
// them, gathered into an in-memory shard (ShardColumns) that a Batch views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/schema.h"

namespace ember::data {

// What both stream sources (stream.cc, kafka_stream.cc) log: the first bad lines, and a
// wait for records this long.
inline constexpr std::uint64_t kStreamBadLinesLogged = 10;
inline constexpr double kStreamWaitLogSeconds = 30;

// An empty line (or one of a lone '\r') is no record.
inline bool blank_line(std::string_view line) { return line.empty() || (line.size() == 1 && line[0] == '\r'); }

class BatchBuilder {
 public:
  BatchBuilder(SourceFormat format, char multi_hot_sep, std::uint32_t max_bag, std::size_t batch_size);

  // Whether a parsed record fits the stream's bounds (bags of at most max_bag values);
  // else why not, in `why`.
  bool fits(const Record& r, std::string& why) const;
  void add(const Record& r);
  bool full() const { return columns_.rows() == batch_size_; }
  std::size_t batch_size() const { return batch_size_; }
  // The records added (a full batch) as batch `index`, valid until the next take(); the
  // next records start a new batch.
  Batch take(std::uint64_t index);

 private:
  void start();

  std::uint32_t num_dense_, num_tables_;
  bool multi_hot_;
  std::uint32_t max_bag_;
  const Schema* schema_;
  std::size_t batch_size_;
  ShardColumns columns_;
  std::unique_ptr<Shard> shard_;  // the last batch's
};

}  // namespace ember::data
