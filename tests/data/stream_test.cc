// A directory stream (data/stream.h): its batches are those of `prep --ids hash` of the
// same files, unshuffled; it waits for files that come later, reads a file only once it
// is in place, resumes by skipping batches, and refuses a file that comes out of order.
#include "ember/data/stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/prep.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class DirectoryStreamTest : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fs::create_directories(dir_ / "in");
  }
  // `n` Criteo lines from `first`: some fields empty, bags of 0-3 values when `bags`.
  static std::string lines(int first, int n, bool bags) {
    std::string s;
    std::mt19937 rng(static_cast<unsigned>(first) + 11);
    for (int i = first; i < first + n; ++i) {
      s += std::to_string(i % 3 == 0);
      for (int d = 0; d < 13; ++d) s += "\t" + std::to_string((i * 7 + d) % 50);
      for (int t = 0; t < 26; ++t) {
        s += "\t";
        const int values = bags ? (i + t) % 4 : (i + t) % 9 == 0 ? 0 : 1;
        for (int k = 0; k < values; ++k) s += (k > 0 ? "|" : "") + std::to_string(0x100 * (t + 1) + static_cast<int>(rng() % 50));
      }
      s += "\n";
    }
    return s;
  }
  // Writes NAME under in/ as a writer should: a temporary, then renamed into place.
  void put(const std::string& name, const std::string& text) const { write_file_atomic(dir_ / "in" / name, text); }

  StreamOptions options(char sep = 0) const {
    StreamOptions o;
    o.source = (dir_ / "in").string();
    o.multi_hot_sep = sep;
    o.poll_ms = 10;
    return o;
  }
  // The dataset `prep --ids hash` makes of in/'s files in name order, unshuffled.
  Dataset prepared(const std::vector<std::string>& names, char sep = 0) const {
    PrepOptions p;
    p.format = SourceFormat::kCriteoTsv;
    for (const auto& n : names) p.inputs.push_back(dir_ / "in" / n);
    p.output = dir_ / "prepared";
    p.overwrite = true;
    p.hashed_ids = true;
    p.multi_hot_sep = sep;
    p.shard_rows = 64;
    prepare_dataset(p);
    return Dataset::open(dir_ / "prepared");
  }
};

// Batch b of the stream holds rows [b n, (b + 1) n) of the prepared split, field for field.
void expect_same_batch(const Batch& got, const SplitData& want, std::uint64_t b, std::size_t n) {
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(got.index(), b);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t row;
    const Shard& sh = want.shard_of(b * n + i, row);
    ASSERT_EQ(got.label(i), sh.label(row)) << "batch " << b << " sample " << i;
    for (int d = 0; d < 13; ++d) ASSERT_EQ(got.dense(i)[d], sh.dense(row)[d]);
    for (int t = 0; t < 26; ++t) {
      std::vector<std::uint64_t> a, e;
      got.for_each_id(t, i, [&](std::uint64_t id) { a.push_back(id); });
      sh.for_each_id(t, row, [&](std::uint64_t id) { e.push_back(id); });
      ASSERT_EQ(a, e) << "batch " << b << " sample " << i << " table " << t;
    }
  }
}

TEST_F(DirectoryStreamTest, BatchesAreThePreparedRowsOfTheFilesInNameOrder) {
  for (bool bags : {false, true}) {
    fs::remove_all(dir_ / "in");
    fs::create_directories(dir_ / "in");
    // Names out of their lines' order on purpose: name order rules, not the time written.
    put("part-b.tsv", lines(300, 250, bags));
    put("part-a.tsv", lines(0, 300, bags));
    put("part-c.tsv", lines(550, 170, bags));
    const char sep = bags ? '|' : 0;
    const Dataset ds = prepared({"part-a.tsv", "part-b.tsv", "part-c.tsv"}, sep);
    const SplitData& train = ds.split(Split::kTrain);
    ASSERT_EQ(train.rows(), 720u);
    DirectoryStream s(options(sep), 100);
    Batch b;
    for (std::uint64_t t = 0; t < 7; ++t) {
      ASSERT_TRUE(s.next(b));
      EXPECT_EQ(b.multi_hot(), bags);
      expect_same_batch(b, train, t, 100);
    }
    EXPECT_EQ(s.position().records, 700u);
    EXPECT_EQ(s.position().file, "part-c.tsv");
    EXPECT_EQ(s.position().line, 150u);
    EXPECT_EQ(s.position().files, 2u);
    // The manifest a stream job runs on is the prepared one's shape.
    const Manifest m = stream_manifest(SourceFormat::kCriteoTsv, sep);
    EXPECT_EQ(m.tables.size(), ds.manifest().tables.size());
    EXPECT_EQ(m.dense_names, ds.manifest().dense_names);
    EXPECT_EQ(m.multi_hot, ds.manifest().multi_hot);
    EXPECT_TRUE(m.hashed_ids);
  }
}

