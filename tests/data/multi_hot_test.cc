// Multi-hot data: bags of ids per table through the parser, prep, the shard format,
// the generator and stats.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/prep.h"
#include "ember/data/stats.h"
#include "ember/data/synthetic.h"
#include "ember/data/vocabulary.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

std::string fmt_hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A Criteo TSV line whose categorical fields are bags: bag t of row `seed` holds
// (seed + t) % 5 values (so 0 to 4), drawn from a small range so that ids repeat within
// a bag and across rows.
std::string bag_line(int seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::string s = std::to_string(seed % 2);
  for (int d = 0; d < 13; ++d) s += "\t" + std::to_string((seed * 7 + d) % 50);
  for (int t = 0; t < 26; ++t) {
    s += "\t";
    const int n = (seed + t) % 5;
    for (int k = 0; k < n; ++k) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(0x1000 * (t + 1) + rng() % 7));
      s += (k > 0 ? "|" : "") + std::string(hex);
    }
  }
  return s;
}

class MultiHot : public test::TempDirTest {
 protected:
  std::vector<std::string> lines_;
  fs::path text(int n) {
    std::string s;
    lines_.clear();
    for (int i = 0; i < n; ++i) {
      lines_.push_back(bag_line(i));
      s += lines_.back() + "\n";
    }
    return write("bags.tsv", s);
  }
  PrepOptions options(const fs::path& input, const std::string& out = "ds") const {
    PrepOptions o;
    o.format = SourceFormat::kCriteoTsv;
    o.inputs = {input};
    o.output = dir_ / out;
    o.shard_rows = 64;
    o.block_bytes = 4096;  // many blocks and chunks
    o.multi_hot_sep = '|';
    o.val_fraction = 0.1;
    o.test_fraction = 0.1;
    return o;
  }
};

// The stored bags of every row, in split order: one vector of ids per (row, table).
std::vector<std::vector<std::uint64_t>> stored_bags(const Dataset& ds) {
  std::vector<std::vector<std::uint64_t>> out;
  for (int s = 0; s < 3; ++s) {
    const SplitData& split = ds.split(static_cast<Split>(s));
    for (std::uint64_t i = 0; i < split.rows(); ++i) {
      std::uint64_t r;
      const Shard& sh = split.shard_of(i, r);
      for (int t = 0; t < ds.num_tables(); ++t) {
        std::vector<std::uint64_t> bag;
        sh.for_each_id(t, r, [&](std::uint64_t id) { bag.push_back(id); });
        EXPECT_EQ(bag.size(), sh.bag_size(t, r));
        out.push_back(std::move(bag));
      }
    }
  }
  return out;
}

TEST(MultiHotParser, ReadsBagsOfAnySizeWithRepeats) {
  std::string line = "1";
  for (int d = 0; d < 13; ++d) line += "\t1";
  // C1: three values with a repeat, C2: empty, C3: one value, the rest: one value.
  line += "\ta|b|a\t\tc";
  for (int t = 3; t < 26; ++t) line += "\t" + std::to_string(t);
  LineParser parser(SourceFormat::kCriteoTsv, line, '|');
  ASSERT_TRUE(parser.multi_hot());
  Record rec;
  std::string err;
  ASSERT_TRUE(parser.parse(line, rec, err)) << err;
  EXPECT_EQ(rec.bags[0], (std::vector<std::uint64_t>{0xa, 0xb, 0xa}));
  EXPECT_TRUE(rec.bags[1].empty());
  EXPECT_EQ(rec.bags[2], (std::vector<std::uint64_t>{0xc}));
  for (const char* bad : {"a||b", "|a", "a|", "a|zz"}) {
    std::string b = line;
    b.replace(b.find("a|b|a"), 5, bad);
    EXPECT_FALSE(parser.parse(b, rec, err)) << bad;
    EXPECT_NE(err.find("C1"), std::string::npos) << err;
  }
  EXPECT_THROW(LineParser(SourceFormat::kCriteoTsv, line, '\t'), ConfigError);
}

