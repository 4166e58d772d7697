#include "ember/data/stream.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <utility>

#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/data/hashed_ids.h"
#include "kafka_stream.h"
#include "stream_batches.h"

namespace ember::data {

namespace {

// A file a writer has put in place: not hidden, not a temporary (write_file_atomic's and
// gen's "NAME.tmp-..."), a regular file.
bool in_place(const std::filesystem::directory_entry& e) {
  const std::string name = e.path().filename().string();
  std::error_code ec;
  return !name.empty() && name[0] != '.' && name.find(".tmp") == std::string::npos && e.is_regular_file(ec);
}

}  // namespace

std::unique_ptr<RecordStream> open_stream(StreamOptions o, std::size_t batch_size) {
  if (o.source.rfind("kafka://", 0) == 0) return open_kafka_stream(std::move(o), batch_size);
  return std::make_unique<DirectoryStream>(std::move(o), batch_size);
}

Manifest stream_manifest(SourceFormat format, char multi_hot_sep, std::uint32_t max_bag) {
  const Schema& schema = schema_for(format);
  Manifest m;
  m.format_version = multi_hot_sep != 0 ? kMultiHotFormatVersion : kDatasetFormatVersion;
  m.source_format = std::string(format_name(format));
  m.dense_names = schema.dense_names;
  m.multi_hot = multi_hot_sep != 0;
  m.multi_hot_sep = multi_hot_sep;
  m.hashed_ids = true;
  for (const std::string& name : schema.table_names) {
    TableInfo t;
    t.name = name;
    t.rows = 0;  // dynamic
    t.id_bytes = 8;
    if (m.multi_hot) t.max_bag = max_bag;
    m.tables.push_back(t);
  }
  return m;
}

DirectoryStream::DirectoryStream(StreamOptions o, std::size_t batch_size) : o_(std::move(o)), dir_(o_.source) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir_, ec)) throw ConfigError("--stream " + o_.source + ": not a directory");
  if (batch_size == 0) throw ConfigError("--stream: a global batch of 0 records");
  builder_ = std::make_unique<BatchBuilder>(o_.format, o_.multi_hot_sep, o_.max_bag, batch_size);
}

DirectoryStream::~DirectoryStream() = default;

std::optional<std::string> DirectoryStream::next_file_name() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    if (in_place(e)) names.push_back(e.path().filename().string());
  }
  if (ec) throw IoError("--stream " + dir_.string() + ": " + ec.message());
  std::sort(names.begin(), names.end());
  const std::string* last = begun_.empty() ? nullptr : &begun_.back();
  for (const std::string& n : names) {
    if (last == nullptr || n > *last) return n;
    // Sorted before a file read already: another worker may have read it in order.
    if (!std::binary_search(begun_.begin(), begun_.end(), n)) {
      throw DataError("--stream " + (dir_ / n).string() + ": appeared after " + *last +
                      " was read; files must come in name order (every worker reads the same batches)");
    }
  }
  return std::nullopt;
}

void DirectoryStream::open_parser(const std::filesystem::path& path) {
  try {
    parser_.emplace(o_.format, read_first_line(path), o_.multi_hot_sep);
  } catch (const DataError& e) {
    throw DataError(path.string() + ":1: " + e.what());
  }
  // A file without labels (a test split) would train every line as a 0.
  if (!parser_->has_label()) throw DataError(path.string() + ":1: no label column; a stream trains on labelled lines");
  skip_header_ = parser_->header_consumed();
}

bool DirectoryStream::open_next_file() {
  Stopwatch waited;
  double logged = 0;
  for (;;) {
    std::optional<std::string> name = next_file_name();
    if (!name) {
      if (o_.stopped && o_.stopped()) return false;
      if (waited.seconds() - logged >= kStreamWaitLogSeconds) {
        logged = waited.seconds();
        spdlog::info("--stream {}: waiting for the next file after {} ({} records read)", dir_.string(),
                     begun_.empty() ? std::string("none") : begun_.back(), pos_.records);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.poll_ms));
      continue;
    }
    const std::filesystem::path path = dir_ / *name;
    begun_.push_back(*name);
    pos_.file = *name;
    pos_.line = 0;
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == 0 && !ec) {  // nothing in it
      ++pos_.files;
      continue;
    }
    open_parser(path);
    input_ = std::make_unique<TextInput>(path);
    block_ = {};
    at_ = 0;
    return true;
  }
}

bool DirectoryStream::next_line(std::string_view& line) {
  for (;;) {
    if (!input_ && !open_next_file()) return false;
    if (at_ >= block_.size()) {
      if (input_->next(block_)) {
        at_ = 0;
        continue;
      }
      ++pos_.files;
      input_.reset();
      continue;
    }
    const std::size_t nl = block_.find('\n', at_);
    const std::size_t end = nl == std::string_view::npos ? block_.size() : nl;
    line = block_.substr(at_, end - at_);
    at_ = end + 1;
    ++pos_.line;
    if (skip_header_ && pos_.line == 1) continue;
    return true;
  }
}

