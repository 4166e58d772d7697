// The real Criteo and Avazu samples in ../shared/data/real, read and counted.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/prep.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

class RealSamples : public test::TempDirTest {
 protected:
  Dataset prep(const std::string& name, SourceFormat format) {
    fs::path in = test::real_sample(name);
    if (in.empty()) return Dataset();
    PrepOptions o;
    o.format = format;
    o.inputs = {in};
    o.output = dir_ / name;
    prepare_dataset(o);
    return Dataset::open(o.output);
  }
  std::uint64_t positives(const Dataset& ds) {
    const SplitData& s = ds.split(Split::kTrain);
    std::uint64_t n = 0;
    for (std::uint64_t i = 0; i < s.rows(); ++i) {
      std::uint64_t r;
      n += s.shard_of(i, r).label(r);
    }
    return n;
  }
  // Distinct non-empty values per column of a comma/tab separated file, by plain split.
  static std::vector<std::set<std::string>> distinct_per_column(const fs::path& p, char sep, bool header) {
    std::ifstream in(p);
    std::string line;
    std::vector<std::set<std::string>> out;
    if (header) std::getline(in, line);
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::vector<std::string> f;
      std::stringstream ss(line);
      std::string x;
      while (std::getline(ss, x, sep)) f.push_back(x);
      if (!line.empty() && line.back() == sep) f.push_back("");
      out.resize(std::max(out.size(), f.size()));
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (!f[i].empty()) out[i].insert(f[i]);
      }
    }
    return out;
  }
  // Every table's values_seen equals the distinct non-empty values of its column in the
  // text (tables in column order from `first_column`).
  static void expect_values_seen(const Dataset& ds, const fs::path& file, char sep, bool header, std::size_t first_column, int tables) {
    auto distinct = distinct_per_column(file, sep, header);
    for (int t = 0; t < tables; ++t) {
      const TableInfo& info = ds.manifest().tables[static_cast<std::size_t>(t)];
      EXPECT_EQ(info.values_seen, distinct[first_column + static_cast<std::size_t>(t)].size()) << info.name;
    }
  }
};

#define SKIP_IF_ABSENT(name) \
  if (test::real_sample(name).empty()) GTEST_SKIP() << "../shared/data/real/" name " not present"

TEST_F(RealSamples, KaggleTsv) {
  SKIP_IF_ABSENT("sample_train.txt");
  Dataset ds = prep("sample_train.txt", SourceFormat::kCriteoTsv);
  EXPECT_EQ(ds.split(Split::kTrain).rows(), 100u);
  EXPECT_EQ(positives(ds), 29u);
  expect_values_seen(ds, test::real_sample("sample_train.txt"), '\t', false, 14, 26);
  // First line: "0\t\t0\t5\t4\t13275..." -> I1 missing, I5 = 13275.
  const Shard& sh = ds.split(Split::kTrain).shard(0);
  EXPECT_EQ(sh.dense(0)[0], 0.0f);
  EXPECT_FLOAT_EQ(sh.dense(0)[4], std::log1p(13275.0f));
}

TEST_F(RealSamples, CompetitionCsvWithCrlf) {
  SKIP_IF_ABSENT("train.tiny.csv");
  Dataset ds = prep("train.tiny.csv", SourceFormat::kCriteoCsv);
  EXPECT_EQ(ds.split(Split::kTrain).rows(), 1999u);
  EXPECT_EQ(positives(ds), 418u);
  expect_values_seen(ds, test::real_sample("train.tiny.csv"), ',', true, 15, 26);
  // First row: Id 10000000, label 0, I1 = 1, I5 = 1382.
  const Shard& sh = ds.split(Split::kTrain).shard(0);
  EXPECT_FLOAT_EQ(sh.dense(0)[0], std::log1p(1.0f));
  EXPECT_FLOAT_EQ(sh.dense(0)[4], std::log1p(1382.0f));
}

TEST_F(RealSamples, CompetitionTestCsv) {
  SKIP_IF_ABSENT("test.tiny.csv");
  Dataset ds = prep("test.tiny.csv", SourceFormat::kCriteoCsv);
  EXPECT_EQ(ds.split(Split::kTrain).rows(), 1999u);
  EXPECT_EQ(positives(ds), 0u);  // dummy labels
}

TEST_F(RealSamples, DeepCtrCsv) {
  SKIP_IF_ABSENT("criteo_sample.txt");
  Dataset ds = prep("criteo_sample.txt", SourceFormat::kCriteoCsv);
  EXPECT_EQ(ds.split(Split::kTrain).rows(), 200u);
  EXPECT_EQ(positives(ds), 49u);
  // First row: I3 = 260.0 (floats), I2 = 3.
  const Shard& sh = ds.split(Split::kTrain).shard(0);
  EXPECT_FLOAT_EQ(sh.dense(0)[2], std::log1p(260.0f));
  EXPECT_FLOAT_EQ(sh.dense(0)[1], std::log1p(3.0f));
}

TEST_F(RealSamples, AvazuSample) {
  SKIP_IF_ABSENT("avazu_sample.txt");
  Dataset ds = prep("avazu_sample.txt", SourceFormat::kAvazu);
  EXPECT_EQ(ds.split(Split::kTrain).rows(), 100u);
  EXPECT_EQ(positives(ds), 20u);
  EXPECT_EQ(ds.num_dense(), 0);
  EXPECT_EQ(ds.num_tables(), 23);
  expect_values_seen(ds, test::real_sample("avazu_sample.txt"), ',', true, 3, 21);
  // All rows are from hour 14102100: one hour-of-day and one weekday value.
  EXPECT_EQ(ds.manifest().tables[21].values_seen, 1u);
  EXPECT_EQ(ds.manifest().tables[22].values_seen, 1u);
}

TEST_F(RealSamples, AvazuRepeatedRows) {
  SKIP_IF_ABSENT("tr.rx.csv");
  Dataset ds = prep("tr.rx.csv", SourceFormat::kAvazu);
  const SplitData& s = ds.split(Split::kTrain);
  ASSERT_EQ(s.rows(), 2994u);
  // The first 499 rows repeated 6 times: row i and row i + 499 are the same sample.
  for (std::uint64_t i = 0; i + 499 < s.rows(); i += 37) {
    std::uint64_t r1, r2;
    const Shard& a = s.shard_of(i, r1);
    const Shard& b = s.shard_of(i + 499, r2);
    ASSERT_EQ(a.label(r1), b.label(r2));
    for (int t = 0; t < ds.num_tables(); ++t) ASSERT_EQ(a.id(t, r1), b.id(t, r2));
  }
}

}  // namespace
}  // namespace ember::data
