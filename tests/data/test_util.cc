#include "test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace ember::test {
namespace fs = std::filesystem;

int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void TempDirTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = fs::temp_directory_path() / ("ember-test-" + std::to_string(::getpid()) + "-" + info->test_suite_name() + "-" + info->name());
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

std::vector<std::string> ps_command(const PsShard& s) {
  return {bin("ember-ps"),
          "--dataset",
          s.data.string(),
          "--shard",
          std::to_string(s.shard),
          "--shards",
          std::to_string(s.shards),
          "--dim",
          std::to_string(s.dim),
          "--optimizer",
          s.optimizer,
          "--lr",
          "0.05",
          "--seed",
          std::to_string(s.seed),
          "--token",
          s.token,
          "--workers",
          std::to_string(s.workers),
          "--coordinator",
          s.shard == 0 ? "tcp://127.0.0.1:0" : s.coordinator,
          "--coordinator-file",
          s.coord_file.string(),
          "--stats-interval",
          "0",
          "--heartbeat-timeout-ms",
          "3000",
          "--log-level",
          s.log_level};
}

std::vector<std::string> worker_command(const std::filesystem::path& data, const std::string& coordinator,
                                        const std::pair<std::string, std::string>& token, std::uint32_t workers, int rank) {
  std::vector<std::string> a = {bin("ember-worker"), "--dataset",  data.string(), "--coordinator",        coordinator,
                                token.first,         token.second, "--workers",   std::to_string(workers)};
  if (rank >= 0) a.insert(a.end(), {"--rank", std::to_string(rank)});
  return a;
}

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

Process::Process(std::vector<std::string> args, const fs::path& log) : log_(log) {
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
}

Process::~Process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

bool Process::running() {
  if (pid_ <= 0) return false;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int Process::wait(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

void Process::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::string Process::log_tail(std::size_t lines) const {
  std::ifstream in(log_);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::ostringstream out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out << all[i] << "\n";
  return out.str();
}

TmpfsMount::TmpfsMount(const fs::path& dir, std::uint64_t bytes) : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  // size=0 would mean no limit.
  const std::string opts = "size=" + std::to_string(bytes > 0 ? bytes : 1) + ",mode=0755";
  if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) == 0) {
    mounted_ = true;
  } else {
    error_ = "mount -t tmpfs " + dir_.string() + ": " + std::strerror(errno);
  }
}

TmpfsMount::~TmpfsMount() {
  if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
}

std::string wait_for_file(const fs::path& file, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(file);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

}  // namespace ember::test
