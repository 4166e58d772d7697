// A job resumed from a checkpoint ends with the uninterrupted job's model, whatever
// stopped it: a periodic checkpoint that is not the last, a stop at a checkpoint
// (SIGTERM), or kill -9 of a worker, of a shard or of the shard hosting the coordinator.
//
// DLRM with Adagrad on both sides is the hard case: an Adagrad step divides by the root
// of the accumulated squares, so the first steps of a row magnify float rounding, and a
// resumed job whose workers hold other rows than the uninterrupted one's (its caches
// empty, or the checkpoint's flush having changed them) sums the same gradients in
// another order and ends 0.1 away. The resumed worker's loader replays the scheduler
// from iteration 0 and pulls the rows it held (loader.h); flushes change no plan
// (LocationMap::flushed). Asserted within 1e-5; measured identical.
//
// Built twice: resume_test runs the cases below; resume_matrix_test (ctest label
// `long`, EMBER_RESUME_MATRIX) every policy x optimizer x mechanism.
#include <signal.h>

#include "job_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

constexpr double kExact = 1e-5;

class Resume : public JobTest {
 protected:
  // A job of 2 workers (the shape), 2 shards.
  static JobOptions two_workers(const std::string& policy, const std::string& optimizer) {
    JobOptions o;
    o.policy = policy;
    o.optimizer = optimizer;
    o.dense_optimizer = optimizer;
    o.workers = 2;
    o.batch = 64;
    o.iterations = 30;
    return o;
  }
  static void with_mechanisms(JobOptions& o) {
    o.lookahead = 2;
    o.prefetch = true;
    o.refine_allocation = o.policy == "herald";
    o.overlap_allreduce = true;
  }
  fs::path ckpt(const std::string& name) const { return dir_ / (name + "-ckpt"); }
  fs::path dense(const std::string& name) const { return dir_ / (name + "-dense"); }
  // `o` with its shards checkpointing into NAME-ckpt (all kept, plus `ps_extra`) and its
  // workers' dense state in NAME-dense.
  JobOptions checkpointed(JobOptions o, const std::string& name, const std::vector<std::string>& ps_extra) const {
    o.ps_args.insert(o.ps_args.end(), {"--checkpoint-dir", ckpt(name).string(), "--keep-checkpoints", "0"});
    o.ps_args.insert(o.ps_args.end(), ps_extra.begin(), ps_extra.end());
    o.worker_args.insert(o.worker_args.end(), {"--checkpoint-dir", dense(name).string(), "--keep-checkpoints", "0"});
    return o;
  }
  static JobOptions resumed_from(JobOptions o, const fs::path& checkpoint) {
    o.ps_args.insert(o.ps_args.end(), {"--restore", checkpoint.string()});
    o.worker_args.push_back("--resume");
    return o;
  }
  static void expect_same(const JobResult& want, const JobResult& got, const std::string& what) {
    ASSERT_FALSE(want.dump.rows.empty()) << what << ": no model dump of the uninterrupted job";
    ASSERT_FALSE(got.dump.rows.empty()) << what << ": no model dump of the resumed job";
    EXPECT_LE(max_abs_diff(want.dump.rows, got.dump.rows), kExact) << what << ": embedding rows";
    EXPECT_LE(max_abs_diff(want.dump.dense, got.dump.dense), kExact) << what << ": dense weights";
  }
  // The newest checkpoint under NAME-ckpt that is whole (its manifest) and has every
  // worker's dense state: what `ember_launch.py --resume` picks.
  fs::path newest_whole(const std::string& name, std::uint32_t workers) const {
    fs::path best;
    if (!fs::exists(ckpt(name))) return best;
    for (const auto& e : fs::directory_iterator(ckpt(name))) {
      const std::string dir = e.path().filename().string();
      if (dir.rfind("iter-0", 0) != 0 || !fs::exists(e.path() / "manifest.json")) continue;
      const std::uint64_t it = std::stoull(dir.substr(5));
      bool all = true;
      for (std::uint32_t w = 0; w < workers; ++w) all = all && fs::exists(dense_checkpoint_file(dense(name), w, it));
      if (all && (best.empty() || e.path().filename() > best.filename())) best = e.path();
    }
    return best;
  }