// Bags over the stream's bound (--stream-max-bag) make a line bad: passed over, counted,
// the batches those of the lines that fit.
TEST_F(DirectoryStreamTest, ALineWithABagOverTheBoundIsPassedOver) {
  // Bags of 0-3 values (each line has one of 3) between lines of bags of 0-1.
  const std::string fits = lines(0, 100, false) + lines(200, 150, false);
  const std::string text = lines(0, 100, false) + lines(100, 100, true) + lines(200, 150, false);
  const std::uint64_t kept = 250;
  put("a.tsv", fits);
  const Dataset ds = prepared({"a.tsv"}, '|');
  put("a.tsv", text);
  StreamOptions o = options('|');
  o.max_bag = 2;
  DirectoryStream s(o, 50);
  Batch b;
  for (std::uint64_t t = 0; t < kept / 50; ++t) {
    ASSERT_TRUE(s.next(b));
    expect_same_batch(b, ds.split(Split::kTrain), t, 50);
  }
  EXPECT_EQ(s.position().bad_lines, 100u);
  EXPECT_EQ(stream_manifest(SourceFormat::kCriteoTsv, '|', 2).tables[0].max_bag, 2u);
  o.max_bag = 0;
  EXPECT_THROW(DirectoryStream(o, 50), ConfigError);
}

TEST_F(DirectoryStreamTest, WaitsForFilesPutInPlaceAndSkipsTheBatchesOfAResume) {
  put("0001.tsv", lines(0, 150, false));
  // A file being written (a temporary, a hidden name) is not read until renamed in.
  write("in/0002.tsv.tmp-1", lines(150, 150, false));
  write("in/.0002.tsv", lines(150, 150, false));
  std::atomic<bool> stop{false};
  StreamOptions o = options();
  o.stopped = [&] { return stop.load(); };
  DirectoryStream s(o, 100);
  Batch b;
  ASSERT_TRUE(s.next(b));
  std::thread writer([&] {
    std::this_thread::sleep_for(200ms);
    fs::rename(dir_ / "in" / "0002.tsv.tmp-1", dir_ / "in" / "0002.tsv");
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(s.next(b));  // rows 100-199: waits for 0002.tsv
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  writer.join();
  fs::remove(dir_ / "in" / ".0002.tsv");
  const Dataset ds = prepared({"0001.tsv", "0002.tsv"});
  expect_same_batch(b, ds.split(Split::kTrain), 1, 100);
  ASSERT_TRUE(s.next(b));
  expect_same_batch(b, ds.split(Split::kTrain), 2, 100);

  // A resumed reader passes over the batches trained, or goes to a checkpoint's
  // position (its text), then reads on alike.
  DirectoryStream resumed(o, 100);
  ASSERT_TRUE(resumed.skip(2));
  const StreamPosition at2 = StreamPosition::from_json(resumed.position().to_json(), "test");
  EXPECT_EQ(at2.file, "0002.tsv");
  EXPECT_EQ(at2.line, 50u);
  EXPECT_EQ(at2.batches, 2u);
  ASSERT_TRUE(resumed.next(b));
  expect_same_batch(b, ds.split(Split::kTrain), 2, 100);
  DirectoryStream sought(o, 100);
  sought.seek(at2);
  ASSERT_TRUE(sought.next(b));
  expect_same_batch(b, ds.split(Split::kTrain), 2, 100);
  EXPECT_EQ(sought.position().records, 300u);
  EXPECT_THROW(StreamPosition::from_json("{\"file\": 3}", "ckpt"), DataError);

  // Nothing more comes: a stop ends the wait.
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    stop = true;
  });
  EXPECT_FALSE(s.next(b));
  stopper.join();
}

TEST_F(DirectoryStreamTest, AFileOutOfNameOrderOrABadLineIsNamed) {
  put("0002.tsv", lines(0, 120, false));
  std::string with_bad = lines(120, 100, false);
  with_bad.insert(with_bad.find('\n') + 1, "not\ta\tcriteo\tline\n");
  put("0003.tsv", with_bad);
  DirectoryStream s(options(), 100);
  Batch b;
  ASSERT_TRUE(s.next(b));
  ASSERT_TRUE(s.next(b));  // into 0003.tsv, past its line 2 (logged, passed over)
  EXPECT_EQ(s.position().bad_lines, 1u);
  EXPECT_EQ(s.position().records, 200u);
  EXPECT_EQ(s.position().line, 81u);
  // Every worker must read the same order: a file named before one read is refused.
  put("0001.tsv", lines(500, 200, false));
  try {
    s.next(b);
    ADD_FAILURE() << "a file out of order was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("0001.tsv: appeared after 0003.tsv was read"), std::string::npos) << e.what();
  }
  // A file without labels (a test split's) would train every line as a 0: refused.
  put("0004.tsv", lines(700, 10, false).substr(2));  // the first line's label gone
  DirectoryStream unlabelled(options(), 100);
  ASSERT_TRUE(unlabelled.skip(4));  // 400 of the 420 records before 0004.tsv
  try {
    unlabelled.next(b);
    ADD_FAILURE() << "a file without labels was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("0004.tsv:1: no label column"), std::string::npos) << e.what();
  }
  StreamOptions none;
  none.source = (dir_ / "nothing").string();
  EXPECT_THROW(DirectoryStream(none, 10), ConfigError);
}

}  // namespace
}  // namespace ember::data
