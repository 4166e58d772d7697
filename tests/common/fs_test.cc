#include "ember/common/fs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ember/common/error.h"
#include "ember/common/mapped_file.h"

namespace ember {
namespace {
namespace fs = std::filesystem;

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ember-fs-test-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TempDir, WriteFileAtomicReplacesWholeFile) {
  auto p = dir_ / "x.json";
  write_file_atomic(p, "first");
  write_file_atomic(p, "second version");
  EXPECT_EQ(read_file(p), "second version");
  // No temp files left behind.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST_F(TempDir, StagingDirCommitsOrLeavesNothing) {
  auto target = dir_ / "out";
  {
    StagingDir s(target, false);
    write_file_atomic(s.path() / "a", "x");
    // Destroyed without commit: as if the run failed.
  }
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
  {
    StagingDir s(target, false);
    write_file_atomic(s.path() / "a", "x");
    s.commit();
  }
  EXPECT_EQ(read_file(target / "a"), "x");
  EXPECT_THROW(StagingDir(target, false), ConfigError);
  {
    StagingDir s(target, true);
    write_file_atomic(s.path() / "b", "y");
    s.commit();
  }
  EXPECT_FALSE(fs::exists(target / "a"));
  EXPECT_EQ(read_file(target / "b"), "y");
}

TEST_F(TempDir, MappedFileOfEmptyAndMissingFiles) {
  write_file_atomic(dir_ / "empty", "");
  MappedFile m(dir_ / "empty");
  EXPECT_EQ(m.size(), 0u);
  EXPECT_THROW(MappedFile(dir_ / "missing"), IoError);
}

TEST(Errors, ExitCodesByType) {
  EXPECT_EQ(exit_code(ConfigError("x")), 2);
  EXPECT_EQ(exit_code(DataError("x")), 3);
  EXPECT_EQ(exit_code(IoError("x")), 4);
  EXPECT_EQ(exit_code(std::runtime_error("x")), 1);
}

}  // namespace
}  // namespace ember
