// The Prometheus endpoints: the Exporter alone (formats promtool accepts, a port in use
// refused by flag), then a real job (ember-ps + 2 ember-worker over loopback) scraped
// directly and by a real Prometheus server, whose HTTP API reads a counter back.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/monitor/exporter.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The body of GET http://127.0.0.1:port/path ("" when the server does not answer 200).
std::string http_get(std::uint16_t port, const std::string& path) {
  const int fd = test::connect_loopback(port);
  if (fd < 0) return "";
  const timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string resp;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.1 200", 0) != 0 && resp.rfind("HTTP/1.0 200", 0) != 0) return "";
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// A port nothing listens on now (bound and released).
// A port free now, below the kernel's ephemeral range (32768 and up by default): the
// daemons' own listeners bind port 0 and would otherwise be handed it before the metrics
// server takes it.
std::uint16_t free_port() {
  static std::mt19937 rng(static_cast<std::uint32_t>(::getpid()));
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<std::uint16_t>(20000 + rng() % 12000);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return port;
  }
  return 0;
}

bool have(const std::string& program) {
  std::string out;
  return test::run_command("command -v " + program, out) == 0;
}

// promtool's verdict on a scrape: "" when it passes, else what it says.
std::string promtool_check(const fs::path& dir, const std::string& text) {
  const fs::path f = dir / "scrape.prom";
  std::ofstream(f) << text;
  std::string out;
  return test::run_command("promtool check metrics < " + f.string(), out) == 0 ? "" : out + "\n" + text;
}

// The value of the sample whose line starts with `series` (name{labels}), or -1.
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

class Prometheus : public test::TempDirTest {};

TEST_F(Prometheus, ExporterServesWhatPromtoolAccepts) {
  if (!monitor::available()) GTEST_SKIP() << "built without prometheus-cpp (prometheus-cpp-dev)";
  monitor::Exporter ex("127.0.0.1", 0);
  ASSERT_GT(ex.port(), 0);
  EXPECT_EQ(ex.url(), "http://127.0.0.1:" + std::to_string(ex.port()) + "/metrics");
  std::atomic<int> scrapes{0};
  ex.on_scrape([&scrapes](monitor::Sink& out) {
    ++scrapes;
    out.counter("ember_test_rows_total", "Rows", {{"kind", "pull"}}, 5);
    out.counter("ember_test_rows_total", "Rows", {{"kind", "push"}}, 7);
    out.gauge("ember_test_connections", "Open", {}, 2);
    out.gauge("ember test bad name", "skipped, not served", {}, 1);
    out.gauge("ember_test_rows_total", "the same name as a counter: skipped", {{"kind", "x"}}, 1);
  });
  ex.on_scrape([](monitor::Sink&) { throw std::runtime_error("a failing source"); });
  auto h = ex.histogram("ember_test_seconds", "Seconds", monitor::Exporter::exponential_buckets(0.001, 2, 4));
  h.observe(0.003);
  h.observe(1.0);
  const std::string text = http_get(ex.port(), "/metrics");
  EXPECT_EQ(scrapes.load(), 1);
  EXPECT_EQ(sample(text, "ember_test_rows_total{kind=\"pull\"}"), 5) << text;
  EXPECT_EQ(sample(text, "ember_test_rows_total{kind=\"push\"}"), 7) << text;
  EXPECT_EQ(sample(text, "ember_test_rows_total{kind=\"x\"}"), -1) << text;
  EXPECT_EQ(sample(text, "ember_test_connections"), 2) << text;
  EXPECT_EQ(sample(text, "ember_test_seconds_bucket{le=\"0.004\"}"), 1) << text;
  EXPECT_EQ(sample(text, "ember_test_seconds_count"), 2) << text;
  EXPECT_EQ(text.find("bad name"), std::string::npos) << text;
  if (have("promtool")) {
    EXPECT_EQ(promtool_check(dir_, text), "");
  }
}

