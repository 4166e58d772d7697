// A Kafka topic as a stream (kafka://BROKERS/TOPIC), against librdkafka's in-process
// mock cluster (the real protocol over loopback sockets): its batches are those of
// `prep --ids hash` of the lines in the stream's order (partitions in turn, a message at
// a time, its lines in order), it waits for messages produced later, and it goes on from
// a checkpoint's position.
#include <gtest/gtest.h>

#ifdef EMBER_HAVE_KAFKA
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/prep.h"
#include "ember/data/stream.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class KafkaStreamTest : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    char err[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    ASSERT_EQ(rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", err, sizeof err), RD_KAFKA_CONF_OK) << err;
    producer_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    ASSERT_NE(producer_, nullptr) << err;
    rd_kafka_mock_cluster_t* cluster = rd_kafka_handle_mock_cluster(producer_);
    ASSERT_NE(cluster, nullptr);
    ASSERT_EQ(rd_kafka_mock_topic_create(cluster, "clicks", 2, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
    source_ = std::string("kafka://") + rd_kafka_mock_cluster_bootstraps(cluster) + "/clicks";
  }
  void TearDown() override {
    if (producer_ != nullptr) rd_kafka_destroy(producer_);
    TempDirTest::TearDown();
  }
  // Criteo line i (some fields empty).
  static std::string line(int i) {
    std::string s = std::to_string(i % 3 == 0);
    for (int d = 0; d < 13; ++d) s += "\t" + std::to_string((i * 7 + d) % 50);
    for (int t = 0; t < 26; ++t) s += "\t" + ((i + t) % 9 == 0 ? std::string() : std::to_string(0x100 * (t + 1) + (i * 13 + t) % 50));
    return s;
  }
  // Messages k of `lines_per` lines each, from line `first`: message k to partition k % 2,
  // so that the stream's order (partitions in turn) is the lines' order.
  void produce(int first, int messages, int lines_per) {
    for (int k = 0; k < messages; ++k) {
      std::string text;
      for (int l = 0; l < lines_per; ++l) text += line(first + k * lines_per + l) + (l + 1 < lines_per ? "\n" : "");
      send(static_cast<int>(sent_ % 2), text);
      ++sent_;
    }
    ASSERT_EQ(rd_kafka_flush(producer_, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // One message of `text` to `partition`.
  void send(int partition, const std::string& text) {
    ASSERT_EQ(rd_kafka_producev(producer_, RD_KAFKA_V_TOPIC("clicks"), RD_KAFKA_V_PARTITION(partition),
                                RD_KAFKA_V_VALUE(const_cast<char*>(text.data()), text.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  // `prep --ids hash` of lines [0, n).
  Dataset prepared(int n) const {
    std::string text;
    for (int i = 0; i < n; ++i) text += line(i) + "\n";
    return prepared_text(text, SourceFormat::kCriteoTsv, "lines.tsv", "prepared");
  }
  // `prep --ids hash` of `text` in `format`, written to `file`, into `name`.
  Dataset prepared_text(const std::string& text, SourceFormat format, const std::string& file, const std::string& name) const {
    write_file_atomic(dir_ / file, text);
    PrepOptions p;
    p.format = format;
    p.inputs = {dir_ / file};
    p.output = dir_ / name;
    p.overwrite = true;
    p.hashed_ids = true;
    p.shard_rows = 64;
    prepare_dataset(p);
    return Dataset::open(dir_ / name);
  }
  StreamOptions options() const {
    StreamOptions o;
    o.source = source_;
    o.poll_ms = 20;
    return o;
  }

  rd_kafka_t* producer_ = nullptr;
  std::string source_;
  int sent_ = 0;
};

void expect_batch(const Batch& got, const SplitData& want, std::uint64_t b, std::size_t n) {
  ASSERT_EQ(got.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t row;
    const Shard& sh = want.shard_of(b * n + i, row);
    ASSERT_EQ(got.label(i), sh.label(row)) << "batch " << b << " sample " << i;
    for (int d = 0; d < 13; ++d) ASSERT_EQ(got.dense(i)[d], sh.dense(row)[d]);
    for (int t = 0; t < 26; ++t) ASSERT_EQ(got.id(t, i), sh.id(t, row)) << "batch " << b << " sample " << i << " table " << t;
  }
}

TEST_F(KafkaStreamTest, PartitionsInTurnGiveThePreparedLinesAndAPositionResumes) {
  produce(0, 400, 1);    // lines 0-399, one a message
  produce(400, 150, 2);  // lines 400-699, two a message
  const Dataset ds = prepared(700);
  const SplitData& train = ds.split(Split::kTrain);
  std::unique_ptr<RecordStream> s = open_stream(options(), 100);
  Batch b;
  std::string at3;
  for (std::uint64_t t = 0; t < 7; ++t) {
    ASSERT_TRUE(s->next(b));
    expect_batch(b, train, t, 100);
    if (t == 2) at3 = s->position_json();
  }
  // A resumed reader goes on from batch 3's position: the messages read are not read again.
  std::unique_ptr<RecordStream> resumed = open_stream(options(), 100);
  resumed->seek_json(at3, "test");
  for (std::uint64_t t = 3; t < 7; ++t) {
    ASSERT_TRUE(resumed->next(b));
    expect_batch(b, train, t, 100);
  }
  // Mid-message: a position after 451 records (11 batches of 41) falls inside the
  // two-line message of lines 450 and 451.
  std::unique_ptr<RecordStream> odd = open_stream(options(), 41);
  ASSERT_TRUE(odd->skip(11));
  EXPECT_NE(odd->position_json().find("\"line\":1"), std::string::npos) << odd->position_json();
  std::unique_ptr<RecordStream> again = open_stream(options(), 41);
  again->seek_json(odd->position_json(), "test");
  ASSERT_TRUE(again->next(b));
  ASSERT_EQ(b.size(), 41u);
  for (std::size_t i = 0; i < 41; ++i) {
    std::uint64_t row;
    const Shard& sh = train.shard_of(451 + i, row);
    for (int t = 0; t < 26; ++t) ASSERT_EQ(b.id(t, i), sh.id(t, row)) << "record " << 451 + i << " table " << t;
  }
  EXPECT_THROW(again->seek_json("{\"kafka\": \"other\"}", "ckpt"), DataError);
}

TEST_F(KafkaStreamTest, WaitsForMessagesProducedLaterAndStops) {
  produce(0, 150, 1);
  std::atomic<bool> stop{false};
  StreamOptions o = options();
  o.stopped = [&] { return stop.load(); };
  std::unique_ptr<RecordStream> s = open_stream(o, 100);
  Batch b;
  ASSERT_TRUE(s->next(b));
  std::thread producer([&] {
    std::this_thread::sleep_for(300ms);
    produce(150, 50, 1);
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(s->next(b));  // records 100-199: waits for the last 50
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  producer.join();
  expect_batch(b, prepared(200).split(Split::kTrain), 1, 100);
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    stop = true;
  });
  EXPECT_FALSE(s->next(b));
  stopper.join();
}

// Avazu CSV lines, no header (a message carries none): read in the format's standard
// columns, they give the batches `prep --ids hash` makes of the file with its header.
TEST_F(KafkaStreamTest, AvazuLinesInTheStandardColumnsGiveThePreparedLines) {
  const auto avazu_line = [](int i) {
    std::string s =
        std::to_string(1000 + i) + "," + std::to_string(i % 3 == 0) + ",141021" + (i % 24 < 10 ? "0" : "") + std::to_string(i % 24);
    for (int t = 0; t < 21; ++t) s += "," + ((i + t) % 11 == 0 ? std::string() : "v" + std::to_string((i * 7 + t * 3) % 40));
    return s;
  };
  std::string file = standard_header(SourceFormat::kAvazu) + "\n";
  for (int k = 0; k < 300; ++k) {
    const std::string text = avazu_line(k);
    file += text + "\n";
    send(k % 2, text);
  }
  ASSERT_EQ(rd_kafka_flush(producer_, 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  const Dataset ds = prepared_text(file, SourceFormat::kAvazu, "avazu.csv", "prepared-avazu");
  StreamOptions o = options();
  o.format = SourceFormat::kAvazu;
  auto s = open_stream(o, 100);
  Batch b;
  for (std::uint64_t t = 0; t < 3; ++t) {
    ASSERT_TRUE(s->next(b));
    for (std::size_t i = 0; i < 100; ++i) {
      std::uint64_t row;
      const Shard& sh = ds.split(Split::kTrain).shard_of(t * 100 + i, row);
      ASSERT_EQ(b.label(i), sh.label(row)) << "batch " << t << " sample " << i;
      for (int c = 0; c < 23; ++c) ASSERT_EQ(b.id(c, i), sh.id(c, row)) << "batch " << t << " sample " << i << " table " << c;
    }
  }
}

TEST(KafkaStreamOptions, MalformedSourcesAndOtherFormatsAreRefused) {
  StreamOptions o;
  o.source = "kafka://nohost";
  EXPECT_THROW(open_stream(o, 10), ConfigError);
  EXPECT_TRUE(has_kafka());
}

}  // namespace
}  // namespace ember::data

#else
TEST(KafkaStream, NeedsLibrdkafka) { GTEST_SKIP() << "this build has no librdkafka (librdkafka-dev): Kafka streams are refused"; }
#endif
