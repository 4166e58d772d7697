#include "ember/data/stats.h"

#include <gtest/gtest.h>

#include "ember/common/error.h"
#include "ember/data/prep.h"
#include "test_util.h"

namespace ember::data {
namespace {

class Stats : public test::TempDirTest {};

// 100 rows; in C1 value A appears 90 times and 10 values once each.
TEST_F(Stats, SkewAndDoIOnAHandBuiltTable) {
  std::string text;
  for (int i = 0; i < 100; ++i) {
    std::string l = test::criteo_line(0, i < 25);
    std::size_t pos = 0;
    for (int f = 0; f < 14; ++f) pos = l.find('\t', pos) + 1;
    char v[16];
    std::snprintf(v, sizeof v, "%08x", i < 90 ? 0xaaaa : i);
    l.replace(pos, 8, v);
    text += l + "\n";
  }
  PrepOptions o;
  o.inputs = {write("in.tsv", text)};
  o.output = dir_ / "ds";
  prepare_dataset(o);
  StatsOptions so;
  so.workers = 4;        // 25 samples per worker per epoch
  so.cache_ratio = 0.5;  // 13 rows: 6.5 -> 7 of them cached
  so.window = 10;
  DatasetStats s = compute_stats(Dataset::open(o.output), so);
  EXPECT_EQ(s.samples, 100u);
  EXPECT_DOUBLE_EQ(s.positive_rate, 0.25);
  const TableStats& c1 = s.tables[0];
  EXPECT_EQ(c1.rows, 13u);  // missing, OOV, 11 values
  EXPECT_EQ(c1.distinct, 11u);
  EXPECT_DOUBLE_EQ(c1.top1_share, 0.9);    // 1 row
  EXPECT_DOUBLE_EQ(c1.top10_share, 0.91);  // 2 rows
  EXPECT_EQ(c1.cached_rows, 7u);
  EXPECT_DOUBLE_EQ(c1.doi, 6.0 / 7.0);  // all but the 90-count row are < 25
  // Windows 1-9: one distinct value; window 10: ten.
  EXPECT_DOUBLE_EQ(c1.window_distinct, (9 * 1 + 10) / 100.0);
  EXPECT_THROW(compute_stats(Dataset::open(o.output), {Split::kTrain, 0, 0.1, 0}), ConfigError);
  EXPECT_THROW(compute_stats(Dataset::open(o.output), {Split::kVal, 8, 0.1, 0}), ConfigError);  // empty split
  std::string json = stats_json(s);
  EXPECT_NE(json.find("\"doi\""), std::string::npos);
  EXPECT_NE(json.find("\"top10_share\""), std::string::npos);
}

}  // namespace
}  // namespace ember::data