TEST_F(MultiHot, PrepStoresEveryBagAsItsVocabularyRows) {
  const fs::path in = text(500);
  PrepReport rep = prepare_dataset(options(in));
  EXPECT_TRUE(rep.manifest.multi_hot);
  Dataset ds = Dataset::open(dir_ / "ds");
  EXPECT_EQ(ds.manifest().format_version, kMultiHotFormatVersion);
  ASSERT_EQ(ds.manifest().total_rows(), 500u);
  const Vocabulary vocab = Vocabulary::of_dataset(dir_ / "ds", ds.manifest());
  const auto bags = stored_bags(ds);
  LineParser parser(SourceFormat::kCriteoTsv, lines_[0], '|');
  std::uint64_t empty = 0, repeats = 0;
  std::uint32_t max_bag = 0;
  for (std::size_t i = 0; i < lines_.size(); ++i) {
    Record rec;
    std::string err;
    ASSERT_TRUE(parser.parse(lines_[i], rec, err)) << err;
    for (int t = 0; t < 26; ++t) {
      const auto& raw = rec.bags[static_cast<std::size_t>(t)];
      const auto& got = bags[i * 26 + static_cast<std::size_t>(t)];
      ASSERT_EQ(got.size(), raw.size()) << "row " << i << " table " << t;
      for (std::size_t k = 0; k < raw.size(); ++k) ASSERT_EQ(got[k], vocab.row(t, raw[k])) << "row " << i << " table " << t;
      empty += raw.empty();
      repeats += std::set<std::uint64_t>(raw.begin(), raw.end()).size() < raw.size();
      max_bag = std::max(max_bag, static_cast<std::uint32_t>(raw.size()));
    }
  }
  EXPECT_GT(empty, 0u);
  EXPECT_GT(repeats, 0u);
  EXPECT_EQ(ds.manifest().tables[0].max_bag, max_bag);
  EXPECT_NEAR(ds.manifest().tables[0].mean_bag, 2.0, 0.01);  // (i + 0) % 5 over 500 rows
}

TEST_F(MultiHot, SameBytesForAnyThreadCountAndBlockSize) {
  const fs::path in = text(300);
  PrepOptions a = options(in, "a");
  a.threads = 1;
  prepare_dataset(a);
  PrepOptions b = options(in, "b");
  b.threads = 3;
  b.block_bytes = 1 << 20;
  prepare_dataset(b);
  for (const auto& e : fs::directory_iterator(dir_ / "a")) {
    if (e.path().extension() != ".ember") continue;
    EXPECT_EQ(read_file(e.path()), read_file(dir_ / "b" / e.path().filename())) << e.path();
  }
}

TEST_F(MultiHot, ShuffleMovesWholeRows) {
  const fs::path in = text(400);
  prepare_dataset(options(in, "plain"));
  PrepOptions o = options(in, "shuffled");
  o.shuffle = true;
  o.seed = 7;
  prepare_dataset(o);
  auto rows_of = [](const Dataset& ds) {
    const auto bags = stored_bags(ds);
    std::vector<std::vector<std::vector<std::uint64_t>>> rows;
    for (std::size_t i = 0; i < bags.size(); i += 26)
      rows.emplace_back(bags.begin() + static_cast<std::ptrdiff_t>(i), bags.begin() + static_cast<std::ptrdiff_t>(i + 26));
    return rows;
  };
  auto plain = rows_of(Dataset::open(dir_ / "plain"));
  auto shuffled = rows_of(Dataset::open(dir_ / "shuffled"));
  EXPECT_NE(plain, shuffled);
  std::sort(plain.begin(), plain.end());
  std::sort(shuffled.begin(), shuffled.end());
  EXPECT_EQ(plain, shuffled);
}

