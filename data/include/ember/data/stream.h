// A stream of raw lines (Criteo TSV / CSV, Avazu CSV) that keep coming, cut into global
// batches with hashed ids (hashed_ids.h): from a directory whose files keep coming
// (DirectoryStream), or from a Kafka topic (KafkaStream, kafka_stream.cc).
//
// Every worker reads the same source and forms the same batches without talking: the
// records come in one fixed order (a directory: files in name order, each once it is in
// place, line after line; Kafka: below), and global batch t is records [tN, (t+1)N) of
// that order, never cut by time. A batch waits for its records, however long they take
// to come. So a job on a stream trains what a job on `ember-data prep --ids hash` of the
// same lines in that order, unshuffled, trains.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/schema.h"
#include "ember/data/text_input.h"

namespace ember::data {

class BatchBuilder;  // stream_batches.h

struct StreamOptions {
  // A directory, or kafka://HOST:PORT[,HOST:PORT...]/TOPIC.
  std::string source;
  SourceFormat format = SourceFormat::kCriteoTsv;
  char multi_hot_sep = 0;  // != 0: every categorical field is a bag of values split by it
  // Bags: the most values a bag may hold (the stream's bound, not known ahead as a
  // prepared dataset's is: it sizes the workers' staging); a line with a longer bag is a
  // bad line, passed over and logged.
  std::uint32_t max_bag = 64;
  std::uint32_t poll_ms = 50;
  // Asked while the stream waits for files; true ends the wait (next() returns false).
  std::function<bool()> stopped;
};

// The manifest of a stream's batches: the format's schema, dynamic tables of hashed ids,
// no rows (bags: each table's bound `max_bag`). (What `prep --ids hash` of the same
// format writes, less its shards.)
Manifest stream_manifest(SourceFormat format, char multi_hot_sep, std::uint32_t max_bag = 64);

// The records of a stream formed into global batches (a directory's or a Kafka topic's).
class RecordStream {
 public:
  virtual ~RecordStream() = default;
  // The next global batch, waiting for its records as long as it takes; the view holds
  // until the next call. False when StreamOptions::stopped ended a wait.
  virtual bool next(Batch& batch) = 0;
  // Passes over `batches` batches (those a resumed job trained); false when stopped.
  virtual bool skip(std::uint64_t batches) = 0;
  // Where the stream is, as one line of JSON (what a dense checkpoint keeps).
  virtual std::string position_json() const = 0;
  // Goes on from a position_json() of a stream of this source (a checkpoint's), before
  // any next(). DataError naming `origin` when it does not fit the source.
  virtual void seek_json(const std::string& text, const std::string& origin) = 0;
  // Where the stream starts, decided now (Kafka: the partitions and their earliest
  // offsets, which one worker decides for all); empty where the source fixes it (a
  // directory). False stopped: empty too.
  virtual std::string start_position_json() { return {}; }
};

// The stream of `o.source`: kafka://... a KafkaStream, else a DirectoryStream. ConfigError
// for a Kafka source in a build without librdkafka (has_kafka()).
std::unique_ptr<RecordStream> open_stream(StreamOptions o, std::size_t batch_size);
bool has_kafka();

// Where a directory stream is: the record it reads next.
struct StreamPosition {
  std::string file;             // its file's name in the directory ("" before the first file)
  std::uint64_t line = 0;       // the line it is on in that file (1-based; 0: the file's start)
  std::uint64_t records = 0;    // records read before it
  std::uint64_t bad_lines = 0;  // lines passed over (logged with FILE:LINE)
  std::uint64_t files = 0;      // files finished
  std::uint64_t batches = 0;    // batches formed before it

  // One line of JSON (what a checkpoint keeps), and back: DataError naming `origin`.
  std::string to_json() const;
  static StreamPosition from_json(const std::string& text, const std::string& origin);
};

// Files in name order, each read once in place: a writer renames it in (names that start
// with '.' or hold ".tmp" are not read yet).
class DirectoryStream : public RecordStream {
 public:
  // Throws ConfigError when `o.source` is not a directory.
  DirectoryStream(StreamOptions o, std::size_t batch_size);
  ~DirectoryStream();
  DirectoryStream(const DirectoryStream&) = delete;
  DirectoryStream& operator=(const DirectoryStream&) = delete;

  // The next global batch (`batch_size` records), waiting for files as long as it takes;
  // the view holds until the next call. False when `stopped` ended a wait. Throws
  // DataError when a file appears whose name sorts before one already read (the order
  // the workers agree on would differ) or a file cannot be read.
  bool next(Batch& batch) override;
  bool skip(std::uint64_t batches) override;
  std::string position_json() const override { return pos_.to_json(); }
  void seek_json(const std::string& text, const std::string& origin) override { seek(StreamPosition::from_json(text, origin)); }
  // Goes on from `p` (a checkpoint's position): its file opened at its line, the files
  // named before it taken as read (they may be gone). Before any next(). DataError when
  // the file is gone or shorter than the position says.
  void seek(const StreamPosition& p);
  const StreamPosition& position() const { return pos_; }

 private:
  // The next record into columns_; false when stopped.
  bool read_record();
  // The next line of the stream (a view valid until the next call); false when stopped.
  bool next_line(std::string_view& line);
  // Opens the next file in name order, waiting for one; false when stopped.
  bool open_next_file();
  // The parser of file `path` from its first line; DataError naming it (no labels too).
  void open_parser(const std::filesystem::path& path);
  std::optional<std::string> next_file_name();
  StreamOptions o_;
  std::filesystem::path dir_;
  StreamPosition pos_;
  std::vector<std::string> begun_;  // names opened, in order (the last one bounds the next)
  std::unique_ptr<TextInput> input_;
  std::optional<LineParser> parser_;
  std::string_view block_;
  std::size_t at_ = 0;  // in block_
  bool skip_header_ = false;
  Record record_;
  std::string error_;
  std::unique_ptr<BatchBuilder> builder_;
};

}  // namespace ember::data
