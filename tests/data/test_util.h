// Helpers shared by the data tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace ember::test {

// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::filesystem::path write(const std::string& name, const std::string& content) const;
  std::filesystem::path dir_;
};

// ../shared/data/real/<name>, or empty when the shared samples are absent.
std::filesystem::path real_sample(const std::string& name);

// Runs a shell command; returns its exit status and combined stdout+stderr.
int run_command(const std::string& cmd, std::string& output);

// Path of a binary built by this project.
std::string bin(const std::string& name);

// A valid Criteo TSV line: label, 13 integers, 26 hex ids derived from `seed`.
std::string criteo_line(int seed, int label = 0);

}  // namespace ember::test