TEST_F(MultiHot, MalformedBagIsNamedByFileAndLine) {
  std::string s = bag_line(1) + "\n" + bag_line(2) + "\n";
  std::string bad = bag_line(3);
  const std::size_t bar = bad.find('|');
  ASSERT_NE(bar, std::string::npos);
  bad.insert(bar, "|");  // an empty value inside a bag
  const fs::path in = write("bad.tsv", s + bad + "\n");
  try {
    prepare_dataset(options(in));
    FAIL() << "prep accepted an empty value in a bag";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(in.string() + ":3: categorical"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty value in its bag"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "ds"));
}

TEST_F(MultiHot, CorruptBagOffsetsAreRejectedAtOpen) {
  prepare_dataset(options(text(200)));
  Dataset ds = Dataset::open(dir_ / "ds");
  const fs::path shard = dir_ / "ds" / ds.manifest().shards[0][0].file;
  const ShardLayout l = multi_hot_shard_layout(64, 13, 26, 0);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(l.bag_offsets_offset + 4 * 10));
    const std::uint32_t huge = 0x7fffffff;
    f.write(reinterpret_cast<const char*>(&huge), 4);
  }
  EXPECT_THROW(Dataset::open(dir_ / "ds"), DataError);  // payload checksum
  try {
    Dataset::open(dir_ / "ds", {false});
    FAIL() << "bad offsets accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bag offsets"), std::string::npos) << e.what();
  }
}

TEST_F(MultiHot, OneHotPrepIsUnchanged) {
  std::string s;
  for (int i = 0; i < 100; ++i) s += test::criteo_line(i) + "\n";
  PrepOptions o = options(write("one.tsv", s));
  o.multi_hot_sep = 0;
  prepare_dataset(o);
  Dataset ds = Dataset::open(dir_ / "ds");
  EXPECT_EQ(ds.manifest().format_version, kDatasetFormatVersion);
  EXPECT_FALSE(ds.manifest().multi_hot);
  EXPECT_EQ(ds.split(Split::kTrain).shard(0).bag_size(3, 0), 1u);
  EXPECT_EQ(read_file(dir_ / "ds" / "manifest.json").find("max_bag"), std::string::npos);
}

// One-hot datasets are written byte for byte as before bags existed: the checksums of
// the shards and vocabularies ember-data wrote at b166a4e (the commit before multi-hot)
// from the same generated input. So datasets prepared then load and train the same model.
TEST_F(MultiHot, OneHotBytesAreThoseOfThePrepBeforeBags) {
  auto checksums = [](const Manifest& m) {
    std::vector<std::string> out;
    for (int s = 0; s < 3; ++s) {
      for (const auto& sh : m.shards[s]) out.push_back(fmt_hex(sh.checksum));
    }
    out.push_back(fmt_hex(m.vocabulary->checksum));
    return out;
  };
  GenOptions g;
  g.rows = 3000;
  g.scale = 0.001;
  g.seed = 3;
  g.output = dir_ / "c.tsv";
  generate(g);
  PrepOptions o;
  o.inputs = {g.output};
  o.output = dir_ / "c";
  o.val_fraction = 0.1;
  o.shard_rows = 1024;
  EXPECT_EQ(checksums(prepare_dataset(o).manifest),
            (std::vector<std::string>{"197a3ad588007629", "64db5c41752e2055", "66599bbf3cd344bd", "63f0ac5e13ca80ac", "5e8d44203937a351"}));
  GenOptions a;
  a.like = SourceFormat::kAvazu;
  a.rows = 2000;
  a.scale = 0.001;
  a.seed = 4;
  a.output = dir_ / "a.csv";
  generate(a);
  PrepOptions p;
  p.format = SourceFormat::kAvazu;
  p.inputs = {a.output};
  p.output = dir_ / "a";
  p.shuffle = true;
  p.seed = 5;
  EXPECT_EQ(checksums(prepare_dataset(p).manifest), (std::vector<std::string>{"121f197dc49b8827", "4c1366c256275974"}));
}

