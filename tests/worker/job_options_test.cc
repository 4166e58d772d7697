// Workers of one job that disagree on an option that must agree (worker/src/job_options.h)
// are refused within 2 s of the job forming, naming the option by its flag and both
// values; the comparison itself is tested without processes. The jobs are real: one
// ember-ps shard and two ember-worker processes on loopback, killed if still running
// when a test ends.
#include "job/job_options.h"

#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/transport/job_connection_options.h"
#include "ember/worker/worker_options.h"

namespace ember::worker {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// ---- The comparison (no processes) ----

TrainConfig base_config() {
  TrainConfig c;
  c.model.kind = "dlrm";
  c.model.bottom = {16};
  c.model.top = {16};
  c.model.deep = {16};
  return c;
}

const std::string kDataset = "7200 training rows, 13 dense features, 26 tables of 1000 rows, contents 0123456789abcdef";

std::string differ(const TrainConfig& mine, const TrainConfig& job) {
  return compare_options(agreed_options(mine, kDataset), agreed_options(job, kDataset));
}

TEST(WorkerOptionsCompare, PerWorkerSettingsMayDiffer) {
  const TrainConfig job = base_config();
  TrainConfig c = job;
  c.dataset = "/elsewhere/data";  // the path: the identity is the same
  c.device = "cuda:1";
  c.cache_backend = "tensor";
  c.threads = 4;  // --sched-threads
  c.torch_threads = 8;
  c.overlap_allreduce = true;
  c.dump_dir = "/tmp/dump";
  c.checkpoint_dir = "/tmp/dense";
  c.keep_checkpoints = 9;
  c.progress_every = 1;
  c.metrics_file = "/tmp/m.jsonl";
  c.rank = 3;
  c.gloo_host = "10.0.0.2";
  c.ps_connections = 4;
  c.socket_buffer_kib = 512;
  c.rdma_slot_mib = 8;
  c.timeout = 1s;
  c.heartbeat_timeout = 2s;
  c.join_timeout = 3s;
  c.eviction = "lru";       // what auto is without lookahead
  c.model.deep = {64, 32};  // dlrm builds no deep MLP
  c.model.cross_layers = 7;
  EXPECT_EQ(differ(c, job), "");
}

TEST(WorkerOptionsCompare, NamesEachOptionByItsFlagWithBothValues) {
  struct Case {
    std::function<void(TrainConfig&)> change;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](TrainConfig& c) { c.model.kind = "wide-deep"; },
       "--model wide-deep, the job has dlrm; --bottom-mlp unused, the job has 16; --top-mlp unused, the job has 16; --deep-mlp 16, the "
       "job has unused"},
      {[](TrainConfig& c) {
         c.model.bottom = {32, 16};
       },
       "--bottom-mlp 32-16, the job has 16"},
      {[](TrainConfig& c) { c.model.top = {}; }, "--top-mlp none, the job has 16"},
      {[](TrainConfig& c) { c.dense_optimizer = "adagrad"; }, "--dense-optimizer adagrad, the job has sgd"},
      {[](TrainConfig& c) { c.dense_lr = 0.1f; }, "--dense-lr 0.1, the job has 0.01"},
      {[](TrainConfig& c) { c.policy = "vanilla"; }, "--policy vanilla, the job has herald"},
      {[](TrainConfig& c) { c.cache_ratio = 0.25; }, "--cache-ratio 0.25, the job has 0.1"},
      {[](TrainConfig& c) { c.lookahead = 2; }, "--lookahead 2, the job has 0; --eviction lookahead, the job has lru"},
      {[](TrainConfig& c) { c.eviction = "lookahead"; }, "--eviction lookahead, the job has lru"},
      {[](TrainConfig& c) { c.prefetch = true; }, "--prefetch on, the job has off"},
      // Every worker's scheduler flushes the evaluated samples' rows before an evaluation.
      {[](TrainConfig& c) { c.eval_samples = 100; }, "--eval-samples 100, the job has 0"},
      {[](TrainConfig& c) { c.refine_allocation = true; }, "--refine-allocation on, the job has off"},
      {[](TrainConfig& c) { c.batch_per_worker = 64; }, "--batch-per-worker 64, the job has 128"},
      {[](TrainConfig& c) { c.iterations = 200; }, "--iterations 200, the job has 100"},
      {[](TrainConfig& c) { c.seed = 2; }, "--seed 2, the job has 1"},
      {[](TrainConfig& c) { c.shuffle = true; }, "--shuffle on, the job has off"},
      {[](TrainConfig& c) { c.eval_every = 10; }, "--eval-every 10, the job has 0"},
      {[](TrainConfig& c) { c.resume = true; }, "--resume on, the job has off"},
  };
  for (const Case& k : cases) {
    TrainConfig c = base_config();
    k.change(c);
    EXPECT_EQ(differ(c, base_config()), k.expected);
  }
  // dcn's own options count for dcn workers.
  TrainConfig a = base_config(), b = base_config();
  a.model.kind = b.model.kind = "dcn";
  a.model.cross_layers = 2;
  EXPECT_EQ(differ(a, b), "--cross-layers 2, the job has 3");
  // Every difference, in the table's order.
  TrainConfig c = base_config();
  c.seed = 5;
  c.dense_lr = 0.5f;
  EXPECT_EQ(differ(c, base_config()), "--dense-lr 0.5, the job has 0.01; --seed 5, the job has 1");
  // Another dataset.
  EXPECT_EQ(compare_options(agreed_options(base_config(), "other"), agreed_options(base_config(), kDataset)),
            "--dataset other, the job has " + kDataset);
}

