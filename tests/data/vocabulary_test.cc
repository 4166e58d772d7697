// The vocabulary prep writes: every line of the input, encoded through it by
// encode_lines (what ember-predict does), gives the row prep stored; unseen values map
// to OOV as rare ones do; corrupt files and datasets without one are refused clearly.
#include "ember/data/vocabulary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"
#include "ember/data/text_input.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

class VocabularyTest : public test::TempDirTest {
 protected:
  Dataset prep(const fs::path& input, SourceFormat format, std::uint64_t min_count, int threads = 2) {
    PrepOptions o;
    o.format = format;
    o.inputs = {input};
    o.output = dir_ / "ds";
    o.overwrite = true;
    o.min_count = min_count;
    o.val_fraction = 0.2;
    o.shard_rows = 256;
    o.block_bytes = 8192;  // many blocks and chunks
    o.threads = threads;
    prepare_dataset(o);
    return Dataset::open(dir_ / "ds");
  }

  // Encodes the whole text file through the dataset's vocabulary and expects every
  // sample, in file order, to be the row prep stored (train, then val: no shuffle).
  void expect_encoding_matches(const fs::path& input, SourceFormat format, const Dataset& ds) {
    const Vocabulary vocab = Vocabulary::of_dataset(ds.dir(), ds.manifest());
    LineParser parser(format, read_first_line(input));
    std::string text = read_file(input);
    if (parser.header_consumed()) text = text.substr(text.find('\n') + 1);
    EncodedRows rows;
    encode_lines(parser, vocab, text, rows);
    ASSERT_EQ(rows.bad_count, 0u);
    ASSERT_EQ(rows.size(), ds.manifest().total_rows());
    const int nd = ds.num_dense(), nt = ds.num_tables();
    std::uint64_t pos = 0, oov = 0;
    for (int s = 0; s < 3; ++s) {
      const SplitData& split = ds.split(static_cast<Split>(s));
      for (std::uint64_t i = 0; i < split.rows(); ++i, ++pos) {
        std::uint64_t r;
        const Shard& sh = split.shard_of(i, r);
        ASSERT_EQ(sh.label(r), rows.labels[pos]) << "row " << pos;
        for (int d = 0; d < nd; ++d) ASSERT_EQ(sh.dense(r)[d], rows.dense[pos * nd + d]) << "row " << pos;
        for (int t = 0; t < nt; ++t) {
          ASSERT_EQ(sh.id(t, r), rows.ids[t][pos]) << "row " << pos << " table " << t;
          oov += rows.ids[t][pos] == kOovRow;
        }
      }
    }
    EXPECT_EQ(pos, rows.size());
    if (ds.manifest().min_count > 1) {
      EXPECT_GT(oov, 0u) << "the test should exercise rare values";
    }
  }
};

TEST_F(VocabularyTest, EncodingRawLinesGivesTheRowsPrepStored) {
  GenOptions g;
  g.like = SourceFormat::kCriteoTsv;
  g.rows = 3000;
  g.scale = 0.001;
  g.output = dir_ / "data.tsv";
  generate(g);
  for (std::uint64_t min_count : {1, 3}) {
    SCOPED_TRACE("min_count " + std::to_string(min_count));
    const Dataset ds = prep(g.output, SourceFormat::kCriteoTsv, min_count);
    ASSERT_TRUE(ds.manifest().vocabulary.has_value());
    EXPECT_EQ(ds.manifest().vocabulary->file, "vocab.bin");
    EXPECT_EQ(fs::file_size(ds.dir() / "vocab.bin"), ds.manifest().vocabulary->bytes);
    expect_encoding_matches(g.output, SourceFormat::kCriteoTsv, ds);
  }
}

TEST_F(VocabularyTest, AvazuEncodingMatchesToo) {
  GenOptions g;
  g.like = SourceFormat::kAvazu;
  g.rows = 2000;
  g.scale = 0.001;
  g.output = dir_ / "data.csv";
  generate(g);
  const Dataset ds = prep(g.output, SourceFormat::kAvazu, 2);
  expect_encoding_matches(g.output, SourceFormat::kAvazu, ds);
}

TEST_F(VocabularyTest, RealSamplesEncodeAsPrepStoredThem) {
  const fs::path tsv = test::real_sample("criteo_kaggle_train_head10000.tsv");
  const fs::path csv = test::real_sample("train.tiny.csv");
  const fs::path avazu = test::real_sample("tr.rx.csv");
  if (tsv.empty() || csv.empty() || avazu.empty()) GTEST_SKIP() << "../shared/data/real not present";
  expect_encoding_matches(tsv, SourceFormat::kCriteoTsv, prep(tsv, SourceFormat::kCriteoTsv, 2));
  expect_encoding_matches(csv, SourceFormat::kCriteoCsv, prep(csv, SourceFormat::kCriteoCsv, 1));  // CRLF, header
  expect_encoding_matches(avazu, SourceFormat::kAvazu, prep(avazu, SourceFormat::kAvazu, 1));
}

