// End-to-end checkpoints: disk tiers, periodic, on command and on SIGTERM; resumed jobs
// end bit for bit as the uninterrupted one, passing over a corrupt newest checkpoint.
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

// A disk tier under each shard (--store-dir, --ram-budget-mb 0.0625: a fraction of each
// shard's rows) trains the model all-RAM shards train, bit for bit, serving the same
// rows; the workers name each iteration's rows --lookahead iterations ahead (hints), and
// the shards' summaries count the tier's reads and evictions.
TEST_F(Training, DiskTierTrainsTheAllRamModelBitForBit) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.optimizer = "adagrad";
  o.model = "wide-deep";
  o.cache_ratio = "0.06";
  o.lookahead = 2;
  o.eviction = "lookahead";
  o.prefetch = true;
  o.eval_every = 7;
  const JobResult ram = run_job(data, o, "tier-ram");
  JobOptions t = o;
  t.ps_args = {"--store-dir", (dir_ / "tier").string(), "--ram-budget-mb", "0.0625"};
  const JobResult disk = run_job(data, t, "tier-disk");
  ASSERT_FALSE(ram.dump.rows.empty());
  EXPECT_EQ(max_abs_diff(ram.dump.rows, disk.dump.rows), 0.0f);
  EXPECT_EQ(max_abs_diff(ram.dump.dense, disk.dump.dense), 0.0f);
  for (const char* kind : {"pull", "pull_state", "prefetch", "push_grad", "push_value"})
    EXPECT_EQ(ram.served.at(std::string(kind) + ".rows"), disk.served.at(std::string(kind) + ".rows")) << kind;
  EXPECT_EQ(ram.served.at("hint.rows"), 0u) << "hints are sent to shards with a tier only";
  EXPECT_GT(disk.served.at("hint.rows"), 0u);
  std::uint64_t evicted = 0, hint_loads = 0, touched = 0;
  std::string tiers;
  for (int s = 0; s < 2; ++s) {
    const json summary = json::parse(read_file(dir_ / ("tier-disk-ps" + std::to_string(s) + ".json")));
    const json& tier = summary.at("tier");
    tiers += tier.dump() + " ";
    evicted += tier.at("evicted_rows").get<std::uint64_t>();
    hint_loads += tier.at("hint_loads").get<std::uint64_t>();
    touched += tier.at("rows_touched").get<std::uint64_t>();
  }
  EXPECT_GT(evicted, 0u) << "the rows never outgrew the budget: the tier was not exercised; " << tiers;
  EXPECT_GT(hint_loads, 0u) << tiers;
  EXPECT_GT(touched, 0u) << tiers;
}

// The disk tier's model (ember-sim --ram-budget-mb, scheduler/src/tier_model.h) against
// real tiers, without hints (no lookahead): the rows requests used and those they waited
// for the disk for, over the training and its flushes (each shard's counters at the job's
// last commit, before the final evaluation and the dump read), within 10% of ember-sim's
// prediction, shard by shard.
TEST_F(Training, DiskTierReadsAsEmberSimPredicts) {
  const fs::path data = dataset();
  JobOptions o;
  o.policy = "herald";
  o.optimizer = "adagrad";
  o.cache_ratio = "0.06";
  o.iterations = 40;
  o.ps_args = {"--store-dir", (dir_ / "tier").string(), "--ram-budget-mb", "0.0625"};
  run_job(data, o, "tier-model");
  std::string out;
  const std::string cmd = test::bin("ember-sim") + " --dataset " + data.string() + " --policy " + o.policy + " --workers " +
                          std::to_string(o.workers) + " --batch-per-worker " + std::to_string(o.batch) + " --cache-ratio " + o.cache_ratio +
                          " --iterations " + std::to_string(o.iterations) + " --warmup 0 --seed " + std::to_string(kSeed) + " --dim " +
                          std::to_string(kDim) + " --optimizer " + o.optimizer + " --ps " + std::to_string(o.shards) +
                          " --ram-budget-mb 0.0625 --json -q 2>&1";
  ASSERT_EQ(test::run_command(cmd, out), 0) << out;
  const json shards = json::parse(out.substr(0, out.find('\n'))).at("tier").at("shards");
  ASSERT_EQ(shards.size(), o.shards);
  const auto n = static_cast<double>(o.iterations);
  for (std::uint32_t s = 0; s < o.shards; ++s) {
    const json real = json::parse(read_file(dir_ / ("tier-model-ps" + std::to_string(s) + ".json"))).at("tier").at("at_last_commit");
    const json& model = shards[s].at("no_hints");
    const double touched = model.at("rows_touched_per_iteration").get<double>() * n;
    const double waited = model.at("critical_reads_per_iteration").get<double>() * n;
    ASSERT_GT(waited, 0.0) << "the rows never outgrew the budget: the test proves less; " << model.dump();
    EXPECT_NEAR(real.at("rows_touched").get<double>(), touched, 0.1 * touched)
        << "shard " << s << ": " << real.dump() << " vs " << model.dump();
    EXPECT_NEAR(real.at("misses").get<double>(), waited, 0.1 * waited) << "shard " << s << ": " << real.dump() << " vs " << model.dump();
  }
}

