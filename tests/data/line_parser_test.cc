#include "ember/data/line_parser.h"

#include <gtest/gtest.h>

#include <cmath>

#include "ember/common/error.h"
#include "test_util.h"

namespace ember::data {
namespace {

TEST(LineParser, CriteoTsvWithAndWithoutLabel) {
  std::string line = test::criteo_line(5, 1);
  LineParser p(SourceFormat::kCriteoTsv, line);
  EXPECT_FALSE(p.header_consumed());
  EXPECT_TRUE(p.has_label());
  Record r;
  std::string err;
  ASSERT_TRUE(p.parse(line, r, err)) << err;
  EXPECT_EQ(r.label, 1);
  EXPECT_FLOAT_EQ(r.dense[0], std::log1p(35.0f));

  std::string unlabeled = line.substr(2);  // Kaggle test.txt: no label column
  LineParser q(SourceFormat::kCriteoTsv, unlabeled);
  EXPECT_FALSE(q.has_label());
  ASSERT_TRUE(q.parse(unlabeled, r, err)) << err;
  EXPECT_FALSE(q.parse(line, r, err));  // 40 fields in a 39-field file
  EXPECT_NE(err.find("expected 39 fields, found 40"), std::string::npos) << err;
}

TEST(LineParser, CriteoMissingNegativeAndCrlf) {
  std::string line = "0\t\t-1\t2";
  for (int i = 3; i < 13; ++i) line += "\t1";
  for (int i = 0; i < 26; ++i) line += i == 3 ? "\t" : "\t68fd1e64";
  line += "\r";
  LineParser p(SourceFormat::kCriteoTsv, line);
  Record r;
  std::string err;
  ASSERT_TRUE(p.parse(line, r, err)) << err;
  EXPECT_EQ(r.dense[0], 0.0f);  // missing
  EXPECT_EQ(r.dense[1], 0.0f);  // -1 clamped to 0
  EXPECT_FLOAT_EQ(r.dense[2], std::log1p(2.0f));
  EXPECT_EQ(r.keys[3], kMissingKey);
  EXPECT_EQ(r.keys[0], 0x68fd1e64u);
  EXPECT_EQ(r.keys[25], 0x68fd1e64u);  // the trailing \r is not part of the last field
}

TEST(LineParser, CriteoBadFields) {
  std::string good = test::criteo_line(1);
  LineParser p(SourceFormat::kCriteoTsv, good);
  Record r;
  std::string err;
  std::string bad_hex = good.substr(0, good.size() - 8) + "68fd1e6z";
  EXPECT_FALSE(p.parse(bad_hex, r, err));
  EXPECT_NE(err.find("C26"), std::string::npos) << err;
  EXPECT_NE(err.find("not hexadecimal"), std::string::npos) << err;
  EXPECT_EQ(err.find("--multi-hot-sep"), std::string::npos) << err;  // a typo, not a bag
  // A bag (ember-data gen --multi-hot) read without --multi-hot-sep: the error names it.
  std::string bag = good.substr(0, good.size() - 8) + "68fd1e64|1a2b3c4d|5e6f7a8b";
  EXPECT_FALSE(p.parse(bag, r, err));
  EXPECT_NE(err.find("--multi-hot-sep '|'"), std::string::npos) << err;
  std::string bad_dense = "0\tabc" + good.substr(good.find('\t', 2));
  EXPECT_FALSE(p.parse(bad_dense, r, err));
  EXPECT_NE(err.find("I1"), std::string::npos) << err;
  std::string bad_label = "2" + good.substr(1);
  EXPECT_FALSE(p.parse(bad_label, r, err));
  EXPECT_NE(err.find("label"), std::string::npos) << err;
  EXPECT_FALSE(p.parse(good + "\textra", r, err));
  EXPECT_THROW(LineParser(SourceFormat::kCriteoTsv, "1\t2\t3"), DataError);
}

std::string csv_header() {
  std::string h = "Id,Label";
  for (int i = 1; i <= 13; ++i) h += ",I" + std::to_string(i);
  for (int i = 1; i <= 26; ++i) h += ",C" + std::to_string(i);
  return h;
}

TEST(LineParser, CriteoCsvHeaderAndQuoting) {
  LineParser p(SourceFormat::kCriteoCsv, csv_header() + "\r");
  EXPECT_TRUE(p.header_consumed());
  EXPECT_TRUE(p.has_label());
  std::string row = "10000000,1,1.0,\"2\",3";
  for (int i = 4; i <= 13; ++i) row += ",";
  for (int i = 1; i <= 26; ++i) row += ",\"0a\"";
  Record r;
  std::string err;
  ASSERT_TRUE(p.parse(row + "\r", r, err)) << err;
  EXPECT_EQ(r.label, 1);
  EXPECT_FLOAT_EQ(r.dense[1], std::log1p(2.0f));
  EXPECT_EQ(r.keys[0], 0x0au);
  EXPECT_FALSE(p.parse("10000000,\"1,1", r, err));
  EXPECT_NE(err.find("unterminated quoted field"), std::string::npos) << err;
  EXPECT_FALSE(p.parse("10000000,\"1\"x,1", r, err));
  EXPECT_NE(err.find("after closing quote"), std::string::npos) << err;
  EXPECT_FALSE(p.parse("10000000,1\"1,1", r, err));
  EXPECT_NE(err.find("stray quote"), std::string::npos) << err;
  EXPECT_THROW(LineParser(SourceFormat::kCriteoCsv, "10000000,0,1,2"), DataError);  // no header
  EXPECT_THROW(LineParser(SourceFormat::kCriteoCsv, "Id,Label,I1,I2"), DataError);  // missing columns
}

TEST(SplitCsv, EscapedQuotes) {
  std::vector<std::string_view> f;
  std::string scratch, err;
  ASSERT_TRUE(split_csv("a,\"b \"\"q\"\" c\",,\"\"", f, scratch, err)) << err;
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], "a");
  EXPECT_EQ(f[1], "b \"q\" c");
  EXPECT_EQ(f[2], "");
  EXPECT_EQ(f[3], "");
}

