// Real ember-ps processes on loopback: BSP rounds from two workers against a
// single-process reference, and checkpoint / restore into a different shard count.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/job_config.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/shard_store.h"
#include "ember/transport/control.h"

namespace ember::ps {
namespace {
namespace fs = std::filesystem;

constexpr std::uint32_t kDim = 8;
constexpr std::uint64_t kKeys = 2000;
const std::string kToken = "t0ken";

// One ember-ps process (test::Process: killed if still running when destroyed), with
// the port it reports.
class Daemon {
 public:
  Daemon(const fs::path& dir, std::uint32_t shard, std::uint32_t shards, const std::string& optimizer, const std::string& extra = "") {
    const std::string tag = std::to_string(shard) + "-" + std::to_string(shards) + "-" + std::to_string(counter_++);
    const fs::path port_file = dir / ("port-" + tag);
    std::vector<std::string> args = {test::bin("ember-ps"),
                                     "--shard",
                                     std::to_string(shard),
                                     "--shards",
                                     std::to_string(shards),
                                     "--num-keys",
                                     std::to_string(kKeys),
                                     "--dim",
                                     std::to_string(kDim),
                                     "--optimizer",
                                     optimizer,
                                     "--lr",
                                     "0.1",
                                     "--seed",
                                     "5",
                                     "--token",
                                     kToken,
                                     "--port-file",
                                     port_file.string(),
                                     "--log-level",
                                     "warn",
                                     "--stats-interval",
                                     "0"};
    std::istringstream more(extra);
    for (std::string a; more >> a;) args.push_back(a);
    proc_ = std::make_unique<test::Process>(args, dir / ("ps-" + tag + ".log"));
    const std::string port = test::wait_for_file(port_file, std::chrono::seconds(10));
    if (port.empty()) throw Error("ember-ps did not start:\n" + proc_->log_tail(10));
    port_ = static_cast<std::uint16_t>(std::stoi(port));
  }
  // SIGTERM and wait (at most 10 s); returns the exit status.
  int stop() {
    proc_->signal(SIGTERM);
    return proc_->wait(std::chrono::seconds(10));
  }
  // SIGTERM only; wait() for the exit.
  void terminate() { proc_->signal(SIGTERM); }
  int wait(std::chrono::seconds limit) { return proc_->wait(limit); }
  std::string log_tail(std::size_t lines) const { return proc_->log_tail(lines); }
  ShardAddress address() const { return {"127.0.0.1", port_}; }
  void kill9() {
    proc_->signal(SIGKILL);
    proc_->wait(std::chrono::seconds(10));
  }

