#include "ember/scheduler/batch_stream.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "ember/common/error.h"
#include "ember/data/line_parser.h"

namespace ember::scheduler {

void BatchStream::Epochs::next(data::Batch& out) {
  if (!reader.next(out)) {
    reader.start_epoch(++epoch);
    reader.next(out);
  }
}

BatchStream::BatchStream(const data::BatchReader& reader, std::vector<std::uint64_t> table_offsets, std::uint32_t lookahead)
    : main_(Epochs{reader}), ahead_(Epochs{reader}), offsets_(std::move(table_offsets)), lookahead_(lookahead) {}

BatchStream::BatchStream(data::StreamOptions stream, std::size_t batch_size, std::vector<std::uint64_t> table_offsets)
    : stream_(data::open_stream(std::move(stream), batch_size)), offsets_(std::move(table_offsets)), lookahead_(0) {}

bool BatchStream::next(data::Batch& b, GlobalBatch& g) {
  if (stream_) {
    if (!stream_->next(b)) return false;
  } else {
    main_->next(b);
  }
  to_global_batch(b, offsets_, g);
  return true;
}

void BatchStream::look_ahead(Scheduler& s, std::uint64_t t, std::uint64_t end) {
  s.look_ahead_through(t, end, [&](GlobalBatch& next) {
    ahead_->next(ahead_batch_);
    to_global_batch(ahead_batch_, offsets_, next);
    if (on_ahead_) on_ahead_(ahead_next_, next);
    ++ahead_next_;
  });
}

void BatchStream::look_ahead(HostSchedulers& s, std::uint64_t t, std::uint64_t end) {
  s.look_ahead_through(t, end, [&](GlobalBatch& next) {
    ahead_->next(ahead_batch_);
    to_global_batch(ahead_batch_, offsets_, next);
    if (on_ahead_) on_ahead_(ahead_next_, next);
    ++ahead_next_;
  });
}

void BatchStream::seek(const std::string& position, const std::string& origin) {
  if (!stream_) throw ConfigError(origin + ": a stream's position, and this job reads a dataset (--stream)");
  stream_->seek_json(position, origin);
}

bool BatchStream::skip(std::uint64_t n) {
  if (stream_) return stream_->skip(n);
  data::Batch b;
  for (std::uint64_t t = 0; t < n; ++t) main_->next(b);
  if (lookahead_ > 0) {
    for (std::uint64_t t = 0; t < n; ++t) ahead_->next(b);
    ahead_next_ += n;
  }
  return true;
}

data::StreamOptions stream_options(const SchedulerOptions& o, std::function<bool()> stopped) {
  data::StreamOptions s;
  s.source = o.stream;
  s.format = data::parse_source_format(o.stream_format);
  if (o.stream_multi_hot_sep.size() > 1) throw ConfigError("--stream-multi-hot-sep '" + o.stream_multi_hot_sep + "': one character");
  s.multi_hot_sep = o.stream_multi_hot_sep.empty() ? 0 : o.stream_multi_hot_sep[0];
  s.max_bag = o.stream_max_bag;
  // Refused now, not at the stream's first line in the loader.
  if (s.multi_hot_sep != 0 && s.max_bag == 0) throw ConfigError("--stream-max-bag 0: a bag holds at least one value");
  data::LineParser::check_bag_separator(s.format, s.multi_hot_sep);
  s.stopped = std::move(stopped);
  return s;
}

data::Dataset open_job_data(const std::string& dir, const SchedulerOptions& o, data::OpenOptions open) {
  if (o.stream.empty()) {
    if (dir.empty()) throw ConfigError("--dataset is required (or --stream DIR)");
    return data::Dataset::open(dir, open);
  }
  const data::StreamOptions s = stream_options(o);
  std::error_code ec;
  if (s.source.rfind("kafka://", 0) != 0 && !std::filesystem::is_directory(s.source, ec))
    throw ConfigError("--stream " + s.source + ": not a directory (nor kafka://HOST:PORT/TOPIC)");
  return data::Dataset::without_rows(data::stream_manifest(s.format, s.multi_hot_sep, s.max_bag));
}

BatchStream job_batches(const data::Dataset& ds, const SchedulerOptions& o, std::vector<std::uint64_t> table_offsets,
                        std::uint32_t lookahead, std::function<bool()> stopped) {
  if (o.stream.empty()) return BatchStream(global_batch_reader(ds, o), std::move(table_offsets), lookahead);
  const std::size_t n = static_cast<std::size_t>(o.workers) * o.batch_per_worker;
  return BatchStream(stream_options(o, std::move(stopped)), n, std::move(table_offsets));
}

}  // namespace ember::scheduler