  // Runs `o` whole, checkpointing every 10 iterations, then resumes it from iteration
  // 19's checkpoint (neither the first nor the last) and expects the whole run's model.
  void expect_resume_from_periodic(const fs::path& data, const JobOptions& base, const std::string& name) {
    SCOPED_TRACE(name);
    const JobOptions o = checkpointed(base, name, {"--checkpoint-every", "10"});
    const JobResult whole = run_job(data, o, name);
    const fs::path at19 = ckpt(name) / "iter-000000019";
    ASSERT_TRUE(fs::exists(at19 / "manifest.json")) << at19;
    const JobResult resumed = run_job(data, resumed_from(o, at19), name + "-resumed");
    expect_same(whole, resumed, name + ", resumed from iteration 19");
  }
};

// The case (herald, DLRM, Adagrad), against a job that never checkpointed: the
// checkpoints' flushes change nothing either. Then the other policies, SGD, the
// lookahead mechanisms (window, eviction by next use, prefetch, refinement, overlapped
// all-reduce) and a placement (replicated, uncached and shared-cache tables).
TEST_F(Resume, FromAPeriodicCheckpointEveryPolicyEndsWithTheUninterruptedModel) {
  const fs::path data = dataset();
  {
    const JobOptions o = two_workers("herald", "adagrad");
    const JobResult plain = run_job(data, o, "plain");
    const JobOptions c = checkpointed(o, "issue", {"--checkpoint-every", "10"});
    const JobResult whole = run_job(data, c, "issue");
    expect_same(plain, whole, "herald + adagrad, checkpointing against never");
    const fs::path at19 = ckpt("issue") / "iter-000000019";
    EXPECT_GT(max_abs_diff(checkpoint_rows(ckpt("issue"), 19, ps::OptimizerConfig{ps::OptimizerKind::kAdagrad, 0.05f},
                                           whole.dump.rows.size() / kDim),
                           whole.dump.rows),
              1e-3)
        << "iterations 19-29 changed little: the resume below would prove nothing";
    const JobResult resumed = run_job(data, resumed_from(c, at19), "issue-resumed");
    expect_same(plain, resumed, "herald + adagrad, resumed from iteration 19");
    std::ifstream in(dir_ / "issue-resumed-w0.jsonl");
    std::uint64_t restored = 0;
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.value("summary", false)) restored = j.value("restored", std::uint64_t{0});
    }
    EXPECT_GT(restored, 0u) << "worker 0 held rows at the checkpoint: it pulls them back";
  }
  struct Case {
    const char* policy;
    const char* optimizer;
    bool mechanisms, placement;
  };
#ifdef EMBER_RESUME_MATRIX
  std::vector<Case> cases;
  for (const char* p : {"vanilla", "laia", "plan", "herald", "fae:0.05"})
    for (const char* opt : {"sgd", "adagrad"})
      for (int m = 0; m < 3; ++m) cases.push_back({p, opt, m == 1, m == 2});
#else
  // The default run: one case per sync mode and mechanism set (the matrix has the rest).
  const std::vector<Case> cases = {{"vanilla", "adagrad", false, false},
                                   {"fae:0.05", "adagrad", false, false},
                                   {"herald", "adagrad", true, false},
                                   {"plan", "sgd", true, false},
                                   {"herald", "adagrad", false, true}};
#endif
  const fs::path plan = mixed_placement(data);
  for (const Case& c : cases) {
    JobOptions o = two_workers(c.policy, c.optimizer);
    if (c.mechanisms) with_mechanisms(o);
    if (c.placement) o.placement = plan.string();
    std::string name = std::string(c.policy) + "-" + c.optimizer + (c.mechanisms ? "-mechanisms" : "") + (c.placement ? "-placement" : "");
    std::replace(name.begin(), name.end(), ':', '_');
    expect_resume_from_periodic(data, o, name);
  }
}

// Dynamic tables (hashed ids; rows made, expired and capped): the resumed loaders
// replay their key directories with their schedulers, the shards' resets of the first
// iteration come again, and the job ends with the uninterrupted model.
TEST_F(Resume, DynamicTablesEndWithTheUninterruptedModel) {
  const fs::path data = hashed_dataset();
  JobOptions o = two_workers("herald", "adagrad");
  with_dynamic_tables(o, 8192);
  expect_resume_from_periodic(data, o, "dynamic");
}

// Each live id's row of a dump of dynamic tables.
std::map<std::uint64_t, std::vector<float>> rows_by_id(const ModelDump& d) {
  std::map<std::uint64_t, std::vector<float>> by_id;
  for (std::size_t slot = 0; slot < d.slot_ids.size(); ++slot) {
    if (d.slot_ids[slot] == kNoId) continue;
    const float* r = d.rows.data() + slot * d.dim;
    EXPECT_TRUE(by_id.emplace(d.slot_ids[slot], std::vector<float>(r, r + d.dim)).second) << "id " << d.slot_ids[slot] << " twice";
  }
  return by_id;
}