TEST(WorkerOptionsCompare, EveryOptionIsDeclaredOnceAndRegistered) {
  // ember-worker's command line is the registry's: every option that must agree is a flag
  // of it, each declared once.
  TrainConfig c = base_config();
  CLI::App app;
  add_worker_options(app, c);
  const OptionValues v = agreed_options(base_config(), kDataset);
  EXPECT_GE(v.size(), 20u);
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_NE(app.get_option_no_throw(v[i].first), nullptr) << v[i].first << " is no flag of ember-worker";
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(v[i].first, v[j].first);
  }
  std::set<std::string> flags;
  for (const auto& d : worker_options()) EXPECT_TRUE(flags.insert(d.flag).second) << d.flag << " declared twice";
  // A command line sets the fields the registry binds, parsed as ember-worker parses.
  const char* argv[] = {
      "ember-worker",         "--dataset",    "d", "--lookahead", "3", "--bottom-mlp", "8-4", "--heartbeat-timeout-ms", "250",
      "--scheduler-per-host", "--eval-every", "9"};
  app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv));
  EXPECT_EQ(c.dataset, "d");
  EXPECT_EQ(c.lookahead, 3u);
  EXPECT_EQ(c.model.bottom, (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(c.heartbeat_timeout, std::chrono::milliseconds(250));
  EXPECT_TRUE(c.scheduler_per_host);
  EXPECT_EQ(c.eval_every, 9u);
  // A layer list that is not one fails the parse, naming the flag.
  TrainConfig d;
  CLI::App bad;
  add_worker_options(bad, d);
  const char* wrong[] = {"ember-worker", "--dataset", "d", "--top-mlp", "8-x"};
  try {
    bad.parse(static_cast<int>(std::size(wrong)), const_cast<char**>(wrong));
    ADD_FAILURE() << "8-x parsed";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("--top-mlp '8-x'"), std::string::npos) << e.what();
  }
}

TEST(WorkerOptionsCompare, TheJobConnectionsFlagsAreDeclaredOnceForBothDaemons) {
  // ember-worker takes the job connection's flags from the declarations ember-ps takes
  // them from (transport/job_connection_options.h), and none must agree among workers.
  std::set<std::string> flags;
  for (const auto& d : worker_options()) flags.insert(d.flag);
  for (const auto& d : transport::job_connection_options()) {
    EXPECT_EQ(flags.count(d.flag), 1u) << d.flag << " is no flag of ember-worker";
    EXPECT_NE(d.programs & kPsProgram, 0u) << d.flag << " is no flag of ember-ps";
    EXPECT_FALSE(d.agreed) << d.flag;
  }
  TrainConfig c = base_config();
  CLI::App app;
  add_worker_options(app, c);
  const char* argv[] = {"ember-worker", "--dataset",   "d",    "--token-file",    "t", "--host",
                        "h1",           "--transport", "rdma", "--rdma-slot-mib", "8"};
  app.parse(static_cast<int>(std::size(argv)), const_cast<char**>(argv));
  EXPECT_EQ(c.token_file, "t");
  EXPECT_EQ(c.host, "h1");
  EXPECT_EQ(c.transport, "rdma");
  EXPECT_EQ(c.rdma_slot_mib, 8u);
  // The data plane's name is checked as it is parsed, on both daemons.
  TrainConfig d = base_config();
  CLI::App bad;
  add_worker_options(bad, d);
  const char* wrong[] = {"ember-worker", "--dataset", "d", "--transport", "udp"};
  EXPECT_THROW(bad.parse(static_cast<int>(std::size(wrong)), const_cast<char**>(wrong)), CLI::ValidationError);
}