TEST(LineParser, AvazuHourIdAndHashedValues) {
  const std::string header =
      "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,"
      "device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21";
  LineParser p(SourceFormat::kAvazu, header);
  EXPECT_TRUE(p.has_label());
  // 2014-10-21 was a Tuesday; 10000169349117863715 exceeds INT64_MAX.
  std::string row =
      "10000169349117863715,1,14102113,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,"
      "96809ac8,711ee120,1,0,15704,320,50,1722,0,35,-1,79";
  Record r;
  std::string err;
  ASSERT_TRUE(p.parse(row, r, err)) << err;
  EXPECT_EQ(r.label, 1);
  const int hour = schema_for(SourceFormat::kAvazu).num_tables() - 2;
  EXPECT_EQ(r.keys[hour], 13u);
  EXPECT_EQ(r.keys[hour + 1], 1u);  // Monday = 0
  Record r2;
  std::string row2 = row;
  row2.replace(row2.find("-1,79"), 5, "-1,80");
  ASSERT_TRUE(p.parse(row2, r2, err));
  EXPECT_EQ(r.keys[0], r2.keys[0]);
  EXPECT_NE(r.keys[20], r2.keys[20]);
  EXPECT_FALSE(p.parse("99999999999999999999" + row.substr(row.find(',')), r, err));  // > 2^64
  EXPECT_NE(err.find("id"), std::string::npos);
  std::string bad_hour = row;
  bad_hour.replace(bad_hour.find("14102113"), 8, "14132113");
  EXPECT_FALSE(p.parse(bad_hour, r, err));
  EXPECT_NE(err.find("YYMMDDHH"), std::string::npos);
}

}  // namespace
}  // namespace ember::data