// Every live id of `want` has a row in `got`, the same within kExact, and no id more.
void expect_rows_by_id(const ModelDump& want_dump, const ModelDump& got_dump) {
  const auto want = rows_by_id(want_dump), got = rows_by_id(got_dump);
  ASSERT_GT(want.size(), 100u);
  ASSERT_EQ(got.size(), want.size()) << "live rows";
  double diff = 0;
  for (const auto& [id, row] : want) {
    auto it = got.find(id);
    ASSERT_NE(it, got.end()) << "id " << id << " has no row after the resume";
    diff = std::max(diff, max_abs_diff(row, it->second));
  }
  EXPECT_LE(diff, kExact) << "rows by id";
}

// A checkpoint of dynamic tables restores on another shard count (and other slots a
// shard): the shards re-place its rows by id, the workers their key directories (kept in
// their dense checkpoints) alike, and the job goes on, caches empty, to the model of the
// uninterrupted job, id by id. (Without a cap: rows are made and expired by id alone,
// whatever the shards; a cap counts a shard's rows.)
TEST_F(Resume, DynamicTablesRestoreOnAnotherShardCount) {
  const fs::path data = hashed_dataset();
  JobOptions base = two_workers("herald", "sgd");
  base.worker_args.insert(base.worker_args.end(), {"--create-after", "2", "--expire-after", "4"});
  const auto on_slots = [&](std::uint32_t shards, std::uint64_t slots) {
    JobOptions o = base;
    o.shards = shards;
    o.ps_args.insert(o.ps_args.end(), {"--slots-per-shard", std::to_string(slots)});
    return o;
  };
  const JobOptions c = checkpointed(on_slots(2, 8192), "two", {"--checkpoint-every", "10"});
  const JobResult whole = run_job(data, c, "two");
  const fs::path at19 = ckpt("two") / "iter-000000019";
  ASSERT_TRUE(fs::exists(at19 / "manifest.json")) << at19;
  const auto want = rows_by_id(whole.dump);
  // The model of a resumed job, id by id, against the uninterrupted one's.
  const auto expect_whole = [&](const JobResult& resumed, std::uint32_t shards) {
    expect_rows_by_id(whole.dump, resumed.dump);
    EXPECT_LE(max_abs_diff(whole.dump.dense, resumed.dump.dense), kExact) << "dense weights";
    // The rows moved: the dump's slots are the new shards' (ascending ids on each).
    EXPECT_EQ(resumed.dump.slot_ids.size(), 16384u / shards * shards);
    std::size_t moved = 0;
    for (std::size_t slot = 0; slot < resumed.dump.slot_ids.size(); ++slot) {
      const std::uint64_t id = resumed.dump.slot_ids[slot];
      if (id == kNoId) continue;
      EXPECT_EQ(shard_of_id(id, shards), slot % shards);
      moved += slot >= whole.dump.slot_ids.size() || whole.dump.slot_ids[slot] != id;
    }
    EXPECT_GT(moved, want.size() / 2);
  };
  for (const std::uint32_t shards : {3u, 1u}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    // The workers resume from the dense state beside the checkpoint; the shards
    // checkpoint into a directory of their own.
    const std::string name = "on" + std::to_string(shards);
    JobOptions r = on_slots(shards, 16384 / shards);
    r.ps_args.insert(r.ps_args.end(), {"--checkpoint-dir", ckpt(name).string(), "--checkpoint-every", "10", "--keep-checkpoints", "0"});
    r.worker_args.insert(r.worker_args.end(), {"--checkpoint-dir", dense("two").string(), "--keep-checkpoints", "0"});
    expect_whole(run_job(data, resumed_from(r, at19), name), shards);
    if (shards != 3) continue;
    // Resumed again, on the same 3 shards, from the re-placed job's checkpoint of 29: its
    // slots do not follow from a replay of the batches (the directory says where they
    // were placed), and the job still ends with the uninterrupted model.
    const fs::path at29 = ckpt(name) / "iter-000000029";
    ASSERT_TRUE(fs::exists(at29 / "manifest.json")) << at29;
    expect_whole(run_job(data, resumed_from(r, at29), name + "-again"), shards);
  }
}

