// `ember-data prep --ids hash`: every stored id is hashed_id(table, value), rows land
// where the vocabulary's prep puts them, collisions are counted, and the programs that
// need fixed tables refuse such a dataset in one line.
#include "ember/data/hashed_ids.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <unordered_set>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/prep.h"
#include "ember/data/stats.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

TEST(HashedId, NarrowValuesOfOneTableNeverShareAnId) {
  // mix55 is a bijection: consecutive keys (the worst case for a weak mixer) and random
  // 32-bit ones all get distinct ids, in their table's byte, the wide bit clear.
  std::unordered_set<std::uint64_t> ids;
  std::mt19937_64 rng(7);
  for (std::uint64_t k = 0; k < 200000; ++k) {
    const std::uint64_t key = k < 100000 ? k : rng() >> 32;
    const std::uint64_t id = hashed_id(3, key);
    EXPECT_EQ(hashed_id_table(id), 3u);
    EXPECT_EQ(id & kHashedWideBit, 0u);
    ids.insert(id);
  }
  std::set<std::uint64_t> keys;
  rng.seed(7);
  for (std::uint64_t k = 0; k < 200000; ++k) keys.insert(k < 100000 ? k : rng() >> 32);
  EXPECT_EQ(ids.size(), keys.size());
  // The same value in two tables: two ids.
  EXPECT_NE(hashed_id(0, 42), hashed_id(1, 42));
  // A wide key (Avazu's hashes, the missing value) has the wide bit: never a narrow id.
  EXPECT_NE(hashed_id(0, kMissingKey) & kHashedWideBit, 0u);
  EXPECT_EQ(hashed_id_table(hashed_id(25, kMissingKey)), 25u);
}

class HashedPrep : public test::TempDirTest {
 protected:
  std::vector<std::string> lines_;
  fs::path text(int n, bool bags) {
    std::string s;
    lines_.clear();
    std::mt19937 rng(11);
    for (int i = 0; i < n; ++i) {
      std::string line = std::to_string(i % 3 == 0);
      for (int d = 0; d < 13; ++d) line += "\t" + std::to_string((i * 7 + d) % 50);
      for (int t = 0; t < 26; ++t) {
        line += "\t";
        const int values = bags ? (i + t) % 4 : (i + t) % 9 == 0 ? 0 : 1;  // some empty
        for (int k = 0; k < values; ++k) line += (k > 0 ? "|" : "") + fmt_hex(0x100 * (t + 1) + rng() % 50);
      }
      lines_.push_back(line);
      s += line + "\n";
    }
    return write(bags ? "bags.tsv" : "rows.tsv", s);
  }
  static std::string fmt_hex(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
    return buf;
  }
  PrepOptions options(const fs::path& input, const std::string& out, bool hashed) const {
    PrepOptions o;
    o.format = SourceFormat::kCriteoTsv;
    o.inputs = {input};
    o.output = dir_ / out;
    o.shard_rows = 64;
    o.block_bytes = 4096;  // many blocks and chunks
    o.val_fraction = 0.1;
    o.test_fraction = 0.15;
    o.hashed_ids = hashed;
    return o;
  }
};

// Both datasets hold the same rows in the same places: labels, dense values, bag sizes.
void expect_same_rows(const Dataset& vocab, const Dataset& hashed) {
  for (int s = 0; s < 3; ++s) {
    const SplitData& v = vocab.split(static_cast<Split>(s));
    const SplitData& h = hashed.split(static_cast<Split>(s));
    ASSERT_EQ(v.rows(), h.rows()) << kSplitNames[s];
    for (std::uint64_t i = 0; i < h.rows(); ++i) {
      std::uint64_t rv, rh;
      const Shard& sv = v.shard_of(i, rv);
      const Shard& sh = h.shard_of(i, rh);
      ASSERT_EQ(sv.label(rv), sh.label(rh));
      for (int d = 0; d < 13; ++d) ASSERT_EQ(sv.dense(rv)[d], sh.dense(rh)[d]);
      for (int t = 0; t < 26; ++t) ASSERT_EQ(sv.bag_size(t, rv), sh.bag_size(t, rh));
    }
  }
}