// Tiered shards checkpoint and resume exactly: a job resumed at iteration 7 from a
// tiered job's checkpoint, into tiered shards again (their store directories reused: the
// same table), ends bit for bit as the uninterrupted tiered job, which trains the
// one-process model.
TEST_F(Training, DiskTierJobsResumeExactly) {
  const fs::path data = dataset();
  const std::vector<std::string> tier = {"--store-dir", (dir_ / "tier").string(), "--ram-budget-mb", "0.0625"};
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.ps_args.insert(o.ps_args.end(), tier.begin(), tier.end());
  o.optimizer = "adagrad";
  o.dense_optimizer = "adagrad";
  const JobResult whole = run_job_like_one_process(data, o, "tier-whole", "herald + adagrad on a disk tier, checkpointing");
  // A tiered shard checkpoints incrementally (one whole in 8): 7's files add to 3's.
  for (const char* f : {"shard-0-of-2.ckpt", "shard-1-of-2.ckpt"}) {
    const auto info = ps::ShardStore::checkpoint_info(dir_ / "ckpt" / "iter-000000007" / f);
    EXPECT_EQ(info.base, std::optional<std::int64_t>(3)) << f;
  }
  JobOptions resumed = o;
  resumed.ps_args = {"--restore", (dir_ / "ckpt" / "iter-000000007").string()};
  resumed.ps_args.insert(resumed.ps_args.end(), tier.begin(), tier.end());
  resumed.worker_args.push_back("--resume");
  const JobResult r = run_job(data, resumed, "tier-resumed");
  ASSERT_FALSE(whole.dump.rows.empty());
  EXPECT_EQ(max_abs_diff(whole.dump.rows, r.dump.rows), 0.0f);
  EXPECT_EQ(max_abs_diff(whole.dump.dense, r.dump.dense), 0.0f);
}

// Cache admission: a job resumed from a checkpoint turns away the rows the
// uninterrupted one did (the replayed scheduler rebuilds the frequency sketch) and ends
// bit for bit as it (multi-hot bags, a cache under pressure, lookahead and prefetch).
TEST_F(Training, AdmissionJobsResumeExactly) {
  const fs::path data = dataset(8000, "3,2,1,2,6,1,1,1,1,7,3,8,0,6,9,5,1,1,1,12,4,2,10,3,1,1");
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.cache_ratio = "0.12";
  o.lookahead = 2;
  o.prefetch = true;
  o.cache_admission = "tinylfu";
  // The resumed job equals the uninterrupted one bit for bit; the one-process model sums
  // the dense gradients in another order, which a ReLU's kink amplifies (docs/training.md
  // "Same model, whatever the policy"): 4e-5 here with OpenBLAS's AVX-512 kernels.
  one_process_tolerance_ = 1e-4;
  expect_resumes_exactly(data, o, "adm", "cache admission");
  EXPECT_GT(simulate(data, o)["not_admitted"], 0u) << "admission turned no row away: the test proves less";
}