TEST(WorkerOptionsCompare, OptionsJsonListsTheLaunchersSettings) {
  // What scripts/ember_job.py reads: the job settings with their kinds and defaults.
  const auto j = nlohmann::json::parse(worker_options_json(TrainConfig{}));
  std::map<std::string, nlohmann::json> settings;
  for (const auto& o : j) {
    if (o.at("setting").get<bool>()) settings[o.at("flag")] = o;
  }
  ASSERT_EQ(settings.size(), 14u);
  EXPECT_EQ(settings.at("--cache-admission").at("default"), "none");
  EXPECT_EQ(settings.at("--policy").at("default"), "herald");
  EXPECT_EQ(settings.at("--lookahead").at("kind"), "integer");
  EXPECT_EQ(settings.at("--eviction").at("default"), "auto");  // as written, not as resolved
  EXPECT_EQ(settings.at("--prefetch").at("kind"), "flag");
  EXPECT_EQ(settings.at("--prefetch").at("default"), "off");
  EXPECT_EQ(settings.at("--placement").at("default"), "");
  for (const char* f : {"--refine-allocation", "--overlap-allreduce", "--model-file"}) EXPECT_EQ(settings.count(f), 1u) << f;
  EXPECT_EQ(settings.at("--progressive-window").at("default"), "0");
  // Dynamic tables' decisions: every worker takes the same.
  EXPECT_EQ(settings.at("--create-after").at("default"), "1");
  EXPECT_EQ(settings.at("--expire-after").at("kind"), "integer");
  for (const char* f : {"--create-filter-mb", "--shard-max-rows"}) EXPECT_EQ(settings.count(f), 1u) << f;
}

TEST(WorkerOptionsCompare, TravelsAsJsonAndNamesFlagsOnlyOneSideKnows) {
  const OptionValues v = agreed_options(base_config(), kDataset);
  EXPECT_EQ(options_from_json(options_to_json(v)), v);
  EXPECT_THROW(options_from_json("{\"not\": \"a list\"}"), ProtocolError);
  EXPECT_THROW(options_from_json("[[\"--seed\"]]"), ProtocolError);
  EXPECT_THROW(options_from_json("not json"), ProtocolError);
  OptionValues older = v, newer = v;
  older.pop_back();
  newer.emplace_back("--future", "x");
  EXPECT_NE(compare_options(v, older).find(v.back().first + " " + v.back().second + ", the job does not say"), std::string::npos);
  EXPECT_NE(compare_options(v, newer).find("--future: the job has x"), std::string::npos);
}

class WorkerOptionsFiles : public test::TempDirTest {};

TEST_F(WorkerOptionsFiles, ModelFilesAgreeByTheirContents) {
  TrainConfig f = base_config(), g = base_config();
  f.model.file = (dir_ / "a.pt").string();
  g.model.file = (dir_ / "b.pt").string();
  write_file_atomic(f.model.file, "abc");
  write_file_atomic(g.model.file, "abc");
  EXPECT_EQ(differ(f, g), "");
  write_file_atomic(g.model.file, "abcd");
  EXPECT_NE(differ(f, g).find("--model-file a TorchScript file of 3 bytes, contents "), std::string::npos) << differ(f, g);
  EXPECT_NE(differ(f, g).find("the job has a TorchScript file of 4 bytes"), std::string::npos) << differ(f, g);
}