// Row i of `ds` (unshuffled, split after split) is line i: each of its bags holds the
// hashes of the line's values of that table, in order (one-hot: the one value, or the
// missing value's hash).
void expect_hashes_of_lines(const Dataset& ds, const std::vector<std::string>& lines, char sep) {
  LineParser parser(SourceFormat::kCriteoTsv, lines[0], sep);
  std::uint64_t pos = 0;
  for (int s = 0; s < 3; ++s) {
    const SplitData& split = ds.split(static_cast<Split>(s));
    for (std::uint64_t i = 0; i < split.rows(); ++i, ++pos) {
      std::uint64_t row;
      const Shard& sh = split.shard_of(i, row);
      Record rec;
      std::string err;
      ASSERT_TRUE(parser.parse(lines[pos], rec, err)) << err;
      for (int t = 0; t < 26; ++t) {
        const auto table = static_cast<std::size_t>(t);
        std::vector<std::uint64_t> want, got;
        if (sep == 0) {
          want.push_back(hashed_id(static_cast<unsigned>(t), rec.keys[table]));
        } else {
          for (std::uint64_t key : rec.bags[table]) want.push_back(hashed_id(static_cast<unsigned>(t), key));
        }
        sh.for_each_id(t, row, [&](std::uint64_t id) { got.push_back(id); });
        ASSERT_EQ(got, want) << "row " << pos << " table " << t;
      }
    }
  }
}

TEST_F(HashedPrep, OneHotIdsAreTheHashOfEachValueInTheVocabularysRowOrder) {
  const fs::path in = text(500, false);
  for (bool shuffle : {false, true}) {
    PrepOptions v = options(in, "v", false), h = options(in, "h", true);
    v.shuffle = h.shuffle = shuffle;
    v.overwrite = h.overwrite = true;
    prepare_dataset(v);
    const PrepReport r = prepare_dataset(h);
    EXPECT_EQ(r.manifest.hash_collisions, 0u);
    const Dataset dv = Dataset::open(dir_ / "v"), dh = Dataset::open(dir_ / "h");
    ASSERT_TRUE(dh.manifest().hashed_ids);
    EXPECT_FALSE(dh.manifest().vocabulary.has_value());
    EXPECT_EQ(dh.manifest().total_table_rows(), 0u);
    expect_same_rows(dv, dh);
    // Without a shuffle, row i is line i: its ids are the hashes of its values.
    if (!shuffle) expect_hashes_of_lines(dh, lines_, 0);
  }
}

TEST_F(HashedPrep, BagsStoreEightByteHashesInTheirOrder) {
  const fs::path in = text(400, true);
  PrepOptions v = options(in, "v", false), h = options(in, "h", true);
  v.multi_hot_sep = h.multi_hot_sep = '|';
  prepare_dataset(v);
  prepare_dataset(h);
  const Dataset dv = Dataset::open(dir_ / "v"), dh = Dataset::open(dir_ / "h");
  ASSERT_TRUE(dh.manifest().multi_hot);
  EXPECT_EQ(dh.manifest().tables[0].id_bytes, 8u);
  expect_same_rows(dv, dh);
  expect_hashes_of_lines(dh, lines_, '|');
  // Same bytes for another thread count (the spool is written in file order).
  PrepOptions one = h;
  one.output = dir_ / "h1";
  one.threads = 1;
  prepare_dataset(one);
  EXPECT_EQ(read_file(dir_ / "h1" / "train-00000.ember"), read_file(dir_ / "h" / "train-00000.ember"));
}