 private:
  static inline int counter_ = 0;
  std::unique_ptr<test::Process> proc_;
  std::uint16_t port_ = 0;
};

struct Round {
  std::vector<Key> keys;
  std::vector<std::uint32_t> trainers;
  std::vector<float> grads;
};

// Two workers' gradients for one iteration; rows both trained carry trainers = 2.
std::vector<Round> make_rounds(std::mt19937_64& rng) {
  std::map<Key, int> count;
  std::vector<std::vector<Key>> picked(2);
  for (int w = 0; w < 2; ++w) {
    std::set<Key> s;
    for (int j = 0; j < 50; ++j) s.insert(rng() % 300);
    picked[w].assign(s.begin(), s.end());
    for (Key k : s) ++count[k];
  }
  std::normal_distribution<float> g(0, 1);
  std::vector<Round> out(2);
  for (int w = 0; w < 2; ++w) {
    for (Key k : picked[w]) {
      out[w].keys.push_back(k);
      out[w].trainers.push_back(static_cast<std::uint32_t>(count[k]));
      for (std::uint32_t j = 0; j < kDim; ++j) out[w].grads.push_back(g(rng));
    }
  }
  return out;
}

class PsDaemon : public test::TempDirTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(PsDaemon, BspRoundsMatchOneProcessAndCheckpointsReshard) {
  const std::string opt = GetParam();
  StoreConfig rc;
  rc.num_keys = kKeys;
  rc.dim = kDim;
  rc.seed = 5;
  rc.optimizer.kind = parse_optimizer(opt);
  rc.optimizer.lr = 0.1f;
  ShardStore reference(rc);
  const std::uint32_t sf = state_floats(rc.optimizer.kind, kDim);
  fs::path ckpt = dir_ / "ckpt";
  std::vector<Key> all;
  for (Key k = 0; k < 300; ++k) all.push_back(k);
  {
    Daemon d0(dir_, 0, 2, opt, "--checkpoint-dir " + ckpt.string() + " --checkpoint-on-exit");
    Daemon d1(dir_, 1, 2, opt, "--checkpoint-dir " + ckpt.string() + " --checkpoint-on-exit");
    PsClient w0({d0.address(), d1.address()}, kToken, kDim, sf), w1({d0.address(), d1.address()}, kToken, kDim, sf);
    std::mt19937_64 rng(12);
    for (std::uint64_t it = 0; it < 20; ++it) {
      auto rounds = make_rounds(rng);
      w0.push_grad(it, rounds[0].keys, rounds[0].trainers, rounds[0].grads);
      w1.push_grad(it, rounds[1].keys, rounds[1].trainers, rounds[1].grads);
      for (auto& r : rounds) reference.push_grad(it, r.keys, r.trainers, r.grads.data());
      w0.commit(it);
      reference.commit();
    }
    std::vector<float> got;
    w1.pull(all, got);
    for (std::size_t i = 0; i < all.size(); ++i) {
      for (std::uint32_t j = 0; j < kDim; ++j) ASSERT_NEAR(got[i * kDim + j], reference.row(all[i])[j], 1e-5) << "key " << all[i];
    }
    // Repeated keys are fetched once and returned at every position.
    std::vector<float> dup;
    w0.pull({5, 7, 5, 9, 7}, dup);
    const Key order[5] = {5, 7, 5, 9, 7};
    for (int i = 0; i < 5; ++i) {
      for (std::uint32_t j = 0; j < kDim; ++j) ASSERT_NEAR(dup[static_cast<std::size_t>(i) * kDim + j], reference.row(order[i])[j], 1e-5);
    }
    EXPECT_EQ(d0.stop(), 0);
    EXPECT_EQ(d1.stop(), 0);
  }
  // Both shards' exit checkpoints of the last commit (19) in one directory; the second
  // shard to finish found both files and wrote the manifest.
  ASSERT_TRUE(fs::exists(ckpt / "iter-000000019" / "shard-0-of-2.ckpt"));
  ASSERT_TRUE(fs::exists(ckpt / "iter-000000019" / "shard-1-of-2.ckpt"));
  ASSERT_TRUE(fs::exists(ckpt / "iter-000000019" / "manifest.json"));
  // Three shards restored from the two shards' checkpoint (the newest whole one under
  // the root): the same rows and state.
  Daemon r0(dir_, 0, 3, opt, "--restore " + ckpt.string());
  Daemon r1(dir_, 1, 3, opt, "--restore " + ckpt.string());
  Daemon r2(dir_, 2, 3, opt, "--restore " + ckpt.string());
  PsClient c({r0.address(), r1.address(), r2.address()}, kToken, kDim, sf);
  std::vector<float> got;
  c.pull(all, got, true);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const float* want = reference.row(all[i]);
    for (std::uint32_t j = 0; j < kDim + sf; ++j) ASSERT_NEAR(got[i * (kDim + sf) + j], want[j], 1e-5) << "key " << all[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PsDaemon, ::testing::Values("sgd", "adagrad"));

// kill -9 every shard mid-run; restarted from the periodic checkpoint (iteration 4) and
// fed iterations 5.. again, the job ends with exactly the uninterrupted run's rows.
TEST_F(PsDaemon, KilledShardsResumeFromTheLastCheckpoint) {
  StoreConfig rc;
  rc.num_keys = kKeys;
  rc.dim = kDim;
  rc.seed = 5;
  rc.optimizer.kind = OptimizerKind::kAdagrad;
  rc.optimizer.lr = 0.1f;
  ShardStore reference(rc);
  const std::uint32_t sf = state_floats(rc.optimizer.kind, kDim);
  std::mt19937_64 rng(21);
  std::vector<std::vector<Round>> rounds;
  for (int it = 0; it < 10; ++it) rounds.push_back(make_rounds(rng));
  for (std::uint64_t it = 0; it < 10; ++it) {
    for (auto& r : rounds[it]) reference.push_grad(it, r.keys, r.trainers, r.grads.data());
    reference.commit();
  }
  fs::path ckpt = dir_ / "ckpt";
  const std::string every = "--checkpoint-dir " + ckpt.string() + " --checkpoint-every 5";
  auto run = [&](PsClient& w0, PsClient& w1, std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t it = from; it < to; ++it) {
      w0.push_grad(it, rounds[it][0].keys, rounds[it][0].trainers, rounds[it][0].grads);
      w1.push_grad(it, rounds[it][1].keys, rounds[it][1].trainers, rounds[it][1].grads);
      w0.commit(it);
    }
  };
  {
    Daemon d0(dir_, 0, 2, "adagrad", every), d1(dir_, 1, 2, "adagrad", every);
    PsClient w0({d0.address(), d1.address()}, kToken, kDim, sf), w1({d0.address(), d1.address()}, kToken, kDim, sf);
    run(w0, w1, 0, 8);
    d0.kill9();
    d1.kill9();
  }
  Daemon d0(dir_, 0, 2, "adagrad", "--restore " + ckpt.string() + " " + every);
  Daemon d1(dir_, 1, 2, "adagrad", "--restore " + ckpt.string() + " " + every);
  PsClient w0({d0.address(), d1.address()}, kToken, kDim, sf), w1({d0.address(), d1.address()}, kToken, kDim, sf);
  run(w0, w1, 5, 10);
  std::vector<Key> all;
  for (Key k = 0; k < 300; ++k) all.push_back(k);
  std::vector<float> got;
  w0.pull(all, got, true);
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::uint32_t j = 0; j < kDim + sf; ++j) ASSERT_EQ(got[i * (kDim + sf) + j], reference.row(all[i])[j]) << "key " << all[i];
  }
}