// Avazu's layout (a CSV with a header; hour and weekday derived, one id each): bags of
// two in every drawn table, and the stored rows are the vocabulary's.
TEST_F(MultiHot, AvazuLayoutReadsBags) {
  GenOptions g;
  g.like = SourceFormat::kAvazu;
  g.rows = 1500;
  g.scale = 0.001;
  g.multi_hot = parse_bag_sizes("2", SourceFormat::kAvazu);
  g.output = dir_ / "a.csv";
  generate(g);
  PrepOptions o = options(g.output);
  o.format = SourceFormat::kAvazu;
  prepare_dataset(o);
  Dataset ds = Dataset::open(dir_ / "ds");
  ASSERT_EQ(ds.num_tables(), 23);
  const Shard& sh = ds.split(Split::kTrain).shard(0);
  for (int t = 0; t < 21; ++t) EXPECT_EQ(sh.bag_size(t, 3), 2u) << t;
  EXPECT_EQ(sh.bag_size(21, 3), 1u);  // hour
  EXPECT_EQ(sh.bag_size(22, 3), 1u);  // weekday
  const std::string text = read_file(g.output);
  const std::string header = text.substr(0, text.find('\n'));
  LineParser parser(SourceFormat::kAvazu, header, '|');
  const Vocabulary vocab = Vocabulary::of_dataset(dir_ / "ds", ds.manifest());
  const std::size_t l1 = text.find('\n') + 1;
  Record rec;
  std::string err;
  ASSERT_TRUE(parser.parse(text.substr(l1, text.find('\n', l1) - l1), rec, err)) << err;
  for (int t = 0; t < 23; ++t) {
    std::vector<std::uint64_t> got, want;
    ds.split(Split::kTrain).shard(0).for_each_id(t, 0, [&](std::uint64_t id) { got.push_back(id); });
    for (std::uint64_t k : rec.bags[static_cast<std::size_t>(t)]) want.push_back(vocab.row(t, k));
    EXPECT_EQ(got, want) << "table " << t;
  }
}

TEST_F(MultiHot, GeneratorWritesMlperfBags) {
  GenOptions g;
  g.rows = 3000;
  g.scale = 0.001;
  g.multi_hot = mlperf_bag_sizes();
  g.output = dir_ / "g.tsv";
  generate(g);
  PrepOptions o = options(g.output);
  prepare_dataset(o);
  Dataset ds = Dataset::open(dir_ / "ds");
  std::uint64_t ids = 0;
  for (int t = 0; t < 26; ++t) {
    EXPECT_EQ(ds.manifest().tables[static_cast<std::size_t>(t)].max_bag, g.multi_hot[static_cast<std::size_t>(t)]);
    EXPECT_DOUBLE_EQ(ds.manifest().tables[static_cast<std::size_t>(t)].mean_bag, g.multi_hot[static_cast<std::size_t>(t)]);
    ids += ds.split(Split::kTrain).shard(0).bag_size(t, 5);
  }
  EXPECT_EQ(ids, 214u);
  StatsOptions so;
  DatasetStats st = compute_stats(ds, so);
  EXPECT_TRUE(st.multi_hot);
  EXPECT_DOUBLE_EQ(st.tables[20].mean_bag, 100.0);
  EXPECT_LE(st.tables[20].top10_share, 1.0);

  EXPECT_EQ(parse_bag_sizes("2", SourceFormat::kAvazu).size(), 21u);
  EXPECT_THROW(parse_bag_sizes("1,2", SourceFormat::kCriteoTsv), ConfigError);
  EXPECT_THROW(parse_bag_sizes("mlperf", SourceFormat::kAvazu), ConfigError);
  EXPECT_THROW(parse_bag_sizes("x", SourceFormat::kCriteoTsv), ConfigError);
}

}  // namespace
}  // namespace ember::data