TEST_F(HashedPrep, CollisionsAmongWideValuesAreCounted) {
  // Two values of 64 bits whose folds agree share an id; a third wide value does not.
  const std::uint64_t a = 0xf00000000000abcdULL;
  std::uint64_t b = 0;
  for (std::uint64_t top = 1; top < 512 && b == 0; ++top) {
    const std::uint64_t hi = top << 55;
    if ((hi | (a & kHashedValueMask)) == a) continue;
    // fold55(k) = (k ^ (k >> 55) * C) & mask: pick b's low bits so the folds agree.
    const std::uint64_t low = (fold55(a) ^ ((top * 0x9e3779b97f4a7c15ULL) & kHashedValueMask)) & kHashedValueMask;
    b = hi | low;
  }
  ASSERT_EQ(fold55(a), fold55(b));
  ASSERT_EQ(hashed_id(0, a), hashed_id(0, b));
  std::string s;
  const std::uint64_t c1[] = {a, b, 0xe000000000001234ULL, a, 5};
  for (std::uint64_t v : c1) {
    std::string line = "1";
    for (int d = 0; d < 13; ++d) line += "\t1";
    line += "\t" + fmt_hex(v);
    for (int t = 1; t < 26; ++t) line += "\t" + fmt_hex(static_cast<std::uint64_t>(t));
    s += line + "\n";
  }
  PrepOptions o = options(write("wide.tsv", s), "h", true);
  o.val_fraction = o.test_fraction = 0;
  const PrepReport r = prepare_dataset(o);
  EXPECT_EQ(r.manifest.hash_collisions, 1u);
  EXPECT_EQ(r.manifest.wide_values, 3u);
  const Manifest back = Manifest::from_json(read_file(dir_ / "h" / "manifest.json"), "manifest.json");
  EXPECT_EQ(back.hash_collisions, 1u);
  EXPECT_TRUE(back.hashed_ids);
}

TEST_F(HashedPrep, StatsReadHashedIdsAsTheVocabularysRows) {
  // Distinct rows, the missing share and windows count rows: a renaming changes none
  // (the table's size does differ: the ids of the split, not of every split).
  const fs::path in = text(600, false);
  prepare_dataset(options(in, "v", false));
  prepare_dataset(options(in, "h", true));
  StatsOptions so;
  so.workers = 4;
  so.window = 50;
  const DatasetStats v = compute_stats(Dataset::open(dir_ / "v"), so), h = compute_stats(Dataset::open(dir_ / "h"), so);
  ASSERT_EQ(v.tables.size(), h.tables.size());
  for (std::size_t t = 0; t < v.tables.size(); ++t) {
    EXPECT_EQ(h.tables[t].distinct, v.tables[t].distinct) << t;
    EXPECT_EQ(h.tables[t].missing_share, v.tables[t].missing_share) << t;
    EXPECT_EQ(h.tables[t].window_distinct, v.tables[t].window_distinct) << t;
    EXPECT_NEAR(h.tables[t].window_distinct_random, v.tables[t].window_distinct_random, 1e-9) << t;
  }
}

TEST_F(HashedPrep, ProgramsThatNeedFixedTablesRefuseInOneLine) {
  PrepOptions o = options(text(100, false), "h", true);
  prepare_dataset(o);
  const Dataset ds = Dataset::open(dir_ / "h");
  try {
    ds.manifest().require_fixed_tables("h", "ember-sim");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hashed ids"), std::string::npos) << e.what();
  }
  std::string out;
  const int rc = test::run_command(test::bin("ember-plan") + " --dataset " + (dir_ / "h").string() + " 2>&1", out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("hashed ids (ember-data prep --ids hash): ember-plan needs tables of a fixed size"), std::string::npos) << out;
  PrepOptions bad = options(text(10, false), "m", true);
  bad.min_count = 2;
  EXPECT_THROW(prepare_dataset(bad), ConfigError);
}

}  // namespace
}  // namespace ember::data
