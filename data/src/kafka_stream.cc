#include "kafka_stream.h"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/common/error.h"
#include "ember/common/process.h"
#include "stream_batches.h"

namespace ember::data {

bool has_kafka() { return true; }

namespace {

constexpr int kMetadataTimeoutMs = 5000;
// Messages held per partition before it is paused (the others behind it in turn).
constexpr std::size_t kMaxAhead = 20000;

struct Message {
  std::int64_t offset;
  std::string payload;
};

class KafkaStream : public RecordStream {
 public:
  KafkaStream(StreamOptions o, std::size_t batch_size) : o_(std::move(o)) {
    const std::string rest = o_.source.substr(std::string("kafka://").size());
    const std::size_t slash = rest.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size()) {
      throw ConfigError("--stream " + o_.source + ": expected kafka://HOST:PORT[,HOST:PORT...]/TOPIC");
    }
    brokers_ = rest.substr(0, slash);
    topic_ = rest.substr(slash + 1);
    if (batch_size == 0) throw ConfigError("--stream: a global batch of 0 records");
    builder_ = std::make_unique<BatchBuilder>(o_.format, o_.multi_hot_sep, o_.max_bag, batch_size);
    // Labelled Criteo lines, 40 fields, or CSV lines in the format's standard columns (a
    // message has no header): not decided by whichever line comes first.
    parser_.emplace(o_.format, o_.format == SourceFormat::kCriteoTsv ? "0" + std::string(39, '\t') : standard_header(o_.format),
                    o_.multi_hot_sep);
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    // No consumer group: each worker is assigned every partition at the offsets it names.
    for (const auto& [k, v] : {std::pair<const char*, std::string>{"bootstrap.servers", brokers_},
                               {"group.id", "ember-stream"},
                               {"enable.auto.commit", "false"},
                               {"enable.auto.offset.store", "false"},
                               {"auto.offset.reset", "error"},
                               {"enable.partition.eof", "false"}}) {
      if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        throw ConfigError("--stream " + o_.source + ": " + err);
      }
    }
    rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);  // owns conf from here
    if (rk_ == nullptr) {
      rd_kafka_conf_destroy(conf);
      throw ConfigError("--stream " + o_.source + ": " + err);
    }
  }
  ~KafkaStream() override {
    if (rk_ == nullptr) return;
    rd_kafka_consumer_close(rk_);
    rd_kafka_destroy(rk_);
  }
  KafkaStream(const KafkaStream&) = delete;
  KafkaStream& operator=(const KafkaStream&) = delete;

  bool next(Batch& batch) override {
    while (!builder_->full()) {
      if (!read_record()) return false;
      builder_->add(record_);
    }
    batch = builder_->take(batches_++);
    return true;
  }

  bool skip(std::uint64_t batches) override {
    for (std::uint64_t i = 0; i < batches * builder_->batch_size(); ++i) {
      if (!read_record()) return false;
    }
    batches_ += batches;
    return true;
  }

  std::string position_json() const override {
    return nlohmann::json{{"kafka", topic_},  {"partitions", partitions_}, {"offsets", offsets_}, {"turn", turn_},
                          {"line", line_in_}, {"records", records_},       {"batches", batches_}, {"bad_lines", bad_lines_}}
        .dump();
  }

  std::string start_position_json() override {
    ensure_assigned();
    return partitions_ == 0 ? std::string() : position_json();
  }

  void seek_json(const std::string& text, const std::string& origin) override {
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      if (j.at("kafka").get<std::string>() != topic_) {
        throw DataError(origin + ": a position in Kafka topic " + j.at("kafka").dump() + ", not " + topic_);
      }
      ensure_assigned(j.at("offsets").get<std::vector<std::int64_t>>());
      if (partitions_ == 0) return;  // stopped while waiting for the topic
      turn_ = j.at("turn").get<std::size_t>();
      skip_lines_ = j.at("line").get<std::uint64_t>();
      records_ = j.at("records").get<std::uint64_t>();
      batches_ = j.at("batches").get<std::uint64_t>();
      bad_lines_ = j.at("bad_lines").get<std::uint64_t>();
      if (turn_ >= partitions_) throw DataError(origin + ": partition turn " + std::to_string(turn_) + " past the topic's partitions");
    } catch (const nlohmann::json::exception& e) {
      throw DataError(origin + ": not a Kafka stream position: " + e.what());
    }
  }

 private:
  // Partitions counted (waiting for the topic to exist) and assigned at `from` (empty:
  // each partition's earliest offset).
  void ensure_assigned(std::vector<std::int64_t> from = {}) {
    if (partitions_ > 0) return;
    Stopwatch waited;
    for (std::size_t n = 0;; std::this_thread::sleep_for(std::chrono::milliseconds(o_.poll_ms))) {
      n = partition_count();
      if (n > 0) {
        partitions_ = n;
        break;
      }
      if (o_.stopped && o_.stopped()) return;
      if (waited.seconds() > kStreamWaitLogSeconds) {
        spdlog::info("--stream {}: waiting for topic {} to exist", o_.source, topic_);
        waited.reset();
      }
    }
    if (!from.empty() && from.size() != partitions_) {
      throw DataError("--stream " + o_.source + ": the checkpoint's position has " + std::to_string(from.size()) +
                      " partitions, the topic " + std::to_string(partitions_) + " (a stream keeps its partitions)");
    }
    offsets_ = from.empty() ? earliest() : from;
    fetched_.assign(partitions_, {});
    paused_.assign(partitions_, false);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(static_cast<int>(partitions_));
    for (std::size_t p = 0; p < partitions_; ++p)
      rd_kafka_topic_partition_list_add(list, topic_.c_str(), static_cast<std::int32_t>(p))->offset = offsets_[p];
    const rd_kafka_resp_err_t e = rd_kafka_assign(rk_, list);
    rd_kafka_topic_partition_list_destroy(list);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) throw IoError("--stream " + o_.source + ": assign: " + rd_kafka_err2str(e));
    spdlog::info("--stream {}: {} partition(s), reading from offsets {}", o_.source, partitions_, nlohmann::json(offsets_).dump());
  }

  std::size_t partition_count() {
    rd_kafka_topic_t* t = rd_kafka_topic_new(rk_, topic_.c_str(), nullptr);
    const rd_kafka_metadata_t* md = nullptr;
    std::size_t n = 0;
    if (rd_kafka_metadata(rk_, 0, t, &md, kMetadataTimeoutMs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      for (int i = 0; i < md->topic_cnt; ++i) {
        if (md->topics[i].err == RD_KAFKA_RESP_ERR_NO_ERROR) n = static_cast<std::size_t>(md->topics[i].partition_cnt);
      }
      rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(t);
    return n;
  }

  std::vector<std::int64_t> earliest() {
    std::vector<std::int64_t> low(partitions_, 0);
    for (std::size_t p = 0; p < partitions_; ++p) {
      std::int64_t lo = 0, hi = 0;
      const rd_kafka_resp_err_t e =
          rd_kafka_query_watermark_offsets(rk_, topic_.c_str(), static_cast<std::int32_t>(p), &lo, &hi, kMetadataTimeoutMs);
      if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw IoError("--stream " + o_.source + ": partition " + std::to_string(p) + ": " + rd_kafka_err2str(e));
      low[p] = lo;
    }
    return low;
  }

  void pause(std::size_t p, bool on) {
    if (paused_[p] == on) return;
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic_.c_str(), static_cast<std::int32_t>(p));
    (on ? rd_kafka_pause_partitions : rd_kafka_resume_partitions)(rk_, list);
    rd_kafka_topic_partition_list_destroy(list);
    paused_[p] = on;
  }

  // Until partition p holds its next message; false when stopped.
  bool fetch(std::size_t p) {
    Stopwatch waited;
    while (fetched_[p].empty()) {
      if (o_.stopped && o_.stopped()) return false;
      rd_kafka_message_t* m = rd_kafka_consumer_poll(rk_, static_cast<int>(o_.poll_ms));
      if (m == nullptr) {
        if (waited.seconds() > kStreamWaitLogSeconds) {
          spdlog::info("--stream {}: waiting for partition {}'s message at offset {} ({} records read)", o_.source, p, offsets_[p],
                       records_);
          waited.reset();
        }
        continue;
      }
      take(m);
    }
    return true;
  }

  void take(rd_kafka_message_t* m) {
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      const std::string why = rd_kafka_message_errstr(m);
      const rd_kafka_resp_err_t e = m->err;
      rd_kafka_message_destroy(m);
      // Gone (retention) or never there: the order the workers agree on cannot go on.
      // (auto.offset.reset=error reports an offset no longer there as __AUTO_OFFSET_RESET.)
      if (e == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE || e == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET ||
          e == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC || e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        throw DataError("--stream " + o_.source + ": " + why + " (the offsets read next: " + nlohmann::json(offsets_).dump() + ")");
      spdlog::warn("--stream {}: {} (retrying)", o_.source, why);
      return;
    }
    const auto p = static_cast<std::size_t>(m->partition);
    if (p < partitions_ && m->offset >= offsets_[p] && (fetched_[p].empty() || m->offset > fetched_[p].back().offset)) {
      fetched_[p].push_back({m->offset, std::string(static_cast<const char*>(m->payload), m->len)});
      if (fetched_[p].size() >= kMaxAhead) pause(p, true);
    }
    rd_kafka_message_destroy(m);
  }

  // The next line in the stream's order; false when stopped.
  bool next_line(std::string_view& line) {
    for (;;) {
      if (!fetch(turn_)) return false;
      const Message& m = fetched_[turn_].front();
      if (skip_lines_ > 0 && at_ == 0 && m.offset != offsets_[turn_]) {
        throw DataError("--stream " + o_.source + ": partition " + std::to_string(turn_) + " has no message at the checkpoint's offset " +
                        std::to_string(offsets_[turn_]) + " (the next is " + std::to_string(m.offset) + ")");
      }
      if (at_ >= m.payload.size()) {
        if (skip_lines_ > 0) {
          throw DataError("--stream " + o_.source + ": partition " + std::to_string(turn_) + " offset " + std::to_string(m.offset) +
                          " has fewer lines than the checkpoint's position says");
        }  // the message read: the next partition's turn
        offsets_[turn_] = m.offset + 1;
        fetched_[turn_].pop_front();
        if (paused_[turn_] && fetched_[turn_].size() < kMaxAhead / 2) pause(turn_, false);
        turn_ = (turn_ + 1) % partitions_;
        at_ = 0;
        line_in_ = 0;
        continue;
      }
      const std::size_t nl = m.payload.find('\n', at_);
      const std::size_t end = nl == std::string::npos ? m.payload.size() : nl;
      line = std::string_view(m.payload).substr(at_, end - at_);
      at_ = end + 1;
      ++line_in_;
      if (skip_lines_ > 0) {  // read before a checkpoint's position
        --skip_lines_;
        continue;
      }
      return true;
    }
  }

  bool read_record() {
    ensure_assigned();
    if (partitions_ == 0) return false;  // stopped while waiting for the topic
    std::string_view line;
    for (;;) {
      if (!next_line(line)) return false;
      if (blank_line(line)) continue;
      if (parser_->parse(line, record_, error_, true) && builder_->fits(record_, error_)) break;
      if (bad_lines_++ < kStreamBadLinesLogged) {
        spdlog::warn("--stream {}: partition {} offset {} line {}: {} (line passed over)", o_.source, turn_, fetched_[turn_].front().offset,
                     line_in_, error_);
      }
    }
    ++records_;
    return true;
  }

  StreamOptions o_;
  std::string brokers_, topic_;
  rd_kafka_t* rk_ = nullptr;
  std::size_t partitions_ = 0;
  std::vector<std::int64_t> offsets_;         // per partition: the offset of the message read next
  std::vector<std::deque<Message>> fetched_;  // per partition: messages fetched, offsets_[p]'s first
  std::vector<bool> paused_;
  std::size_t turn_ = 0;          // the partition whose message is read next
  std::size_t at_ = 0;            // bytes of that message read
  std::uint64_t line_in_ = 0;     // lines of that message read
  std::uint64_t skip_lines_ = 0;  // lines of it read before a checkpoint's position
  std::uint64_t records_ = 0, batches_ = 0, bad_lines_ = 0;
  std::optional<LineParser> parser_;
  Record record_;
  std::string error_;
  std::unique_ptr<BatchBuilder> builder_;
};

}  // namespace

std::unique_ptr<RecordStream> open_kafka_stream(StreamOptions o, std::size_t batch_size) {
  return std::make_unique<KafkaStream>(std::move(o), batch_size);
}

}  // namespace ember::data
