// ember-data as users run it: exit codes and one-line errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace ember {
namespace {

class Cli : public test::TempDirTest {};

TEST_F(Cli, GenPrepStatsVerify) {
  std::string out;
  std::string d = dir_.string();
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 5000 --scale 0.01 -q -o " + d + "/g.tsv", out), 0)
      << out;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " prep --format criteo --val-fraction 0.1 -q -o " + d + "/ds " + d + "/g.tsv", out),
            0)
      << out;
  EXPECT_NE(out.find("4500 train, 500 val, 0 test rows"), std::string::npos) << out;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " stats --json " + d + "/ds", out), 0) << out;
  EXPECT_EQ(out.rfind("{\"split\":\"train\"", 0), 0u) << out;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " verify " + d + "/ds", out), 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos);
}

TEST_F(Cli, BadInputIsOneLineNamingFileAndLine) {
  auto in = write("bad.tsv", test::criteo_line(1) + "\n" + test::criteo_line(2) + "\n0\tzz\n");
  std::string out;
  int rc = test::run_command(test::bin("ember-data") + " prep --format criteo -q -o " + dir_.string() + "/ds " + in.string(), out);
  EXPECT_EQ(rc, 3);
  EXPECT_EQ(out, "ember-data: error: " + in.string() + ":3: expected 40 fields, found 2\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ds"));
  rc = test::run_command(test::bin("ember-data") + " prep --format parquet -o x " + in.string(), out);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("unknown format 'parquet'"), std::string::npos) << out;
  rc = test::run_command(test::bin("ember-data") + " prep --format criteo -o x " + dir_.string() + "/missing.tsv", out);
  EXPECT_EQ(rc, 4);
  EXPECT_NE(out.find("missing.tsv"), std::string::npos) << out;
}

}  // namespace
}  // namespace ember