TEST_F(WorkerOptionsFiles, PlacementComparedByContentsNotPath) {
  TrainConfig a = base_config(), b = base_config(), c = base_config();
  a.placement = write("a.json", "{\"plan\": 1}").string();
  b.placement = write("b.json", "{\"plan\": 1}").string();
  c.placement = write("c.json", "{\"plan\": 2}").string();
  EXPECT_EQ(differ(a, b), "");
  const std::string d = differ(c, a);
  EXPECT_EQ(d.rfind("--placement a plan of 11 bytes, contents ", 0), 0u) << d;
  EXPECT_NE(d.find(", the job has a plan of 11 bytes, contents "), std::string::npos) << d;
  EXPECT_NE(differ(base_config(), a).find("--placement none, the job has a plan"), std::string::npos);
  c.placement = (dir_ / "absent.json").string();
  EXPECT_THROW(agreed_options(c, kDataset), IoError);
}

TEST(WorkerOptionsCompare, DatasetIdentityIsItsContentsNotItsPath) {
  data::Manifest m;
  m.rows[0] = 100;
  m.dense_names = {"d0"};
  m.tables = {data::TableInfo{"t0", 50, 4, 0}, data::TableInfo{"t1", 70, 4, 0}};
  m.shards[0] = {data::ShardInfo{"train-0.bin", 100, 4096, 0x1234}};
  const std::string id = dataset_identity(m);
  EXPECT_EQ(id.rfind("100 training rows, 1 dense features, 2 tables of 120 rows, contents ", 0), 0u) << id;
  data::Manifest other = m;
  other.shards[0][0].file = "elsewhere.bin";
  EXPECT_EQ(dataset_identity(other), id);
  other.shards[0][0].checksum = 0x1235;
  EXPECT_NE(dataset_identity(other), id);
  other = m;
  other.tables[0].rows = 51;
  other.tables[1].rows = 69;  // the same total, other tables
  EXPECT_NE(dataset_identity(other), id);
}

// ---- Real jobs ----

const std::string kToken = "options-token";

// Milliseconds since local midnight of a log line's "[HH:MM:SS.mmm]" (spdlog's pattern,
// common/src/log.cc), or -1.
long long log_millis(const std::string& line) {
  static const std::regex re(R"(^\[(\d\d):(\d\d):(\d\d)\.(\d\d\d)\])");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return -1;
  return ((std::stoll(m[1]) * 60 + std::stoll(m[2])) * 60 + std::stoll(m[3])) * 1000 + std::stoll(m[4]);
}

// The same clock as the logs' (local time of day, ms), now.
long long now_millis() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return ((tm.tm_hour * 60LL + tm.tm_min) * 60 + tm.tm_sec) * 1000 + ms;
}

// b - a on a clock of the time of day (a job that spans midnight).
long long since(long long a, long long b) {
  long long d = b - a;
  if (d < -12LL * 3600 * 1000) d += 24LL * 3600 * 1000;
  return d;
}

struct Outcome {
  int ps = 0;
  std::vector<int> workers;
  std::string ps_log;
  std::vector<std::string> logs;
  long long formed_to_failed_ms = -1;     // the shard's log: job formed -> job failed
  std::vector<long long> formed_to_exit;  // per worker: job formed -> the process ended
  double start_to_end_s = 0;              // workers started -> every process ended
};