bool DirectoryStream::read_record() {
  std::string_view line;
  for (;;) {
    if (!next_line(line)) return false;
    if (blank_line(line)) continue;
    if (parser_->parse(line, record_, error_, true) && builder_->fits(record_, error_)) break;
    if (pos_.bad_lines++ < kStreamBadLinesLogged)
      spdlog::warn("--stream {}:{}: {} (line passed over)", (dir_ / pos_.file).string(), pos_.line, error_);
  }
  ++pos_.records;
  return true;
}

BatchBuilder::BatchBuilder(SourceFormat format, char multi_hot_sep, std::uint32_t max_bag, std::size_t batch_size)
    : num_dense_(static_cast<std::uint32_t>(schema_for(format).num_dense())),
      num_tables_(static_cast<std::uint32_t>(schema_for(format).num_tables())),
      multi_hot_(multi_hot_sep != 0),
      max_bag_(max_bag),
      schema_(&schema_for(format)),
      batch_size_(batch_size) {
  if (multi_hot_ && max_bag_ == 0) throw ConfigError("--stream-max-bag 0: a bag holds at least one value");
  start();
}

bool BatchBuilder::fits(const Record& r, std::string& why) const {
  if (!multi_hot_) return true;
  for (unsigned t = 0; t < num_tables_; ++t) {
    if (r.bags[t].size() > max_bag_) {
      why = "a bag of " + std::to_string(r.bags[t].size()) + " values in " + schema_->table_names[t] + ", over --stream-max-bag " +
            std::to_string(max_bag_);
      return false;
    }
  }
  return true;
}

void BatchBuilder::start() {
  columns_ = ShardColumns{};
  columns_.num_dense = num_dense_;
  columns_.num_tables = num_tables_;
  columns_.labels.reserve(batch_size_);
  if (multi_hot_) {
    columns_.bag_offsets.push_back(0);
  } else {
    columns_.columns.assign(num_tables_, {});
    for (auto& col : columns_.columns) col.reserve(batch_size_);
  }
}

void BatchBuilder::add(const Record& r) {
  ShardColumns& c = columns_;
  c.labels.push_back(r.label);
  c.dense.insert(c.dense.end(), r.dense.begin(), r.dense.begin() + num_dense_);
  for (unsigned t = 0; t < num_tables_; ++t) {
    if (multi_hot_) {
      for (std::uint64_t key : r.bags[t]) c.bag_ids.push_back(hashed_id(t, key));
      c.bag_offsets.push_back(static_cast<std::uint32_t>(c.bag_ids.size()));
    } else {
      c.columns[t].push_back(hashed_id(t, r.keys[t]));
    }
  }
}

Batch BatchBuilder::take(std::uint64_t index) {
  shard_ = std::make_unique<Shard>(std::move(columns_));
  start();
  return Batch::whole(*shard_, index);
}

bool DirectoryStream::next(Batch& batch) {
  while (!builder_->full()) {
    if (!read_record()) return false;
    builder_->add(record_);
  }
  batch = builder_->take(pos_.batches++);
  return true;
}

bool DirectoryStream::skip(std::uint64_t batches) {
  for (std::uint64_t i = 0; i < batches * builder_->batch_size(); ++i) {
    if (!read_record()) return false;
  }
  pos_.batches += batches;
  return true;
}

void DirectoryStream::seek(const StreamPosition& p) {
  pos_ = p;
  if (p.file.empty()) return;
  // The names in place before the position's file, and it unless none of it was read:
  // read before the checkpoint.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (in_place(e) && (name < p.file || (name == p.file && p.line > 0))) begun_.push_back(name);
  }
  std::sort(begun_.begin(), begun_.end());
  if (p.line == 0) return;
  const std::filesystem::path path = dir_ / p.file;
  if (begun_.empty() || begun_.back() != p.file) {
    throw DataError("--stream " + path.string() + ": the checkpoint's stream position is in this file, which is gone");
  }
  open_parser(path);
  input_ = std::make_unique<TextInput>(path);
  block_ = {};
  at_ = 0;
  pos_.line = 0;
  std::string_view line;
  while (pos_.line < p.line) {
    if (at_ >= block_.size()) {
      if (!input_->next(block_)) {
        throw DataError("--stream " + path.string() + ": has " + std::to_string(pos_.line) + " lines; the checkpoint's position is line " +
                        std::to_string(p.line));
      }
      at_ = 0;
    }
    const std::size_t nl = block_.find('\n', at_);
    at_ = nl == std::string_view::npos ? block_.size() : nl + 1;
    ++pos_.line;
  }
}

std::string StreamPosition::to_json() const {
  return nlohmann::json{{"file", file},           {"line", line},   {"records", records},
                        {"bad_lines", bad_lines}, {"files", files}, {"batches", batches}}
      .dump();
}

StreamPosition StreamPosition::from_json(const std::string& text, const std::string& origin) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    StreamPosition p;
    p.file = j.at("file").get<std::string>();
    p.line = j.at("line").get<std::uint64_t>();
    p.records = j.at("records").get<std::uint64_t>();
    p.bad_lines = j.at("bad_lines").get<std::uint64_t>();
    p.files = j.at("files").get<std::uint64_t>();
    p.batches = j.at("batches").get<std::uint64_t>();
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(origin + ": not a stream position: " + e.what());
  }
}

}  // namespace ember::data