// A herald job's checkpoints hold the model of BSP training before their iteration (the
// rows workers own and their partial gradients are flushed to the PS first; before,
// they held the PS's stale copies), and a job restored from one (ember-ps --restore,
// ember-worker --resume) trains on to the same model as the uninterrupted run. Adagrad
// on both sides: the optimizers' state must come back too.
TEST_F(Training, CheckpointsHoldTheBspModelAndJobsResumeFromThem) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.optimizer = "adagrad";
  o.dense_optimizer = "adagrad";
  const JobResult whole = run_job_like_one_process(data, o, "whole", "herald + adagrad, checkpointing");
  // commit(I) with (I + 1) % 4 == 0 checkpoints the rows trained before iteration I, and
  // the workers' last commit (of iteration 10, after their final flush) the whole run's.
  expect_checkpoint_of(data, o, 3);
  const std::vector<float> at7 = expect_checkpoint_of(data, o, 7);
  expect_checkpoint_of(data, o, kIterations);
  ASSERT_FALSE(whole.dump.rows.empty());
  EXPECT_GT(max_abs_diff(at7, whole.dump.rows), 1e-4) << "iterations 7-9 changed nothing: the resume below proves nothing";

  JobOptions resumed = o;
  resumed.ps_args = {"--restore", (dir_ / "ckpt" / "iter-000000007").string()};
  resumed.worker_args.push_back("--resume");
  const JobResult r = run_job_like_one_process(data, resumed, "resumed", "herald + adagrad, resumed at iteration 7");
  EXPECT_LT(max_abs_diff(whole.dump.rows, r.dump.rows), 2e-5);
  EXPECT_LT(max_abs_diff(whole.dump.dense, r.dump.dense), 2e-5);
  // It trained iterations 7-9 only.
  std::ifstream in(dir_ / "resumed-w0.jsonl");
  std::vector<std::uint64_t> trained;
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line);
    if (j.contains("iteration") && !j.contains("eval")) trained.push_back(j.at("iteration"));
  }
  EXPECT_EQ(trained, (std::vector<std::uint64_t>{7, 8, 9}));
}

// Checkpoints on command (SIGUSR1 to a shard, no --checkpoint-every): every shard
// writes the iteration asked for a few commits later, the workers having flushed for it,
// and it holds the model of BSP training before that iteration. Two shards signalled an
// iteration apart name different iterations: each is flushed for and whole (the workers
// used to keep only the later one, so the other held that shard's rows only).
TEST_F(Training, CheckpointOnCommandHoldsTheBspModel) {
  const fs::path data = dataset();
  const fs::path ckpt = dir_ / "ckpt";
  JobOptions o = checkpointing_job({});
  o.iterations = 40;
  const fs::path metrics = dir_ / "command-w0.jsonl";
  run_job(data, o, "command", [&](Processes& ps, Processes&) {
    // Iteration 1 done: no shard has committed 3 yet (worker 0 has not); iteration 7 done:
    // every shard has (worker 0's commit was acknowledged). So they name distinct ones,
    // with room for a shard that handles its signal a few commits late on a loaded host.
    wait_for_lines(metrics, 2);
    ps[1]->signal(SIGUSR1);
    wait_for_lines(metrics, 8);
    ps[0]->signal(SIGUSR1);
  });
  // The two asked for, and the finished model's (iteration 40, at the workers' last commit).
  std::vector<fs::path> dirs;
  if (fs::exists(ckpt))
    for (const auto& e : fs::directory_iterator(ckpt)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  ASSERT_EQ(dirs.size(), 3u) << "two checkpoints asked for, and the last";
  EXPECT_EQ(dirs[2].filename(), "iter-000000040");
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(fs::exists(dirs[i] / "manifest.json")) << dirs[i] << ": every shard wrote it";
    const std::uint64_t it = std::stoull(dirs[i].filename().string().substr(5));
    EXPECT_GE(it, 1u + ps::kCheckpointLead);  // asked once iteration 1 was committed
    EXPECT_LT(it, o.iterations);
    expect_checkpoint_of(data, o, it);
  }
}

// SIGTERM to a shard of a running job, with --checkpoint-on-exit: the job stops at a
// checkpoint the workers flush for (not at once: the rows they own would be missing),
// every process exits 0, the checkpoint holds BSP training of that many iterations, and
// a job resumed from it ends with the uninterrupted run's model.
TEST_F(Training, SigtermStopsTheJobAtACheckpointThatResumes) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-on-exit"});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "stopped", [](Processes& ps, Processes&) { ps[1]->signal(SIGTERM); });
  ASSERT_GE(stopped.iteration, 1u + ps::kCheckpointLead) << "stopped once iteration 1 was committed, a lead later";
  ASSERT_FALSE(stopped.dir.empty());

  JobOptions resumed = o;
  resumed.ps_args.insert(resumed.ps_args.end(), {"--restore", stopped.dir.string()});
  resumed.worker_args.push_back("--resume");
  run_job_like_one_process(data, resumed, "resumed", "herald, stopped by SIGTERM and resumed");
}