TEST_F(Prometheus, APortInUseIsRefusedNamingTheFlag) {
  if (!monitor::available()) GTEST_SKIP() << "built without prometheus-cpp (prometheus-cpp-dev)";
  monitor::Exporter first("127.0.0.1", 0);
  try {
    monitor::Exporter second("127.0.0.1", first.port());
    FAIL() << "a second endpoint on port " << first.port();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-port " + std::to_string(first.port())), std::string::npos) << e.what();
  }
  // The daemons exit 2 with that line.
  std::string out;
  const std::string cmd = test::bin("ember-ps") + " --num-keys 100 --token t --metrics-address 127.0.0.1 --metrics-port " +
                          std::to_string(first.port()) + " 2>&1";
  EXPECT_EQ(test::run_command(cmd, out), 2) << out;
  EXPECT_NE(out.find("--metrics-port " + std::to_string(first.port())), std::string::npos) << out;
}

// A job's three endpoints pass promtool and count what the job does; a real Prometheus
// server scraping them answers a query for a counter with the value it scraped.
TEST_F(Prometheus, PrometheusScrapesARunningJob) {
  if (!monitor::available()) GTEST_SKIP() << "built without prometheus-cpp (prometheus-cpp-dev)";
  const fs::path tsv = dir_ / "data.tsv", data = dir_ / "data";
  std::string log;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 20000 --scale 0.0005 --seed 3 --force -o " +
                                  tsv.string() + " && " + test::bin("ember-data") + " prep --format criteo --val-fraction 0.1 --force -o " +
                                  data.string() + " " + tsv.string(),
                              log),
            0)
      << log;
  const fs::path token = dir_ / "token";
  std::ofstream(token) << "metrics-test-token";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  const std::uint16_t ps_port = free_port(), w0 = free_port(), w1 = free_port();
  test::Process ps({test::bin("ember-ps"), "--dataset", data.string(), "--token-file", token.string(), "--coordinator", "tcp://127.0.0.1:0",
                    "--coordinator-file", (dir_ / "coord").string(), "--workers", "2", "--stats-interval", "0", "--metrics-port",
                    std::to_string(ps_port)},
                   dir_ / "ps.log");
  const std::string coord = test::wait_for_file(dir_ / "coord", 30s);
  ASSERT_FALSE(coord.empty()) << ps.log_tail(20);
  // Worker 0 as a restarted job's launcher starts it (ember_job.py restart-record): two
  // restarts, 7 iterations recomputed, the last loss 5 s ago.
  const fs::path record = dir_ / "restart-record.json";
  const double lost_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - 5;
  std::ofstream(record) << "{\"restarts\": 2, \"iterations_recomputed\": 7, \"lost_at\": " << std::fixed << lost_at << "}\n";
  std::vector<std::unique_ptr<test::Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = test::worker_command(data, coord, {"--token-file", token.string()}, 2, r);
    args.insert(args.end(), {"--iterations", "1000000", "--model", "dlrm", "--bottom-mlp", "16", "--top-mlp", "16", "--batch-per-worker",
                             "64", "--progress-every", "0", "--metrics-port", std::to_string(r == 0 ? w0 : w1)});
    if (r == 0) args.insert(args.end(), {"--restart-record", record.string()});
    workers.push_back(std::make_unique<test::Process>(args, dir_ / ("w" + std::to_string(r) + ".log")));
  }

  // Training runs once worker 0 counts iterations.
  std::string w0_text;
  for (int i = 0; i < 300 && sample(w0_text, "ember_worker_iterations_total{rank=\"0\"}") < 20; ++i) {
    std::this_thread::sleep_for(100ms);
    w0_text = http_get(w0, "/metrics");
  }
  ASSERT_GE(sample(w0_text, "ember_worker_iterations_total{rank=\"0\"}"), 20) << workers[0]->log_tail(20);
  for (std::uint16_t port : {ps_port, w0, w1}) {
    const std::string text = http_get(port, "/metrics");
    ASSERT_FALSE(text.empty()) << "port " << port;
    if (have("promtool")) {
      EXPECT_EQ(promtool_check(dir_, text), "") << "port " << port;
    }
  }
  const std::string ps_text = http_get(ps_port, "/metrics");
  EXPECT_GT(sample(ps_text, "ember_ps_rows_pulled_total{shard=\"0\",kind=\"pull_state\"}") +
                sample(ps_text, "ember_ps_rows_pulled_total{shard=\"0\",kind=\"pull\"}"),
            0)
      << ps_text;
  EXPECT_GT(sample(ps_text, "ember_ps_rows_pushed_total{shard=\"0\",kind=\"grad\"}"), 0) << ps_text;
  EXPECT_EQ(sample(ps_text, "ember_ps_connections{shard=\"0\"}"), 2) << ps_text;
  EXPECT_EQ(sample(ps_text, "ember_control_members_alive"), 3) << ps_text;
  EXPECT_GT(sample(ps_text, "ember_ps_rows_stored{shard=\"0\"}"), 0) << ps_text;
  w0_text = http_get(w0, "/metrics");
  EXPECT_GT(sample(w0_text, "ember_worker_rows_total{rank=\"0\",kind=\"pull\",direction=\"in\"}"), 0) << w0_text;
  EXPECT_GT(sample(w0_text, "ember_worker_sent_bytes_total{rank=\"0\",kind=\"commit\"}"), 0) << w0_text;
  EXPECT_GT(sample(w0_text, "ember_worker_phase_seconds_total{rank=\"0\",phase=\"compute\"}"), 0) << w0_text;
  EXPECT_EQ(sample(w0_text, "ember_worker_job_restarts{rank=\"0\"}"), 2) << w0_text;
  EXPECT_EQ(sample(w0_text, "ember_worker_job_iterations_recomputed{rank=\"0\"}"), 7) << w0_text;
  const double recovery = sample(w0_text, "ember_worker_job_recovery_seconds{rank=\"0\"}");
  EXPECT_TRUE(recovery >= 5 && recovery < 120) << "from the loss 5 s before the start to the first iteration: " << recovery;
  EXPECT_EQ(sample(http_get(w1, "/metrics"), "ember_worker_job_restarts{rank=\"1\"}"), -1) << "worker 1 has no record: none served";
  const double ratio = sample(w0_text, "ember_worker_cache_hit_ratio{rank=\"0\"}");
  EXPECT_TRUE(ratio >= 0 && ratio <= 1) << w0_text;

  if (!have("prometheus")) {
    GTEST_SKIP() << "no prometheus binary (Debian's prometheus package): the endpoints were checked, not a server's scrape";
  }
  const std::uint16_t prom_port = free_port();
  const fs::path config = dir_ / "prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\nscrape_configs:\n  - job_name: ember\n"
                        << "    static_configs:\n      - targets: ['127.0.0.1:" << ps_port << "', '127.0.0.1:" << w0
                        << "', '127.0.0.1:" << w1 << "']\n";
  test::Process prom({"/usr/bin/env", "prometheus", "--config.file=" + config.string(), "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
                      "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                     dir_ / "prometheus.log");
  // Prometheus's own word for the PS counter, once it has scraped it non-zero.
  const std::string query = "/api/v1/query?query=ember_ps_rows_pushed_total%7Bkind%3D%22grad%22%7D";
  std::regex value_re(R"re("value":\[[0-9.]+,"([0-9.e+]+)"\])re");
  double seen = 0;
  for (int i = 0; i < 300 && seen <= 0; ++i) {
    std::this_thread::sleep_for(100ms);
    const std::string body = http_get(prom_port, query);
    std::smatch m;
    if (std::regex_search(body, m, value_re)) seen = std::stod(m[1]);
  }
  EXPECT_GT(seen, 0) << prom.log_tail(20);
  // It is a value the endpoint served: not above what the shard says now.
  const double now = sample(http_get(ps_port, "/metrics"), "ember_ps_rows_pushed_total{shard=\"0\",kind=\"grad\"}");
  EXPECT_LE(seen, now);
  // Every target is up (each scraped once its first interval came round).
  std::string up;
  for (int i = 0; i < 300 && up.find("\"3\"]") == std::string::npos; ++i) {
    std::this_thread::sleep_for(100ms);
    up = http_get(prom_port, "/api/v1/query?query=sum(up)");
  }
  EXPECT_NE(up.find("\"3\"]"), std::string::npos) << up;

  prom.signal(SIGTERM);
  EXPECT_EQ(prom.wait(30s), 0) << prom.log_tail(10);
  for (auto& w : workers) w->signal(SIGTERM);
  for (auto& w : workers) EXPECT_NE(w->wait(30s), -2);
  ps.signal(SIGTERM);
  EXPECT_NE(ps.wait(30s), -2);
}

}  // namespace
}  // namespace ember
