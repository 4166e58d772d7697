// End-to-end failures: clear errors for wrong tokens, data and devices; a killed or
// stopped member ends the job on every survivor, naming it, without hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/fs.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/ps_service.h"
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/plan_file.h"
#include "ember/worker/trainer.h"
#include "job_fixture.h"
#include "training_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

TEST_F(Training, ClearErrorsForWrongTokenMismatchedDataAndRdma) {
  const fs::path data = dataset(4000);
  std::string out;
  // No RDMA device here (or one, on a machine that has it): one line either way.
  int rc = test::run_command(
      test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator tcp://127.0.0.1:1 --token x --transport rdma", out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("RDMA"), std::string::npos) << out;
  EXPECT_NE(out.find("--transport tcp"), std::string::npos) << out;
  if (!torch::cuda::is_available()) {
    rc = test::run_command(
        test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator tcp://127.0.0.1:1 --token x --device cuda 2>&1", out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("no CUDA device"), std::string::npos) << out;
    EXPECT_NE(out.find("--device cpu"), std::string::npos) << out;
  }

  JobOptions o;
  o.shards = 1;
  o.workers = 1;
  std::vector<std::unique_ptr<test::Process>> ps;
  const std::string coord = start_ps(data, o, "job", ps);
  ASSERT_FALSE(coord.empty());
  rc = test::run_command(test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator " + coord +
                             " --token wrong --workers 1 --join-timeout-ms 5000 2>&1",
                         out);
  EXPECT_EQ(rc, 5) << out;
  EXPECT_NE(out.find("wrong job token"), std::string::npos) << out;
  // Another dataset than the PS serves.
  const fs::path other = dir_ / "other";
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 3000 --scale 0.0002 --seed 9 --force -o " +
                                  (dir_ / "o.tsv").string() + " && " + test::bin("ember-data") + " prep --format criteo --force -o " +
                                  other.string() + " " + (dir_ / "o.tsv").string(),
                              out),
            0)
      << out;
  rc = test::run_command(
      test::bin("ember-worker") + " --dataset " + other.string() + " --coordinator " + coord + " --token " + kToken + " --workers 1 2>&1",
      out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("dataset mismatch"), std::string::npos) << out;
  // --resume against shards that restored nothing (a job of its own: a worker that fails
  // after joining keeps its place).
  std::vector<std::unique_ptr<test::Process>> ps2;
  const std::string coord2 = start_ps(data, o, "resume", ps2);
  ASSERT_FALSE(coord2.empty());
  rc = test::run_command(test::bin("ember-worker") + " --dataset " + data.string() + " --coordinator " + coord2 + " --token " + kToken +
                             " --workers 1 --resume --checkpoint-dir " + (dir_ / "none").string() + " 2>&1",
                         out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("restored no checkpoint"), std::string::npos) << out;
}

TEST_F(Training, KilledWorkerFailsTheJobWithoutHanging) {
  const fs::path data = dataset(4000);
  JobOptions o;
  o.shards = 1;
  o.workers = 2;
  o.iterations = 1000000;
  Processes ps;
  const std::string coord = start_ps(data, o, "kill", ps);
  ASSERT_FALSE(coord.empty());
  Processes workers = start_workers(data, o, coord, "kill");
  // Wait until training runs (the metrics file grows), then kill worker 1.
  ASSERT_FALSE(test::wait_for_file(dir_ / "kill-w0.jsonl", 60s).empty()) << workers[0]->log_tail(20);
  workers[1]->signal(SIGKILL);
  EXPECT_NE(workers[1]->wait(5s), 0);
  const int rc0 = workers[0]->wait(60s);
  EXPECT_NE(rc0, 0);
  EXPECT_NE(rc0, -2) << "worker 0 hung after its peer died";
  const int rps = ps[0]->wait(60s);
  EXPECT_EQ(rps, 6) << ps[0]->log_tail(10);  // job failed
  EXPECT_NE(ps[0]->log_tail(30).find("worker 1"), std::string::npos) << ps[0]->log_tail(30);
}

// The pids of processes whose command line contains every one of `parts`.
std::vector<pid_t> pids_with(const std::vector<std::string>& parts) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    bool all = !cmd.empty();
    for (const auto& p : parts) all = all && cmd.find(p) != std::string::npos;
    if (all) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// A stopped worker (SIGSTOP: alive, silent) blocks its peers in the all-reduce (and,
// with per-host aggregation, in the hand-offs of its host). The control plane declares
// it dead at the heartbeat timeout (3 s here); every survivor then exits within the
// timeout plus a few seconds, with JobFailed's status, naming it.
TEST_F(Training, StoppedWorkerEndsEverySurvivorWithinTheHeartbeatTimeout) {
  JobOptions o;
  o.shards = 1;
  o.workers = 3;
  o.iterations = 1000000;
  expect_survivors_end_when_stopped(o, 1, "stop");
}

