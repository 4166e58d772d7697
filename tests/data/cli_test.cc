// ember-data as users run it: exit codes and one-line errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ember/common/fs.h"
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

// A command line refused, by any program: one line naming the program and the flag,
// exit 2 (as any refused setting, which the launchers do not retry), not CLI11's two
// lines and its own codes (104-109). --help still exits 0.
TEST_F(Cli, EveryProgramRefusesABadFlagInOneLineWithStatus2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ember-data", "prep --format criteo --val-fraction nine -o x y"},
      {"ember-data", "gen --no-such-flag"},
      {"ember-ps", "--transport udp"},
      {"ember-sim", "--workers many"},
      {"ember-plan", "--no-such-flag 3"},
      {"ember-bench", "ps --no-such-flag"},
  };
  for (const auto& [program, args] : cases) {
    if (program == "ember-bench" && !std::filesystem::exists(test::bin(program))) continue;  // EMBER_WITH_BENCH=OFF
    std::string out;
    const int rc = test::run_command(test::bin(program) + " " + args, out);
    EXPECT_EQ(rc, 2) << program << " " << args << ": " << out;
    EXPECT_EQ(out.rfind(program + ": error: ", 0), 0u) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
  std::string out;
  EXPECT_EQ(test::run_command(test::bin("ember-data") + " prep --help", out), 0) << out;
}

// Bytes a file takes on a tmpfs: whole pages.
std::uint64_t pages_of(const std::filesystem::path& file) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return (std::filesystem::file_size(file) + page - 1) / page * page;
}

std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Issue 44: prep wrote its shards through a sparse mapping, and a full disk was SIGBUS
// (exit 135, no message, the staging directory left behind). Each of prep's writers meets
// a full tmpfs in turn: the vocabulary, a shard, the manifest, and a shard of an output
// replacing one already there (--force).
TEST_F(Cli, PrepOnAFullDiskIsOneLineNamingTheFileAndLeavesNothing) {
  namespace fs = std::filesystem;
  {
    test::TmpfsMount probe(dir_ / "probe", 1 << 20);
    if (!probe.ok()) GTEST_SKIP() << "needs a tmpfs mount (root): " << probe.error();
  }
  const std::string data = test::bin("ember-data");
  const std::string prep = data + " prep --format criteo --threads 2 -q ";
  const std::string in = (dir_ / "g.tsv").string();
  std::string out;
  ASSERT_EQ(test::run_command(data + " gen --like criteo --rows 5000 --scale 0.01 -q -o " + in, out), 0) << out;
  // A complete output elsewhere, on the ordinary disk: its sizes size the tmpfs below.
  const fs::path kept = dir_ / "kept";
  ASSERT_EQ(test::run_command(prep + "-o " + kept.string() + " " + in, out), 0) << out;
  const std::string kept_manifest = read_file(kept / "manifest.json");
  const std::uint64_t vocab = pages_of(kept / "vocab.bin"), shard = pages_of(kept / "train-00000.ember"),
                      manifest = pages_of(kept / "manifest.json");
  ASSERT_EQ(entries(kept), (std::set<std::string>{"manifest.json", "train-00000.ember", "vocab.bin"}));

  struct Case {
    std::string fails;  // the file named
    std::uint64_t bytes;
    bool replace;  // a complete output is on the disk first, prep --force replaces it
  };
  const Case cases[] = {{"vocab.bin", std::max<std::uint64_t>(vocab / 2, 4096), false},
                        {"train-00000.ember", vocab + shard / 2, false},
                        {"manifest.json", vocab + shard, false},
                        {"train-00000.ember", vocab + shard + manifest + vocab + shard / 2, true}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fails + (c.replace ? " (--force)" : "") + " on a tmpfs of " + std::to_string(c.bytes) + " bytes");
    const fs::path mnt = dir_ / ("full" + std::to_string(n++));
    test::TmpfsMount disk(mnt, c.bytes);
    ASSERT_TRUE(disk.ok()) << disk.error();
    const fs::path ds = mnt / "ds";
    std::string before;
    if (c.replace) {
      ASSERT_EQ(test::run_command(prep + "--val-fraction 0.5 -o " + ds.string() + " " + in, out), 0) << out;
      before = read_file(ds / "manifest.json");
    }
    const int rc = test::run_command(prep + (c.replace ? "--force " : "") + "-o " + ds.string() + " " + in, out);
    EXPECT_EQ(rc, 4) << out;  // IoError, not a signal (SIGBUS was 135 through the shell)
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
    EXPECT_EQ(out.rfind("ember-data: error: ", 0), 0u) << out;
    EXPECT_NE(out.find(ds.string() + ".tmp-"), std::string::npos) << out;
    EXPECT_NE(out.find("/" + c.fails), std::string::npos) << out;
    EXPECT_NE(out.find(": No space left on device\n"), std::string::npos) << out;
    // Nothing left behind; an output already there is whole and unchanged.
    if (c.replace) {
      EXPECT_EQ(entries(mnt), std::set<std::string>{"ds"});
      EXPECT_EQ(read_file(ds / "manifest.json"), before);
      EXPECT_EQ(test::run_command(data + " verify " + ds.string(), out), 0) << out;
    } else {
      EXPECT_EQ(entries(mnt), std::set<std::string>{});
    }
  }
  EXPECT_EQ(read_file(kept / "manifest.json"), kept_manifest);
  EXPECT_EQ(test::run_command(data + " verify " + kept.string(), out), 0) << out;

  // With room on the same kind of disk, the same prep succeeds.
  test::TmpfsMount roomy(dir_ / "roomy", vocab + shard + manifest + (64u << 10));
  ASSERT_TRUE(roomy.ok()) << roomy.error();
  ASSERT_EQ(test::run_command(prep + "-o " + (dir_ / "roomy" / "ds").string() + " " + in, out), 0) << out;
  EXPECT_EQ(read_file(dir_ / "roomy" / "ds" / "manifest.json"), kept_manifest);
  EXPECT_EQ(test::run_command(data + " verify " + (dir_ / "roomy" / "ds").string(), out), 0) << out;
}

}  // namespace
}  // namespace ember