class WorkerOptionsJob : public test::TempDirTest {
 protected:
  // One small dataset for every job of the suite.
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("ember-options-" + std::to_string(::getpid())));
    fs::create_directories(*root_);
    const fs::path tsv = *root_ / "data.tsv";
    std::string log;
    const int rc =
        test::run_command(test::bin("ember-data") + " gen --like criteo --rows 3000 --scale 0.0005 --seed 7 --force -o " + tsv.string() +
                              " && " + test::bin("ember-data") + " prep --format criteo --val-fraction 0.1 --force -o " +
                              (*root_ / "data").string() + " " + tsv.string() + " 2>&1",
                          log);
    if (rc != 0) ADD_FAILURE() << log;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
    root_ = nullptr;
  }

  // Worker w's arguments: the job's (a small dlrm, herald), then extra[w]'s (the last
  // value of an option counts). rank < 0: assigned at join.
  std::vector<std::string> worker_args(const std::string& coord, int w, bool ranks, const std::vector<std::string>& extra) {
    std::vector<std::string> a = test::worker_command(*root_ / "data", coord, {"--token", kToken}, 2, ranks ? w : -1);
    a.insert(a.end(), {"--policy",
                       "herald",
                       "--model",
                       "dlrm",
                       "--bottom-mlp",
                       "16",
                       "--top-mlp",
                       "16",
                       "--deep-mlp",
                       "16",
                       "--batch-per-worker",
                       "32",
                       "--cache-ratio",
                       "0.15",
                       "--iterations",
                       "5",
                       "--seed",
                       "3",
                       "--dense-lr",
                       "0.01",
                       "--heartbeat-timeout-ms",
                       "3000",
                       "--log-level",
                       "info"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // Runs a job of two workers, worker w with extra[w] on top of the job's options.
  Outcome run_job(const std::string& name, const std::vector<std::vector<std::string>>& extra, bool ranks = true) {
    Outcome r;
    const fs::path coord_file = dir_ / (name + ".coord");
    const fs::path ps_log = dir_ / (name + "-ps.log");
    test::Process ps(
        test::ps_command(
            {.data = *root_ / "data", .workers = 2, .token = kToken, .seed = 3, .coord_file = coord_file, .log_level = "info"}),
        ps_log);
    const std::string coord = test::wait_for_file(coord_file, 30s);
    if (coord.empty()) {
      ADD_FAILURE() << "ember-ps did not start:\n" << ps.log_tail(20);
      return r;
    }
    std::vector<std::unique_ptr<test::Process>> workers;
    const auto start = std::chrono::steady_clock::now();
    for (int w = 0; w < 2; ++w)
      workers.push_back(std::make_unique<test::Process>(worker_args(coord, w, ranks, extra[static_cast<std::size_t>(w)]),
                                                        dir_ / (name + "-w" + std::to_string(w) + ".log")));
    // Every process ends, and when: the workers' ends on the logs' clock.
    std::vector<long long> ended(2, -1);
    const auto deadline = start + 60s;
    for (bool any = true; any && std::chrono::steady_clock::now() < deadline;) {
      any = false;
      for (int w = 0; w < 2; ++w) {
        if (ended[static_cast<std::size_t>(w)] >= 0) continue;
        if (workers[static_cast<std::size_t>(w)]->running())
          any = true;
        else
          ended[static_cast<std::size_t>(w)] = now_millis();
      }
      if (any) std::this_thread::sleep_for(5ms);
    }
    for (auto& w : workers) r.workers.push_back(w->wait(1s));  // -2: killed at the deadline
    r.ps = ps.wait(30s);
    r.start_to_end_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.ps_log = read_file(ps_log);
    for (int w = 0; w < 2; ++w) r.logs.push_back(read_file(dir_ / (name + "-w" + std::to_string(w) + ".log")));
    long long formed = -1, failed = -1;
    std::istringstream in(r.ps_log);
    for (std::string line; std::getline(in, line);) {
      if (formed < 0 && line.find("control: job formed") != std::string::npos) formed = log_millis(line);
      if (failed < 0 && line.find("control: job failed") != std::string::npos) {
        failed = log_millis(line);
        std::printf("[ job %s ] %s\n", name.c_str(), line.c_str());
      }
    }
    if (formed >= 0 && failed >= 0) r.formed_to_failed_ms = since(formed, failed);
    for (long long e : ended) r.formed_to_exit.push_back(formed >= 0 && e >= 0 ? since(formed, e) : -1);
    std::printf("[ job %s ] formed -> failed %lld ms; formed -> worker exits %lld ms, %lld ms (rc %d, %d); start -> end %.2f s\n",
                name.c_str(), r.formed_to_failed_ms, r.formed_to_exit[0], r.formed_to_exit[1], r.workers[0], r.workers[1],
                r.start_to_end_s);
    return r;
  }

  // The worker process `bad` (started with options the job's worker 0 does not have; it
  // is worker 1 of the job) is refused within 2 s of the job forming, naming every line
  // of `named`; the shard fails naming it; the other worker ends too, neither hangs.
  void expect_refused(const Outcome& r, int bad, const std::vector<std::string>& named) {
    ASSERT_EQ(r.workers.size(), 2u);
    const auto b = static_cast<std::size_t>(bad), other = 1 - b;
    EXPECT_EQ(r.workers[b], 2) << "a ConfigError\n" << r.logs[b];
    for (const std::string& n : named) {
      EXPECT_NE(r.logs[b].find(n), std::string::npos) << n << "\n" << r.logs[b];
      EXPECT_NE(r.ps_log.find(n), std::string::npos) << n << "\n" << r.ps_log;
    }
    EXPECT_NE(r.ps_log.find("job failed: worker 1: "), std::string::npos) << r.ps_log;
    EXPECT_GE(r.formed_to_failed_ms, 0) << r.ps_log;
    EXPECT_LT(r.formed_to_failed_ms, 2000) << "the refusal came late";
    EXPECT_GE(r.formed_to_exit[b], 0);
    EXPECT_LT(r.formed_to_exit[b], 2000) << "the refused worker ended late\n" << r.logs[b];
    EXPECT_NE(r.workers[other], 0) << r.logs[other];
    EXPECT_NE(r.workers[other], -2) << "the other worker hung\n" << r.logs[other];
    EXPECT_LT(r.formed_to_exit[other], 5000) << r.logs[other];
    EXPECT_EQ(r.ps, 6) << "the job failed\n" << r.ps_log;
  }

  static fs::path* root_;
};
fs::path* WorkerOptionsJob::root_ = nullptr;

TEST_F(WorkerOptionsJob, AgreeingWorkersTrain) {
  const Outcome r = run_job("agree", {{"--device", "cpu", "--sched-threads", "2"}, {"--torch-threads", "2", "--progress-every", "5"}});
  EXPECT_EQ(r.workers, (std::vector<int>{0, 0})) << r.logs[0] << r.logs[1];
  EXPECT_EQ(r.ps, 0) << r.ps_log;
  EXPECT_NE(r.logs[1].find("agree with worker 0's"), std::string::npos) << r.logs[1];
}

TEST_F(WorkerOptionsJob, ModelMismatchIsRefused) {
  expect_refused(run_job("model", {{}, {"--model", "wide-deep"}}), 1, {"--model wide-deep, the job has dlrm"});
  expect_refused(run_job("mlp", {{}, {"--bottom-mlp", "32-16"}}), 1, {"--bottom-mlp 32-16, the job has 16"});
}

TEST_F(WorkerOptionsJob, DenseOptimizerMismatchIsRefused) {
  expect_refused(run_job("dense", {{}, {"--dense-lr", "0.1"}}), 1, {"--dense-lr 0.1, the job has 0.01"});
}

TEST_F(WorkerOptionsJob, SchedulerMismatchIsRefused) {
  expect_refused(run_job("scheduler", {{}, {"--policy", "vanilla", "--cache-ratio", "0.3", "--lookahead", "2"}}), 1,
                 {"--policy vanilla, the job has herald", "--cache-ratio 0.3, the job has 0.15", "--lookahead 2, the job has 0",
                  "--eviction lookahead, the job has lru"});
}

TEST_F(WorkerOptionsJob, DataOrderMismatchIsRefused) {
  expect_refused(run_job("order", {{}, {"--seed", "9", "--shuffle"}}), 1, {"--seed 9, the job has 3", "--shuffle on, the job has off"});
}

TEST_F(WorkerOptionsJob, IterationsMismatchIsRefused) {
  expect_refused(run_job("iterations", {{}, {"--iterations", "30"}}), 1, {"--iterations 30, the job has 5"});
}

// Ranks assigned at join: whichever worker is not worker 0 is refused, with its value
// and worker 0's.
TEST_F(WorkerOptionsJob, RefusedWithRanksAssignedAtJoin) {
  const Outcome r = run_job("assigned", {{"--batch-per-worker", "16"}, {}}, false);
  ASSERT_EQ(r.workers.size(), 2u);
  const int bad = r.workers[0] == 2 ? 0 : 1;
  const bool first_is_zero = bad == 1;  // the process given 16 became worker 0
  expect_refused(r, bad, {first_is_zero ? "--batch-per-worker 32, the job has 16" : "--batch-per-worker 16, the job has 32"});
}

}  // namespace
}  // namespace ember::worker