// SIGTERM to one worker of a running job, whose shards checkpoint and whose workers have
// a --checkpoint-dir: the worker asks the shards (its commits flagged kCommitStop) to
// stop the job at a checkpoint, and it stops there as on a shard's SIGTERM: every
// process exits 0, and the checkpoint holds BSP training of that many iterations.
TEST_F(Training, SigtermToAWorkerStopsTheJobAtACheckpoint) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "worker-stop", [](Processes&, Processes& workers) { workers[2]->signal(SIGTERM); });
  ASSERT_GE(stopped.iteration, 1u + ps::kCheckpointLead) << "stopped once iteration 1 was committed, a lead later";
  ASSERT_FALSE(stopped.dir.empty());
  EXPECT_NE(read_file(dir_ / "worker-stop-w2.log").find("signal 15: the job stops at a checkpoint"), std::string::npos);
}

// SIGTERM to every process of the job at once, as a cluster manager sends it: the shards
// (--checkpoint-on-exit) and the workers each ask for the stop, and the job stops at the
// first one named, checkpointed whole, instead of the workers dying and the shards
// writing the rows they hold alone.
TEST_F(Training, SigtermToEveryProcessStopsTheJobAtACheckpoint) {
  const fs::path data = dataset();
  JobOptions o = checkpointing_job({"--checkpoint-on-exit"});
  o.iterations = 40;
  const StoppedAt stopped = run_and_stop(data, o, "all-stop", [](Processes& ps, Processes& workers) {
    for (auto& p : workers) p->signal(SIGTERM);
    for (auto& p : ps) p->signal(SIGTERM);
  });
  EXPECT_FALSE(stopped.dir.empty());
}