// A job on a stream resumes from the stream position its dense checkpoint keeps: the
// files read before it may be gone (here: removed), and the job ends with the
// uninterrupted model, id by id. Its shards serve dynamic tables without a dataset.
TEST_F(Resume, AStreamJobGoesOnFromItsCheckpointsPosition) {
  const fs::path in = dir_ / "stream";
  fs::create_directories(in);
  std::string log;
  for (const char* k : {"1", "2", "3"}) {
    ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 700 --scale 0.002 --new-ids 0.2 --seed " + k +
                                    " --force -o " + (in / (std::string("part-") + k + ".tsv")).string(),
                                log),
              0)
        << log;
  }
  JobOptions o = two_workers("herald", "sgd");
  o.iterations = 16;  // 16 x 128 of the 2,100 records
  o.stream = in.string();
  o.worker_args.insert(o.worker_args.end(), {"--create-after", "2", "--expire-after", "4"});
  o.ps_args.insert(o.ps_args.end(), {"--slots-per-shard", "8192"});
  const JobOptions c = checkpointed(o, "s", {"--checkpoint-every", "4"});
  const JobResult whole = run_job(in, c, "s");
  const fs::path at7 = ckpt("s") / "iter-000000007";
  ASSERT_TRUE(fs::exists(at7 / "manifest.json")) << at7;
  // Iteration 7 begins at record 896, in part-2: part-1 is no longer needed.
  fs::remove(in / "part-1.tsv");
  const JobResult resumed = run_job(in, resumed_from(c, at7), "s-resumed");
  expect_rows_by_id(whole.dump, resumed.dump);
  EXPECT_LE(max_abs_diff(whole.dump.dense, resumed.dump.dense), kExact) << "dense weights";
}

#ifndef EMBER_RESUME_MATRIX
// After each single fault, --resume from the newest checkpoint that is whole ends with
// the model of a job that was never interrupted (herald, DLRM, Adagrad, the lookahead
// mechanisms): a stop at a checkpoint (SIGTERM to shard 0, as the launcher's Ctrl-C),
// and kill -9 of a worker, of shard 1 and of shard 0 (the coordinator's host).
TEST_F(Resume, AfterEverySingleFaultTheJobEndsWithTheUninterruptedModel) {
  const fs::path data = dataset();
  JobOptions o = two_workers("herald", "adagrad");
  with_mechanisms(o);
  o.iterations = 60;
  const JobResult plain = run_job(data, o, "plain");

  // SIGTERM: the job stops at a checkpoint, every process exits 0.
  {
    const JobOptions c = checkpointed(o, "sigterm", {"--checkpoint-every", "10", "--checkpoint-on-exit"});
    run_job(data, c, "sigterm", [&](Processes& ps, Processes&) {
      wait_for_lines(dir_ / "sigterm-w0.jsonl", 12);
      ps[0]->signal(SIGTERM);
    });
    const fs::path at = newest_whole("sigterm", o.workers);
    ASSERT_FALSE(at.empty());
    EXPECT_NE(at.filename(), "iter-000000060") << "the job was not stopped";
    expect_same(plain, run_job(data, resumed_from(c, at), "sigterm-resumed"), "stopped by SIGTERM at " + at.filename().string());
  }
  // kill -9 of one process once a checkpoint is whole: the job fails; resumed from the
  // newest whole checkpoint.
  for (const char* victim : {"worker1", "ps1", "ps0"}) {
    SCOPED_TRACE(victim);
    const std::string name = std::string("kill-") + victim;
    const JobOptions c = checkpointed(o, name, {"--checkpoint-every", "10"});
    Processes ps;
    const std::string coord = start_ps(data, c, name, ps);
    ASSERT_FALSE(coord.empty());
    Processes workers = start_workers(data, c, coord, name);
    for (auto until = std::chrono::steady_clock::now() + 120s;
         std::chrono::steady_clock::now() < until && newest_whole(name, o.workers).empty();)
      std::this_thread::sleep_for(10ms);
    const fs::path before = newest_whole(name, o.workers);
    ASSERT_FALSE(before.empty()) << "no checkpoint was written:\n" << workers[0]->log_tail(20);
    test::Process& p = std::string(victim) == "worker1" ? *workers[1] : *ps[victim[2] == '1' ? 1 : 0];
    p.signal(SIGKILL);
    for (auto& w : workers) EXPECT_NE(w->wait(60s), 0) << "the job went on without " << victim;
    for (auto& s : ps) s->wait(60s);
    const fs::path at = newest_whole(name, o.workers);
    ASSERT_FALSE(at.empty());
    EXPECT_NE(at.filename(), "iter-000000060") << victim << " was killed after the job ended";
    expect_same(plain, run_job(data, resumed_from(c, at), name + "-resumed"),
                std::string("kill -9 of ") + victim + ", resumed from " + at.filename().string());
  }
}
#endif

}  // namespace
}  // namespace ember::worker