// Two shards on "hosts" that share no filesystem (a checkpoint directory each: roots[s]),
// in a job with a control plane (shard 0 hosts the coordinator) and one worker member:
// the job forms once it has joined. `shard_args`: both shards' checkpoint options.
struct TwoHostJob {
  TwoHostJob(const fs::path& dir, const std::string& shard_args) : roots{dir / "host0", dir / "host1"} {
    const fs::path coordinator_file = dir / "coordinator";
    auto args = [&](int s) { return "--workers 1 --heartbeat-timeout-ms 5000 " + shard_args + " --checkpoint-dir " + roots[s].string(); };
    d0.emplace(dir, 0, 2, "sgd", args(0) + " --coordinator tcp://127.0.0.1:0 --coordinator-file " + coordinator_file.string());
    const std::string endpoint = test::wait_for_file(coordinator_file, std::chrono::seconds(10));
    if (endpoint.empty()) throw Error("shard 0 wrote no coordinator endpoint");
    d1.emplace(dir, 1, 2, "sgd", args(1) + " --coordinator " + endpoint);
    transport::MemberOptions mo;
    mo.coordinator = endpoint;
    mo.token = kToken;
    mo.role = transport::Role::kWorker;
    worker.emplace(mo);
    // As a worker does before it trains: the job's config, published once every shard
    // has joined and answers signals as a serving shard.
    worker->lookup(kJobConfigKey, std::chrono::seconds(30));
  }
  fs::path roots[2];
  std::optional<Daemon> d0, d1;
  std::optional<transport::ControlMember> worker;
};

// `iterations` BSP rounds (push, commit) of one worker that trains every row it pushes alone.
void train_alone(PsClient& w, std::uint64_t seed, std::uint64_t iterations) {
  std::mt19937_64 rng(seed);
  for (std::uint64_t it = 0; it < iterations; ++it) {
    Round r = make_rounds(rng)[0];
    std::fill(r.trainers.begin(), r.trainers.end(), 1u);  // this worker alone
    w.push_grad(it, r.keys, r.trainers, r.grads);
    w.commit(it);
  }
}