// ember_launch.py --resume with a corrupt newest checkpoint (bytes flipped mid-file, the
// size unchanged, so the manifest's size check passes). A job of 19 iterations
// checkpoints at 9 and at its end (19); then, each on a copy of its checkpoints:
//   - a shard file of 19 corrupt: the launcher passes over 19 (one line naming the file
//     and "checksum mismatch") and the job goes on from 9;
//   - one worker's dense file of 19 corrupt: 19 stands (the replicas are identical), and
//     that worker loads worker 0's file of 19, logging the one it passed over;
//   - every dense file of 19 corrupt: the launcher passes over 19 for 9;
//   - every checkpoint corrupt: refused (exit 1), naming each.
TEST_F(Training, ResumePassesOverACorruptNewestCheckpoint) {
  const fs::path data = dataset(4000);
  auto launch = [&](const std::string& name, const fs::path& ckpt, bool resume, int iterations) {
    std::vector<std::string> args = {"/usr/bin/env",
                                     "python3",
                                     std::string(EMBER_SOURCE_DIR) + "/scripts/ember_launch.py",
                                     "--dataset",
                                     data.string(),
                                     "--ps",
                                     "2",
                                     "--workers",
                                     "2",
                                     "--policy",
                                     "herald",
                                     "--out",
                                     (dir_ / name).string(),
                                     "--bin",
                                     EMBER_BIN_DIR,
                                     "--checkpoint-dir",
                                     ckpt.string(),
                                     "--checkpoint-every",
                                     "10",
                                     "--heartbeat-timeout-ms",
                                     "5000",
                                     "--timeout",
                                     "120",
                                     "-q"};
    if (resume) args.push_back("--resume");
    for (const std::string a : {"--", "--iterations", "", "--batch-per-worker", "32", "--model", "dlrm", "--bottom-mlp", "16", "--top-mlp",
                                "16", "--eval-every", "0", "--eval-samples", "256"})
      args.push_back(a.empty() ? std::to_string(iterations) : a);
    test::Process p(args, dir_ / (name + ".log"));
    const int rc = p.wait(150s);
    return std::pair{rc, read_file(dir_ / (name + ".log"))};
  };
  // The iterations worker 0 trained in job `name`.
  auto trained = [&](const std::string& name) {
    std::vector<std::uint64_t> its;
    std::ifstream in(dir_ / name / "w0.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.contains("iteration") && !j.contains("eval") && !j.contains("summary")) its.push_back(j.at("iteration"));
    }
    return its;
  };
  auto flip = [](const fs::path& file) {
    std::string bytes = read_file(file);
    for (std::size_t i = 0; i < 8; ++i) bytes[bytes.size() / 2 + i] = static_cast<char>(~bytes[bytes.size() / 2 + i]);
    write_file_atomic(file, bytes);
  };
  const fs::path ckpt = dir_ / "ckpt";
  {
    const auto [rc, log] = launch("first", ckpt, false, 19);
    ASSERT_EQ(rc, 0) << log;
  }
  for (const char* it : {"iter-000000009", "iter-000000019"}) ASSERT_TRUE(fs::exists(ckpt / "ps" / it / "manifest.json")) << it;
  for (const char* f : {"worker-0-iter-000000019.pt", "worker-1-iter-000000019.pt", "worker-0-iter-000000009.pt"})
    ASSERT_TRUE(fs::exists(ckpt / "dense" / f)) << f;
  auto copy_of = [&](const std::string& name) {
    const fs::path c = dir_ / name;
    fs::copy(ckpt, c, fs::copy_options::recursive);
    return c;
  };
  auto iters_from = [](std::uint64_t first, std::uint64_t end) {
    std::vector<std::uint64_t> v;
    for (std::uint64_t i = first; i < end; ++i) v.push_back(i);
    return v;
  };

  {  // A shard file of 19.
    const fs::path c = copy_of("ckpt-shard");
    const fs::path victim = c / "ps" / "iter-000000019" / "shard-1-of-2.ckpt";
    flip(victim);
    const auto [rc, log] = launch("shard", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000009").string() + ", passing over iter-000000019 (" +
                       victim.string() + ": checksum mismatch (corrupt checkpoint))"),
              std::string::npos)
        << log;
    EXPECT_EQ(trained("shard"), iters_from(9, 21));
  }
  {  // Worker 1's dense file of 19: it loads worker 0's.
    const fs::path c = copy_of("ckpt-dense1");
    const fs::path victim = c / "dense" / "worker-1-iter-000000019.pt";
    flip(victim);
    const auto [rc, log] = launch("dense1", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000019").string() + ": " + victim.string() +
                       ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << log;
    const std::string w1 = read_file(dir_ / "dense1" / "worker1.log");
    EXPECT_NE(w1.find("worker 1: --resume: passing over " + victim.string() + ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << w1;
    EXPECT_NE(
        w1.find("dense model and optimizer from " + (c / "dense" / "worker-0-iter-000000019.pt").string() + " (its own file is corrupt)"),
        std::string::npos)
        << w1;
    EXPECT_EQ(trained("dense1"), iters_from(19, 21));
  }
  {  // Every dense file of 19: back to 9.
    const fs::path c = copy_of("ckpt-dense");
    for (int w = 0; w < 2; ++w) flip(c / "dense" / ("worker-" + std::to_string(w) + "-iter-000000019.pt"));
    const auto [rc, log] = launch("dense", c, true, 21);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("ember-launch: --resume from " + (c / "ps" / "iter-000000009").string() + ", passing over iter-000000019 (" +
                       (c / "dense" / "worker-0-iter-000000019.pt").string() + ": checksum mismatch (corrupt dense checkpoint"),
              std::string::npos)
        << log;
    EXPECT_EQ(trained("dense"), iters_from(9, 21));
  }
  {  // Everything: refused, naming each.
    const fs::path c = copy_of("ckpt-all");
    for (const char* it : {"iter-000000009", "iter-000000019"}) flip(c / "ps" / it / "shard-0-of-2.ckpt");
    const auto [rc, log] = launch("all", c, true, 21);
    EXPECT_EQ(rc, 1) << log;
    for (const char* it : {"iter-000000009", "iter-000000019"}) {
      EXPECT_NE(
          log.find(std::string(it) + " (" + (c / "ps" / it / "shard-0-of-2.ckpt").string() + ": checksum mismatch (corrupt checkpoint))"),
          std::string::npos)
          << log;
    }
    EXPECT_NE(log.find("ember-launch: --resume: no checkpoint in " + (c / "ps").string() + " to resume from"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace ember::worker