TEST_F(VocabularyTest, UnseenValuesAreOovAndEmptyOnesMissing) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += test::criteo_line(i % 4, i % 2) + "\n";
  const fs::path in = write("in.tsv", text);
  const Dataset ds = prep(in, SourceFormat::kCriteoTsv, 1);
  const Vocabulary vocab = Vocabulary::of_dataset(ds.dir(), ds.manifest());
  ASSERT_EQ(vocab.num_tables(), 26);
  LineParser parser(SourceFormat::kCriteoTsv, test::criteo_line(0));
  // A line of values never seen, and one with every categorical field empty.
  std::string unseen = "1";
  for (int d = 0; d < 13; ++d) unseen += "\t" + std::to_string(d);
  char hex[16];
  for (int t = 0; t < 26; ++t) {
    std::snprintf(hex, sizeof hex, "f00d%04x", static_cast<unsigned>(t));
    unseen += std::string("\t") + hex;
  }
  std::string empty = "1";
  for (int d = 0; d < 13; ++d) empty += "\t" + std::to_string(d);
  for (int t = 0; t < 26; ++t) empty += "\t";
  EncodedRows rows;
  encode_lines(parser, vocab, unseen + "\n" + empty + "\n" + text.substr(0, text.find('\n')), rows);
  ASSERT_EQ(rows.size(), 3u) << (rows.bad.empty() ? "" : rows.bad[0].second);
  for (int t = 0; t < 26; ++t) {
    EXPECT_EQ(rows.ids[t][0], kOovRow) << t;
    EXPECT_EQ(rows.ids[t][1], kMissingRow) << t;
    EXPECT_GE(rows.ids[t][2], kFirstValueRow) << t;
    EXPECT_EQ(rows.ids[t][2], ds.split(Split::kTrain).shard(0).id(t, 0)) << t;
  }
  EXPECT_EQ(rows.dense[13 + 5], static_cast<float>(std::log1p(5.0)));
  // A bad line is reported with its index, not encoded.
  encode_lines(parser, vocab, text.substr(0, text.find('\n')) + "\nnot a line\n", rows);
  EXPECT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows.bad.size(), 1u);
  EXPECT_EQ(rows.bad[0].first, 1u);
}

TEST_F(VocabularyTest, CorruptOrMissingVocabulariesAreRefused) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += test::criteo_line(i % 5, i % 2) + "\n";
  const fs::path in = write("in.tsv", text);
  Dataset ds = prep(in, SourceFormat::kCriteoTsv, 1);
  const fs::path vocab = ds.dir() / "vocab.bin";
  std::string bytes = read_file(vocab);
  {
    std::string bad = bytes;
    bad[bad.size() / 2] ^= 0x40;
    write_file_atomic(vocab, bad);
    EXPECT_THROW(Vocabulary::of_dataset(ds.dir(), ds.manifest()), DataError);
    std::string log;
    EXPECT_EQ(test::run_command(test::bin("ember-data") + " verify " + ds.dir().string(), log), 3) << log;
    EXPECT_NE(log.find("vocab.bin: checksum mismatch"), std::string::npos) << log;
  }
  {
    write_file_atomic(vocab, bytes.substr(0, bytes.size() - 8));  // truncated: the size listed differs
    EXPECT_THROW(Dataset::open(ds.dir()), DataError);
  }
  // A dataset of an older prep: no vocabulary in its manifest. It still opens and
  // trains; mapping raw values needs one, and says so.
  fs::remove(vocab);
  auto m = nlohmann::json::parse(read_file(ds.dir() / "manifest.json"));
  m.erase("vocabulary");
  write_file_atomic(ds.dir() / "manifest.json", m.dump(2));
  const Dataset old = Dataset::open(ds.dir());
  EXPECT_FALSE(old.manifest().vocabulary.has_value());
  try {
    Vocabulary::of_dataset(old.dir(), old.manifest());
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("has no vocabulary (prepared by an older ember-data)"), std::string::npos) << e.what();
  }
  std::string log;
  EXPECT_EQ(test::run_command(test::bin("ember-data") + " verify " + ds.dir().string(), log), 0) << log;
  EXPECT_NE(log.find("no vocabulary"), std::string::npos) << log;
}

}  // namespace
}  // namespace ember::data