// Two shards that share no filesystem (a checkpoint directory each) in a job with a
// control plane: each learns from the coordinator's board when the other has written its
// file, writes the manifest of both, and prunes (keep 1), as one directory would.
TEST_F(PsDaemon, ShardsWithoutASharedDirectoryCompleteCheckpointsThroughTheControlPlane) {
  TwoHostJob job(dir_, "--checkpoint-every 5 --keep-checkpoints 1");
  const auto& roots = job.roots;
  Daemon &d0 = *job.d0, &d1 = *job.d1;
  PsClient w({d0.address(), d1.address()}, kToken, kDim, 0);
  // As a worker without dense checkpoints says of every checkpoint (job_config.h): the
  // checkpoints are whole for the job once the shards' files are.
  for (std::int64_t it : {4, 9}) job.worker->publish(dense_state_key(it, 0), "none");
  train_alone(w, 3, 10);
  // The shard that wrote first hears of the other's file on its clock (0.1 s); each
  // prunes right after writing its manifest.
  auto manifest = [&](int s, std::int64_t it) { return checkpoint_dir(roots[s], it) / "manifest.json"; };
  auto settled = [&](int s) { return fs::exists(manifest(s, 9)) && !fs::exists(checkpoint_dir(roots[s], 4)); };
  for (int i = 0; i < 100 && !(settled(0) && settled(1)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(fs::exists(manifest(s, 9))) << roots[s];
    const std::string m = read_file(manifest(s, 9));
    EXPECT_NE(m.find("\"at\": \"127.0.0.1:" + std::to_string(d0.address().port) + "\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"at\": \"127.0.0.1:" + std::to_string(d1.address().port) + "\""), std::string::npos) << m;
    EXPECT_TRUE(fs::exists(checkpoint_dir(roots[s], 9) / checkpoint_file_name(s, 2)));
    EXPECT_FALSE(fs::exists(checkpoint_dir(roots[s], 9) / checkpoint_file_name(1 - s, 2)));  // the other host's
    EXPECT_FALSE(fs::exists(checkpoint_dir(roots[s], 4))) << "keep 1: iteration 4's checkpoint pruned in " << roots[s];
  }
  std::vector<Key> all;
  for (Key k = 0; k < 300; ++k) all.push_back(k);
  std::vector<float> before, after;
  w.pull(all, before);
  job.worker->leave();  // every worker gone: the shards stop
  EXPECT_EQ(d1.stop(), 0);
  EXPECT_EQ(d0.stop(), 0);
  // Restarted with the same shards, each restores from its own directory alone.
  Daemon r0(dir_, 0, 2, "sgd", "--restore " + roots[0].string()), r1(dir_, 1, 2, "sgd", "--restore " + roots[1].string());
  PsClient again({r0.address(), r1.address()}, kToken, kDim, 0);
  again.pull(all, after);
  EXPECT_EQ(after, before);
}

// Shards that restored different checkpoints (each chose from its own directory) would
// serve rows of different iterations: shard 0 fails the job as it forms, naming both.
TEST_F(PsDaemon, ShardsRestoredFromDifferentCheckpointsFailTheJobNamingThem) {
  fs::path roots[2];
  {
    TwoHostJob job(dir_, "--checkpoint-every 5 --keep-checkpoints 0");  // all kept: 4 and 9
    for (std::int64_t it : {4, 9}) job.worker->publish(dense_state_key(it, 0), "none");
    PsClient w({job.d0->address(), job.d1->address()}, kToken, kDim, 0);
    train_alone(w, 3, 10);
    roots[0] = job.roots[0];
    roots[1] = job.roots[1];
    // Each shard writes a manifest once it heard of the other's file (the board, 0.1 s).
    auto whole = [&] {
      for (const fs::path& r : roots)
        for (std::int64_t it : {4, 9})
          if (!fs::exists(checkpoint_dir(r, it) / "manifest.json")) return false;
      return true;
    };
    for (int i = 0; i < 600 && !whole(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(whole()) << "the checkpoints of iterations 4 and 9 were not completed on both hosts in 30 s";
    job.worker->leave();
    EXPECT_EQ(job.d1->stop(), 0);
    EXPECT_EQ(job.d0->stop(), 0);
  }
  ASSERT_TRUE(fs::exists(checkpoint_dir(roots[1], 4) / "manifest.json"));
  const fs::path coordinator_file = dir_ / "coordinator-again";
  Daemon d0(dir_, 0, 2, "sgd",
            "--workers 1 --heartbeat-timeout-ms 5000 --coordinator tcp://127.0.0.1:0 --coordinator-file " + coordinator_file.string() +
                " --restore " + checkpoint_dir(roots[0], 9).string());
  const std::string endpoint = test::wait_for_file(coordinator_file, std::chrono::seconds(10));
  ASSERT_FALSE(endpoint.empty());
  Daemon d1(dir_, 1, 2, "sgd",
            "--workers 1 --heartbeat-timeout-ms 5000 --coordinator " + endpoint + " --restore " + checkpoint_dir(roots[1], 4).string());
  transport::MemberOptions mo;
  mo.coordinator = endpoint;
  mo.token = kToken;
  mo.role = transport::Role::kWorker;
  transport::ControlMember worker(mo);
  EXPECT_NE(d0.wait(std::chrono::seconds(20)), 0);
  EXPECT_NE(d1.wait(std::chrono::seconds(20)), 0);
  const std::string want = "the shards restored different checkpoints: shard 0 restored iteration 9, shard 1 restored iteration 4";
  EXPECT_NE(d0.log_tail(5).find(want), std::string::npos) << d0.log_tail(5);
  for (int i = 0; i < 100 && !worker.failure(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(worker.failure().has_value());
  EXPECT_NE(worker.failure()->find(want), std::string::npos) << *worker.failure();
}

// Shards stopped far apart (one stopped by hand later, or still writing a large
// checkpoint): the shard that hosts the coordinator waits on while the other is in the
// job, so both hosts get the exit checkpoint's manifest. Before, it gave up after 5 s,
// and the board the late shard needed went with it: neither host had a manifest.
TEST_F(PsDaemon, TheCoordinatorsShardWaitsForALateShardsExitCheckpoint) {
  // This worker never commits again, so SIGTERM's stop at a checkpoint the workers flush
  // for is given up after --stop-wait-s, and the exit checkpoint written at once.
  TwoHostJob job(dir_, "--checkpoint-on-exit --stop-wait-s 1");
  const auto& roots = job.roots;
  Daemon &d0 = *job.d0, &d1 = *job.d1;
  {
    PsClient w({d0.address(), d1.address()}, kToken, kDim, 0);
    train_alone(w, 4, 3);
  }
  d0.terminate();
  std::this_thread::sleep_for(std::chrono::milliseconds(6500));  // past the 5 s any shard waits
  EXPECT_EQ(d1.stop(), 0);
  EXPECT_EQ(d0.wait(std::chrono::seconds(10)), 0);
  for (int s = 0; s < 2; ++s) EXPECT_TRUE(fs::exists(checkpoint_dir(roots[s], 2) / "manifest.json")) << roots[s];
  const std::string log = d0.log_tail(30);
  EXPECT_NE(log.find("did not reach iteration 8's checkpoint within --stop-wait-s 1"), std::string::npos) << log;
}

TEST(PsDaemonCli, RefusesToStartWithoutAToken) {
  std::string out;
  int rc = test::run_command(test::bin("ember-ps") + " --num-keys 10", out);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("job token is required"), std::string::npos) << out;
}

// Options from a config file are used; a key that names no option is refused, naming
// the file and the key (it used to be ignored: a misspelled option silently had no effect).
TEST_F(PsDaemon, ConfigFileOptionsAreUsedAndUnknownKeysRefused) {
  std::string out;
  const fs::path good = write("good.ini", "num-keys = 1099511627776\ndim = 64\nallocate = upfront\ntoken = t\n");
  int rc = test::run_command(test::bin("ember-ps") + " --config " + good.string() + " 2>&1", out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("the tables need"), std::string::npos) << out;  // its 2^40 rows were read
  const fs::path bad = write("bad.ini", "num-keys = 10\ntoken = t\nchekpoint-every = 5\n");
  // (timeout: were the key ignored, the daemon would serve on)
  rc = test::run_command("timeout 20 " + test::bin("ember-ps") + " --config " + bad.string() + " --stats-interval 0 2>&1", out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("config file " + bad.string() + ": 'chekpoint-every' is not an option"), std::string::npos) << out;
}

// SIGTERM while the shard waits for the job to form (its workers never come) stops it at
// once; the signal used to wait, blocked, for the join's 2-minute timeout.
TEST_F(PsDaemon, SigtermWhileTheJobFormsStopsTheShardAtOnce) {
  Daemon d(dir_, 0, 1, "sgd", "--coordinator tcp://127.0.0.1:0 --workers 1 --log-level info");
  for (int i = 0; i < 200 && d.log_tail(5).find("joining the job") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  d.terminate();
  EXPECT_EQ(d.wait(std::chrono::seconds(5)), -1) << "ended by the signal, at once:\n" << d.log_tail(5);
  EXPECT_NE(d.log_tail(5).find("signal 15 before the job is served: stopping now"), std::string::npos) << d.log_tail(5);
}

// Tables larger than this machine's memory: refused up front with the sizes, in one line.
TEST(PsDaemonCli, TablesThatCannotFitAreRefusedWithTheirSize) {
  std::string out;
  // 2^40 rows of dim 64: about 282 TB.
  int rc = test::run_command(test::bin("ember-ps") + " --num-keys 1099511627776 --dim 64 --token t --allocate upfront 2>&1", out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("the tables need"), std::string::npos) << out;
  EXPECT_NE(out.find("GB available"), std::string::npos) << out;
  EXPECT_NE(out.find("--allocate lazy"), std::string::npos) << out;
}

// Up-front allocation initializes every row before serving: the same rows as lazy.
TEST_F(PsDaemon, UpFrontAllocationServesTheSameRows) {
  Daemon lazy(dir_, 0, 1, "adagrad"), upfront(dir_, 0, 1, "adagrad", "--allocate upfront");
  PsClient a({lazy.address()}, kToken, kDim, kDim), b({upfront.address()}, kToken, kDim, kDim);
  std::vector<Key> keys;
  for (Key k = 0; k < kKeys; k += 7) keys.push_back(k);
  std::vector<float> ra, rb;
  a.pull(keys, ra, true);
  b.pull(keys, rb, true);
  EXPECT_EQ(ra, rb);
}

}  // namespace
}  // namespace ember::ps