// The same for the worker that pulls and pushes for its host (per-host aggregation: the
// first of host 1, on 2 hosts x 2 workers).
TEST_F(Training, StoppedHostRelayEndsEverySurvivorWithinTheHeartbeatTimeout) {
  JobOptions o;
  o.shards = 1;
  o.workers = 4;
  o.workers_per_host = 2;
  o.host_aggregation = true;
  o.iterations = 1000000;
  expect_survivors_end_when_stopped(o, 2, "stop-relay");
}

// kill -9 of one shard: no other process takes it for a finished job (no exit 0), and
// every one says the shard failed.
TEST_F(Training, KilledShardFailsEveryMemberNamingIt) {
  const fs::path data = dataset(4000);
  JobOptions o;
  o.shards = 2;
  o.workers = 2;
  o.iterations = 1000000;
  Processes ps;
  const std::string coord = start_ps(data, o, "kps", ps);
  ASSERT_FALSE(coord.empty());
  Processes workers = start_workers(data, o, coord, "kps");
  wait_for_lines(dir_ / "kps-w0.jsonl", 3);
  ps[1]->signal(SIGKILL);
  for (auto& w : workers) {
    const int rc = w->wait(20s);
    EXPECT_EQ(rc, 6) << w->log_tail(10);
    EXPECT_NE(w->log_tail(10).find("ps 1: no heartbeat"), std::string::npos) << w->log_tail(10);
  }
  EXPECT_EQ(ps[0]->wait(20s), 6) << ps[0]->log_tail(10);
  EXPECT_EQ(ps[0]->log_tail(30).find("every worker left"), std::string::npos) << ps[0]->log_tail(30);
}

// The launcher names the member that failed by the control plane's word (not the first
// process to exit), and its own death ends every process of its job.
TEST_F(Training, LauncherNamesTheFailedWorkerAndItsDeathEndsTheJob) {
  const fs::path data = dataset(4000);
  const fs::path out = dir_ / "launch";
  auto launch = [&](const std::string& name) {
    return std::make_unique<test::Process>(std::vector<std::string>{"/usr/bin/env",
                                                                    "python3",
                                                                    std::string(EMBER_SOURCE_DIR) + "/scripts/ember_launch.py",
                                                                    "--dataset",
                                                                    data.string(),
                                                                    "--workers",
                                                                    "3",
                                                                    "--policy",
                                                                    "herald",
                                                                    "--out",
                                                                    (out / name).string(),
                                                                    "--bin",
                                                                    EMBER_BIN_DIR,
                                                                    "--heartbeat-timeout-ms",
                                                                    "3000",
                                                                    "-q",
                                                                    "--",
                                                                    "--iterations",
                                                                    "1000000",
                                                                    "--batch-per-worker",
                                                                    "64",
                                                                    "--model",
                                                                    "dlrm",
                                                                    "--bottom-mlp",
                                                                    "16",
                                                                    "--top-mlp",
                                                                    "16",
                                                                    "--log-level",
                                                                    "warn"},
                                           dir_ / (name + ".log"));
  };
  {
    auto launcher = launch("stop");
    wait_for_lines(out / "stop" / "w0.jsonl", 3);
    const auto victim = pids_with({"ember-worker", (out / "stop" / "w1.jsonl").string()});
    ASSERT_EQ(victim.size(), 1u);
    ::kill(victim[0], SIGSTOP);
    EXPECT_EQ(launcher->wait(30s), 1);
    const std::string tail = launcher->log_tail(30);
    EXPECT_NE(tail.find("ember-launch: the job failed: worker1 failed first, by the control plane: no heartbeat"), std::string::npos)
        << tail;
    ::kill(victim[0], SIGKILL);
  }
  {
    auto launcher = launch("orphan");
    wait_for_lines(out / "orphan" / "w0.jsonl", 3);
    EXPECT_EQ(pids_with({(out / "orphan").string(), "bin/ember-"}).size(), 4u);
    launcher->signal(SIGKILL);
    launcher->wait(5s);
    std::vector<pid_t> left;
    for (auto until = std::chrono::steady_clock::now() + 15s; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(100ms)) {
      left = pids_with({(out / "orphan").string(), "bin/ember-"});
      if (left.empty()) break;
    }
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job outlived its launcher by 15 s";
    for (pid_t p : left) ::kill(p, SIGKILL);
  }
}

}  // namespace
}  // namespace ember::worker
