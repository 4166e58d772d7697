// Helpers shared by the data tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
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

// The start of an ember-worker command line that joins a job: the binary, --dataset,
// --coordinator, the job's token (`token`: a flag and its value, "--token" or
// "--token-file"), --workers and, with rank >= 0, --rank (else assigned at join). Tests
// append the rest.
std::vector<std::string> worker_command(const std::filesystem::path& data, const std::string& coordinator,
                                        const std::pair<std::string, std::string>& token, std::uint32_t workers, int rank);

// An ember-ps shard of a job formed on loopback: shard 0 hosts the coordinator (on any
// free port, its endpoint written to `coord_file`), the others join `coordinator`.
struct PsShard {
  std::filesystem::path data;
  std::uint32_t shard = 0, shards = 1, dim = 8, workers = 1;
  std::string optimizer = "sgd", token, coordinator;
  std::uint64_t seed = 1;
  std::filesystem::path coord_file;
  std::string log_level = "warn";
};
// Its command line (SGD or `optimizer` at lr 0.05, no stats lines, a 3 s heartbeat
// timeout); tests append the rest.
std::vector<std::string> ps_command(const PsShard& s);

// A TCP socket connected to 127.0.0.1:port (the caller closes it), or -1.
int connect_loopback(std::uint16_t port);

// A valid Criteo TSV line: label, 13 integers, 26 hex ids derived from `seed`.
std::string criteo_line(int seed, int label = 0);

// A child process (argv[0] is a path), stdout and stderr appended to `log`; killed with
// SIGKILL if still running when destroyed, so a failing test never leaves it behind.
class Process {
 public:
  Process(std::vector<std::string> args, const std::filesystem::path& log);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Exit status; -1 when killed by a signal; on timeout the process is killed and -2
  // returned.
  int wait(std::chrono::milliseconds timeout);
  void signal(int sig);
  bool running();
  std::string log_tail(std::size_t lines) const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  std::filesystem::path log_;
};

// A tmpfs of `bytes` (whole pages) mounted on `dir` (created) while this lives: a small
// disk to fill. Unmounted (lazily, MNT_DETACH) when destroyed. Where mounting is not
// permitted (not root), ok() is false and error() says why: the caller skips.
class TmpfsMount {
 public:
  TmpfsMount(const std::filesystem::path& dir, std::uint64_t bytes);
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool ok() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// Waits until `file` exists and is non-empty; returns its first line ("" on timeout).
std::string wait_for_file(const std::filesystem::path& file, std::chrono::milliseconds timeout);

}  // namespace ember::test
