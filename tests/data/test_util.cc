#include "test_util.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sys/wait.h>

namespace ember::test {
namespace fs = std::filesystem;

void TempDirTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = fs::temp_directory_path() /
         ("ember-test-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
  fs::remove_all(dir_);
  fs::create_directories(dir_);
}

void TempDirTest::TearDown() { fs::remove_all(dir_); }

fs::path TempDirTest::write(const std::string& name, const std::string& content) const {
  fs::path p = dir_ / name;
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

fs::path real_sample(const std::string& name) {
  fs::path p = fs::path(EMBER_SHARED_DIR) / "data" / "real" / name;
  return fs::exists(p) ? p : fs::path();
}

int run_command(const std::string& cmd, std::string& output) {
  output.clear();
  std::FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) output.append(buf.data(), n);
  int status = ::pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string bin(const std::string& name) { return std::string(EMBER_BIN_DIR) + "/" + name; }

std::string criteo_line(int seed, int label) {
  std::string s = std::to_string(label);
  for (int i = 0; i < 13; ++i) s += "\t" + std::to_string((seed * 7 + i) % 50);
  char hex[16];
  for (int i = 0; i < 26; ++i) {
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>((seed % (i + 3)) * 2654435761u + static_cast<unsigned>(i)));
    s += "\t";
    s += hex;
  }
  return s;
}

}  // namespace ember::test
