// The fixture of the multi-process training tests: a small Criteo-like dataset, and
// jobs of real ember-ps shards and ember-worker processes on loopback (ZeroMQ control
// plane, TCP rows, Gloo all-reduce, LibTorch), with their summed wire counts, their
// model dumps and one-process reference training to compare against.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

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
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/plan_file.h"
#include "ember/worker/dense_files.h"
#include "ember/worker/trainer.h"
#include "reference.h"

namespace ember::worker::test_jobs {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr std::uint32_t kWorkers = 4, kBatch = 32, kDim = 8, kIterations = 10;
constexpr std::uint64_t kSeed = 3;
const std::string kToken = "train-token";

struct JobOptions {
  std::string policy = "herald";
  std::string optimizer = "sgd";
  std::uint32_t shards = 2;
  std::uint32_t workers = kWorkers, batch = kBatch;
  std::uint64_t iterations = kIterations;
  std::string cache_ratio = "0.15";
  std::string model = "dlrm";
  std::string model_file;       // --model-file (instead of --model)
  std::string pooling = "sum";  // --pooling (multi-hot datasets)
  std::string cache_backend = "auto";
  std::string device = "cpu";
  std::string dense_optimizer = "sgd";
  std::uint32_t lookahead = 0;
  std::string eviction = "auto";
  bool prefetch = false, overlap_allreduce = false, refine_allocation = false;
  std::uint64_t eval_every = 0;        // flushes (ember-sim replays them)
  std::string placement;               // a plan file (--placement)
  std::uint32_t workers_per_host = 0;  // > 0: workers grouped into virtual hosts (--host vhostK)
  int ps_on_host = -1;                 // >= 0: the shards on virtual host K (ember-ps --host vhostK)
  std::string allreduce = "flat";
  bool host_aggregation = false;                  // --host-aggregation (ember-sim's links_aggregated then)
  bool host_allocation = false;                   // --host-allocation
  bool peer_sync = false;                         // --peer-sync
  std::string cache_admission = "none";           // --cache-admission
  std::vector<std::string> ps_args, worker_args;  // appended to every shard's / worker's
  std::vector<std::string> sim_args;              // appended to ember-sim's (simulate)
  std::string stream;                             // the workers train on --stream DIR, not --dataset
};

struct JobResult {
  ModelDump dump;
  // The workers' summaries summed over workers: the rows their plans listed, by kind
  // ("pulls", "flush_value", ...), bytes ("bytes.KIND", "framed.KIND") and links.
  std::map<std::string, std::uint64_t> reported;
  // What the shards served (ember-ps --summary-file "served"), summed over shards:
  // "KIND.rows", "KIND.requests", "KIND.bytes_in", "KIND.bytes_out" for KIND pull,
  // pull_state, prefetch, push_grad, push_value, commit, read. Counted by the shards, apart
  // from anything the workers or their schedulers count.
  std::map<std::string, std::uint64_t> served;
  double auc = -1;
};

// The rows the shards served for training (every pull but reads outside it: evaluations,
// dumps, loads), and pushed to them.
inline std::uint64_t served_pulls(const JobResult& job) {
  return job.served.at("pull.rows") + job.served.at("pull_state.rows") + job.served.at("prefetch.rows");
}
// The payload the shards served for training (what ember-sim's bytes count): each
// request's and reply's bytes less their 48-byte headers.
inline std::uint64_t served_payload(const JobResult& job) {
  std::uint64_t n = 0;
  for (const char* kind : {"pull", "pull_state", "prefetch", "push_grad", "push_value"}) {
    const std::string k = kind;
    n += job.served.at(k + ".bytes_in") + job.served.at(k + ".bytes_out") - 2 * 48 * job.served.at(k + ".requests");
  }
  return n;
}
// Every byte the shards received and sent, all kinds (reads and commits too).
inline std::uint64_t served_bytes(const JobResult& job) {
  std::uint64_t n = 0;
  for (const char* kind : {"pull", "pull_state", "prefetch", "push_grad", "push_value", "commit", "read"})
    n += job.served.at(std::string(kind) + ".bytes_in") + job.served.at(std::string(kind) + ".bytes_out");
  return n;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline std::uint64_t transmissions(const std::map<std::string, std::uint64_t>& w) {
  return w.at("pulls") + w.at("push_grad") + w.at("push_value") + w.at("push_evict");
}

inline void expect_same_model(const ReferenceResult& ref, const JobResult& job, const std::string& what, double tolerance = 2e-5) {
  ASSERT_FALSE(job.dump.dense.empty()) << what << ": no model dump";
  EXPECT_EQ(job.dump.dense.size(), ref.dense.size()) << what;
  EXPECT_EQ(job.dump.rows.size(), ref.rows.size()) << what;
  EXPECT_LT(max_abs_diff(ref.dense, job.dump.dense), tolerance) << what << ": dense weights differ from one-process training";
  EXPECT_LT(max_abs_diff(ref.rows, job.dump.rows), tolerance) << what << ": embedding rows differ from one-process training";
}

// The rows of a PS checkpoint: every shard's file of iteration `it` under `root`,
// loaded into one store (rows never trained are initialized from the seed, as anywhere).
inline std::vector<float> checkpoint_rows(const fs::path& root, std::uint64_t it, const ps::OptimizerConfig& sparse,
                                          std::uint64_t num_keys) {
  const ps::RestorePlan plan = ps::plan_restore(ps::checkpoint_dir(root, static_cast<std::int64_t>(it)));
  ps::StoreConfig sc;
  sc.num_keys = num_keys;
  sc.dim = kDim;
  sc.seed = kSeed;
  sc.optimizer = sparse;
  ps::ShardStore store(sc);
  EXPECT_EQ(store.load(plan.files), static_cast<std::int64_t>(it)) << plan.dir;
  std::vector<float> rows(num_keys * kDim);
  for (Key k = 0; k < num_keys; ++k) std::memcpy(&rows[k * kDim], store.row(k), kDim * sizeof(float));
  return rows;
}

class JobTest : public test::TempDirTest {
 protected:
  // How far a job may stray from one-process training (float rounding of sums taken in
  // another order); a test of a model that magnifies it raises it.
  double one_process_tolerance_ = 2e-5;

  // `bags`: ember-data gen --multi-hot's sizes (a multi-hot dataset, bags split by '|').
  fs::path dataset(std::uint64_t rows = 8000, const std::string& bags = "") {
    fs::path tsv = dir_ / "data.tsv", out = dir_ / "data";
    std::string log;
    const std::string gen_bags = bags.empty() ? "" : " --multi-hot " + bags + " --multi-hot-dist zipf";
    const std::string prep_bags = bags.empty() ? "" : " --multi-hot-sep '|'";
    const std::string cmd = test::bin("ember-data") + " gen --like criteo --rows " + std::to_string(rows) + gen_bags +
                            " --scale 0.0005 --seed 7 --force -o " + tsv.string() + " && " + test::bin("ember-data") + " prep" + prep_bags +
                            " --format criteo --val-fraction 0.1 --force -o " + out.string() + " " + tsv.string();
    EXPECT_EQ(test::run_command(cmd, log), 0) << log;
    return out;
  }

  // A dataset of hashed ids (ember-data prep --ids hash) whose ids keep coming
  // (gen --new-ids 0.2).
  fs::path hashed_dataset(std::uint64_t rows = 6000) {
    const fs::path tsv = dir_ / "hashed.tsv", out = dir_ / "hashed";
    std::string log;
    const std::string cmd = test::bin("ember-data") + " gen --like criteo --rows " + std::to_string(rows) +
                            " --scale 0.002 --new-ids 0.2 --seed 7 --force -o " + tsv.string() + " && " + test::bin("ember-data") +
                            " prep --ids hash --format criteo --val-fraction 0.1 --force -o " + out.string() + " " + tsv.string();
    EXPECT_EQ(test::run_command(cmd, log), 0) << log;
    return out;
  }
  // Dynamic tables' options on `o`: shards of `slots` slots, rows made after 2 batches,
  // expired after 4 iterations, capped at 400 a shard.
  static void with_dynamic_tables(JobOptions& o, std::uint64_t slots) {
    o.ps_args.insert(o.ps_args.end(), {"--slots-per-shard", std::to_string(slots)});
    o.worker_args.insert(o.worker_args.end(), {"--create-after", "2", "--expire-after", "4", "--shard-max-rows", "400"});
  }

  TrainConfig reference_config(const fs::path& data, const JobOptions& o) {
    TrainConfig c;
    c.dataset = data.string();
    c.workers = o.workers;
    c.batch_per_worker = o.batch;
    c.iterations = o.iterations;
    c.seed = kSeed;
    c.model.kind = o.model;
    c.model.file = o.model_file;
    c.model.pooling = o.pooling;
    c.model.bottom = {16};
    c.model.top = {16};
    c.model.deep = {16};
    c.dense_lr = 0.05f;
    c.dense_optimizer = o.dense_optimizer;
    return c;
  }

  std::vector<std::string> worker_args(const fs::path& data, const JobOptions& o, const std::string& coord, const std::string& name,
                                       int rank) {
    fs::path metrics = dir_ / (name + "-w" + std::to_string(rank) + ".jsonl");
    std::vector<std::string> a = test::worker_command(data, coord, {"--token", kToken}, o.workers, rank);
    if (!o.stream.empty()) a[1] = "--stream", a[2] = o.stream;  // in place of --dataset DATA
    a.insert(a.end(), {"--policy",
                       o.policy,
                       "--model",
                       o.model,
                       "--bottom-mlp",
                       "16",
                       "--top-mlp",
                       "16",
                       "--deep-mlp",
                       "16",
                       "--batch-per-worker",
                       std::to_string(o.batch),
                       "--cache-ratio",
                       o.cache_ratio,
                       "--iterations",
                       std::to_string(o.iterations),
                       "--seed",
                       std::to_string(kSeed),
                       "--dense-lr",
                       "0.05",
                       "--metrics",
                       metrics.string(),
                       "--heartbeat-timeout-ms",
                       "3000",
                       "--log-level",
                       "warn",
                       "--cache-backend",
                       o.cache_backend,
                       "--device",
                       o.device,
                       "--dense-optimizer",
                       o.dense_optimizer,
                       "--lookahead",
                       std::to_string(o.lookahead),
                       "--eviction",
                       o.eviction});
    if (o.prefetch) a.push_back("--prefetch");
    if (o.refine_allocation) a.push_back("--refine-allocation");
    if (o.eval_every > 0) a.insert(a.end(), {"--eval-every", std::to_string(o.eval_every)});
    if (o.overlap_allreduce) a.push_back("--overlap-allreduce");
    if (!o.placement.empty()) a.insert(a.end(), {"--placement", o.placement});
    if (o.workers_per_host > 0)
      a.insert(a.end(), {"--host", "vhost" + std::to_string(static_cast<std::uint32_t>(rank) / o.workers_per_host)});
    if (o.allreduce != "flat") a.insert(a.end(), {"--allreduce", o.allreduce});
    if (o.host_aggregation) a.push_back("--host-aggregation");
    if (o.host_allocation) a.push_back("--host-allocation");
    if (o.peer_sync) a.push_back("--peer-sync");
    if (o.cache_admission != "none") a.insert(a.end(), {"--cache-admission", o.cache_admission});
    if (!o.model_file.empty()) a.insert(a.end(), {"--model-file", o.model_file});
    if (o.pooling != "sum") a.insert(a.end(), {"--pooling", o.pooling});
    a.insert(a.end(), o.worker_args.begin(), o.worker_args.end());
    if (rank == 0) {
      a.push_back("--dump-dir");
      a.push_back((dir_ / (name + "-model")).string());
    }
    return a;
  }

  // Starts the shards; returns the coordinator endpoint.
  std::string start_ps(const fs::path& data, const JobOptions& o, const std::string& name,
                       std::vector<std::unique_ptr<test::Process>>& ps) {
    fs::path coord_file = dir_ / (name + ".coord");
    fs::remove(coord_file);  // a job of the same name ran before: never read its endpoint
    std::string coord;
    for (std::uint32_t s = 0; s < o.shards; ++s) {
      std::vector<std::string> a = test::ps_command({.data = data,
                                                     .shard = s,
                                                     .shards = o.shards,
                                                     .dim = kDim,
                                                     .workers = o.workers,
                                                     .optimizer = o.optimizer,
                                                     .token = kToken,
                                                     .coordinator = coord,
                                                     .seed = kSeed,
                                                     .coord_file = coord_file});
      if (!o.stream.empty()) a.erase(a.begin() + 1, a.begin() + 3);  // no --dataset: dynamic tables by --slots-per-shard
      a.insert(a.end(), {"--summary-file", (dir_ / (name + "-ps" + std::to_string(s) + ".json")).string()});
      if (o.ps_on_host >= 0) a.insert(a.end(), {"--host", "vhost" + std::to_string(o.ps_on_host)});
      a.insert(a.end(), o.ps_args.begin(), o.ps_args.end());
      ps.push_back(std::make_unique<test::Process>(a, dir_ / (name + "-ps" + std::to_string(s) + ".log")));
      if (s == 0) {
        coord = test::wait_for_file(coord_file, 20s);
        if (coord.empty()) ADD_FAILURE() << "ember-ps 0 did not start:\n" << ps[0]->log_tail(20);
      }
    }
    return coord;
  }

  using Processes = std::vector<std::unique_ptr<test::Process>>;
  // Starts job `name`'s o.workers workers against `coord`, each logging to NAME-wW.log.
  Processes start_workers(const fs::path& data, const JobOptions& o, const std::string& coord, const std::string& name) {
    Processes workers;
    for (std::uint32_t w = 0; w < o.workers; ++w)
      workers.push_back(std::make_unique<test::Process>(worker_args(data, o, coord, name, static_cast<int>(w)),
                                                        dir_ / (name + "-w" + std::to_string(w) + ".log")));
    return workers;
  }
  // `during` runs once the workers are started (given the shards and the workers).
  JobResult run_job(const fs::path& data, const JobOptions& o, const std::string& name,
                    const std::function<void(Processes& ps, Processes& workers)>& during = nullptr) {
    Processes ps;
    const std::string coord = start_ps(data, o, name, ps);
    JobResult r;
    if (coord.empty()) return r;
    Processes workers = start_workers(data, o, coord, name);
    if (during) during(ps, workers);
    for (std::uint32_t w = 0; w < o.workers; ++w) {
      int rc = workers[w]->wait(240s);
      EXPECT_EQ(rc, 0) << name << " worker " << w << " failed:\n" << workers[w]->log_tail(20);
    }
    for (std::uint32_t s = 0; s < o.shards; ++s) {
      EXPECT_EQ(ps[s]->wait(30s), 0) << name << " ps " << s << ":\n" << ps[s]->log_tail(20);
    }
    for (std::uint32_t s = 0; s < o.shards; ++s) {
      std::ifstream in(dir_ / (name + "-ps" + std::to_string(s) + ".json"));
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.empty()) continue;              // a shard killed (a fault test): nothing served to compare
      const json summary = json::parse(text);  // (alive while its items are read)
      for (const auto& [kind, n] : summary.at("served").items())
        for (const auto& [field, v] : n.items()) r.served[kind + "." + field] += v.get<std::uint64_t>();
    }
    for (std::uint32_t w = 0; w < o.workers; ++w) {
      std::ifstream in(dir_ / (name + "-w" + std::to_string(w) + ".jsonl"));
      for (std::string line; std::getline(in, line);) {
        auto j = json::parse(line);
        if (!j.value("summary", false)) continue;
        for (const char* k : {"pulls", "push_grad", "push_value", "push_evict", "hits", "hot_sync", "hot_flush", "pull_state", "prefetched",
                              "flush_grad", "flush_value", "eval_handed", "peer_value", "peer_grad", "allreduce_bytes",
                              "allreduce_cross_host_bytes", "hosts", "scheduler_exchange_bytes_out", "scheduler_exchange_bytes_in"})
          r.reported[k] += j.value(k, std::uint64_t{0});
        for (const auto& [kind, n] : j.at("bytes").items()) r.reported["bytes." + kind] += n.get<std::uint64_t>();
        // By link class: "links.cross_host.pull" (rows), "links.cross_host.ps_bytes_out", ...
        for (const auto& [link, l] : j.at("links").items()) {
          // Rows handed within the host (per-host aggregation) count on its link as the
          // PS rows they stand for.
          for (const char* rows : {"ps_rows", "relay_rows"})
            for (const auto& [kind, n] : l.at(rows).items()) r.reported["links." + link + "." + kind] += n.get<std::uint64_t>();
          for (const char* k : {"ps_bytes_out", "ps_bytes_in", "peer_bytes_out", "peer_bytes_in", "relay_bytes_out", "relay_bytes_in"})
            r.reported["links." + link + "." + k] += l.at(k).get<std::uint64_t>();
        }
        for (const auto& [k, n] : j.at("framed_bytes").items()) r.reported["framed." + k] += n.get<std::uint64_t>();
        if (w == 0) r.auc = j.at("auc");
        // Dynamic tables: each shard's rows made and dropped (every worker's alike).
        if (w == 0 && j.contains("dynamic_rows")) add_dynamic_rows(j.at("dynamic_rows"), r.reported);
        // Where the time went: every phase measured, adding up to the training loop's wall
        // time (the phases cover it all: waits, flushes and evaluations included).
        double phases = 0;
        for (const char* k :
             {"wait", "sync", "commit", "pull", "embedding", "compute", "allreduce", "dense_step", "push", "update", "flush"}) {
          const double x = j.at("phase_s").at(k);
          EXPECT_GE(x, 0) << name << " worker " << w << " phase " << k;
          phases += x;
        }
        EXPECT_GT(j.at("phase_s").at("compute").get<double>(), 0) << name;
        EXPECT_GT(j.at("phase_s").at("commit").get<double>(), 0) << name;  // one barrier + commit per iteration
        EXPECT_GT(j.at("phase_s").at("embedding").get<double>(), 0) << name;
        EXPECT_LE(phases, j.at("seconds").get<double>() * 1.0001) << name;
        EXPECT_GE(phases, j.at("seconds").get<double>() * 0.9) << name;
      }
    }
    if (fs::exists(dir_ / (name + "-model") / "model.json")) r.dump = read_dump((dir_ / (name + "-model")).string());
    return r;
  }

  // A placement (ember-plan's plan file) with every treatment: the two smallest tables and
  // the largest replicated, two mid-size tables uncached, the rest cached, one of them in
  // a cache share of its own.
  fs::path mixed_placement(const fs::path& data) {
    const data::Dataset ds = data::Dataset::open(data);
    const auto& tables = ds.manifest().tables;
    std::vector<std::size_t> by_rows(tables.size());
    std::iota(by_rows.begin(), by_rows.end(), std::size_t{0});
    std::stable_sort(by_rows.begin(), by_rows.end(), [&](std::size_t a, std::size_t b) { return tables[a].rows < tables[b].rows; });
    scheduler::PlanFile plan;
    std::uint64_t total = 0;
    for (const auto& t : tables) {
      plan.names.push_back(t.name);
      plan.rows.push_back(t.rows);
      total += t.rows;
    }
    plan.treatments.assign(tables.size(), scheduler::Treatment::kCache);
    for (std::size_t i : {by_rows[0], by_rows[1], by_rows.back()}) plan.treatments[i] = scheduler::Treatment::kReplicated;
    for (std::size_t i : {by_rows[by_rows.size() / 2], by_rows[by_rows.size() - 2]}) plan.treatments[i] = scheduler::Treatment::kUncached;
    plan.cache_rows = static_cast<std::uint32_t>(total / 8);
    // A large cached table with a cache share of its own (an LRU of total / 40 rows).
    plan.cache_shares.assign(tables.size(), 0);
    plan.cache_shares[by_rows[by_rows.size() - 3]] = static_cast<std::uint32_t>(total / 40);
    const fs::path plan_file = dir_ / "plan.json";
    scheduler::write_plan(plan_file, plan);
    return plan_file;
  }

  // Runs `o` as a job and trains the same batches in one process (sparse optimizer
  // o.optimizer with the PS's learning rate); expects the same model; returns the job.
  JobResult run_job_like_one_process(const fs::path& data, const JobOptions& o, const std::string& name, const std::string& what) {
    ps::OptimizerConfig sparse;
    sparse.kind = ps::parse_optimizer(o.optimizer);
    sparse.lr = 0.05f;
    const ReferenceResult ref = train_reference(reference_config(data, o), sparse, kDim);
    JobResult job = run_job(data, o, name);
    expect_same_model(ref, job, what, one_process_tolerance_);
    return job;
  }

  // A herald job (wide-deep: dlrm's first Adagrad steps magnify float rounding past 2e-5,
  // with or without checkpoints) whose shards checkpoint into dir_/ckpt (and take
  // `ps_extra`) and whose workers save their dense state into dir_/dense.
  JobOptions checkpointing_job(const std::vector<std::string>& ps_extra) {
    JobOptions o;
    o.policy = "herald";
    o.model = "wide-deep";
    o.ps_args = {"--checkpoint-dir", (dir_ / "ckpt").string()};
    o.ps_args.insert(o.ps_args.end(), ps_extra.begin(), ps_extra.end());
    o.worker_args = {"--checkpoint-dir", (dir_ / "dense").string()};
    return o;
  }

  // A 2 x 2 herald + Adagrad job `o` (checkpointing_job's, checkpointing every 4)
  // trains the one-process model; resumed from its checkpoint of iteration 7 it ends bit
  // for bit as the uninterrupted job. `what` names the job; the whole job's result.
  JobResult expect_resumes_exactly(const fs::path& data, JobOptions o, const std::string& name, const std::string& what) {
    o.optimizer = "adagrad";
    o.dense_optimizer = "adagrad";
    o.workers_per_host = 2;
    const JobResult whole = run_job_like_one_process(data, o, name + "-whole", what + ", checkpointing");
    const std::vector<float> at7 = expect_checkpoint_of(data, o, 7);
    EXPECT_GT(max_abs_diff(at7, whole.dump.rows), 1e-4) << "iterations 7-9 changed nothing: the resume proves nothing";
    JobOptions resumed = o;
    resumed.ps_args = {"--restore", (dir_ / "ckpt" / "iter-000000007").string()};
    resumed.worker_args.push_back("--resume");
    const JobResult r = run_job_like_one_process(data, resumed, name + "-resumed", what + ", resumed at iteration 7");
    EXPECT_EQ(max_abs_diff(whole.dump.rows, r.dump.rows), 0.0) << what;
    EXPECT_EQ(max_abs_diff(whole.dump.dense, r.dump.dense), 0.0) << what;
    return whole;
  }

  // Expects the checkpoint of iteration `it` to hold one-process training of `it`
  // iterations, and every worker's dense state of it to be written; returns its rows.
  std::vector<float> expect_checkpoint_of(const fs::path& data, const JobOptions& o, std::uint64_t it) {
    ps::OptimizerConfig sparse;
    sparse.kind = ps::parse_optimizer(o.optimizer);
    sparse.lr = 0.05f;
    JobOptions part = o;
    part.iterations = it;
    const ReferenceResult ref = train_reference(reference_config(data, part), sparse, kDim);
    std::vector<float> rows = checkpoint_rows(dir_ / "ckpt", it, sparse, ref.rows.size() / kDim);
    EXPECT_LT(max_abs_diff(ref.rows, rows), one_process_tolerance_)
        << "the checkpoint of iteration " << it << " is not the model of " << it << " iterations";
    for (std::uint32_t w = 0; w < o.workers; ++w) {
      const fs::path file = dense_checkpoint_file(dir_ / "dense", w, it);
      EXPECT_TRUE(fs::exists(file)) << file;
    }
    return rows;
  }

  // The iteration a stopped job stopped at, from worker 0's `metrics`; expects it before
  // o.iterations, with iterations 0 .. it - 1 trained and no more (0 if not stopped).
  static std::uint64_t expect_stopped(const fs::path& metrics, const JobOptions& o) {
    std::uint64_t stopped = 0, trained = 0;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.value("summary", false)) stopped = j.at("stopped_at");
      if (j.contains("iteration") && !j.contains("eval")) ++trained;
    }
    EXPECT_GT(stopped, 0u) << "the job was not stopped";
    EXPECT_LT(stopped, o.iterations);
    EXPECT_EQ(trained, stopped) << "iterations 0 .. stopped - 1 trained, no more";
    return stopped;
  }

  // A stopped job's checkpoint (checkpointing_job's): the iteration worker 0's `metrics`
  // say it stopped at (expect_stopped), and the one checkpoint directory, which must be
  // that iteration's, whole (a manifest: every shard wrote it) and hold one-process
  // training of that many iterations. An empty `dir` when a fatal check failed.
  struct StoppedAt {
    std::uint64_t iteration = 0;
    fs::path dir;
  };
  // Runs job `name` of `o`, calls `signal` once worker 0 has trained 2 iterations, and
  // expects the job stopped at a checkpoint (expect_stopped_at_a_checkpoint).
  StoppedAt run_and_stop(const fs::path& data, const JobOptions& o, const std::string& name,
                         const std::function<void(Processes& ps, Processes& workers)>& signal) {
    const fs::path metrics = dir_ / (name + "-w0.jsonl");
    run_job(data, o, name, [&](Processes& ps, Processes& workers) {
      wait_for_lines(metrics, 2);
      signal(ps, workers);
    });
    return expect_stopped_at_a_checkpoint(data, o, metrics);
  }
  StoppedAt expect_stopped_at_a_checkpoint(const fs::path& data, const JobOptions& o, const fs::path& metrics) {
    StoppedAt s;
    s.iteration = expect_stopped(metrics, o);
    const fs::path ckpt = dir_ / "ckpt";
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(ckpt)) dirs.push_back(e.path());
    EXPECT_EQ(dirs.size(), 1u) << "the stop's checkpoint alone (kept as the exit checkpoint)";
    if (dirs.size() != 1) return s;
    EXPECT_EQ(dirs[0], ps::checkpoint_dir(ckpt, static_cast<std::int64_t>(s.iteration)));
    EXPECT_TRUE(fs::exists(dirs[0] / "manifest.json")) << dirs[0] << ": every shard wrote it";
    if (!fs::exists(dirs[0] / "manifest.json")) return s;
    expect_checkpoint_of(data, o, s.iteration);
    s.dir = dirs[0];
    return s;
  }

  // Waits (60 s at most) until `file` has `n` lines: a worker's metrics, n iterations in.
  static void wait_for_lines(const fs::path& file, int n) {
    for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(20ms)) {
      std::ifstream in(file);
      int lines = 0;
      for (std::string line; std::getline(in, line);) ++lines;
      if (lines >= n) return;
    }
  }

  // The rows the workers' plans listed, kind by kind (the summary's counts), against
  // ember-sim's: the schedulers in the workers plan as ember-sim does (same options, data
  // and seed). The plans, not the wire: expect_served_as_simulated checks the wire.
  static void expect_plans_as_simulated(const JobResult& job, const std::map<std::string, std::uint64_t>& sim, const std::string& what) {
    for (const auto& [k, n] : sim) {
      if (k.rfind("ps.", 0) == 0 || k.rfind("bytes.", 0) == 0 || k.rfind("links.", 0) == 0) continue;
      if (k == "not_admitted") continue;  // the simulator's alone (in pulls and push_grad for the workers)
      EXPECT_EQ(job.reported.count(k) ? job.reported.at(k) : 0, n) << what << ": rows of kind " << k << " in the plans vs ember-sim";
    }
  }

  // "dynamic.S.FIELD": shard S's rows live, created, refused, expired and capped, from a
  // summary's or ember-sim's "dynamic_rows".
  static void add_dynamic_rows(const json& d, std::map<std::string, std::uint64_t>& out) {
    for (std::size_t s = 0; s < d.at("per_shard").size(); ++s)
      for (const char* f : {"live", "created", "refused", "expired", "capped"})
        out["dynamic." + std::to_string(s) + "." + f] = d.at("per_shard")[s].at(f).get<std::uint64_t>();
  }

  // The shards' served counts against ember-sim's prediction (simulate's "ps.*"): rows
  // pulled and pushed by kind, prefetched rows, and (without per-host aggregation, whose
  // hand-offs change which pulls carry state) the payload. Counted by the shards, so a
  // request the workers dropped or sent twice shows here.
  static void expect_served_as_simulated(const JobResult& job, std::map<std::string, std::uint64_t>& sim, const JobOptions& o,
                                         const std::string& what) {
    ASSERT_FALSE(job.served.empty()) << what << ": the shards wrote no summary";
    EXPECT_EQ(served_pulls(job), sim["ps.pull"]) << what << ": rows the shards served for pulls, vs ember-sim";
    EXPECT_EQ(job.served.at("push_grad.rows"), sim["ps.push_grad"]) << what << ": gradients the shards received, vs ember-sim";
    EXPECT_EQ(job.served.at("push_value.rows"), sim["ps.push_value"]) << what << ": values the shards received, vs ember-sim";
    if (!o.host_aggregation) {
      EXPECT_EQ(job.served.at("prefetch.rows"), sim["prefetched"]) << what << ": rows the shards served ahead, vs ember-sim";
      EXPECT_EQ(served_payload(job), sim["ps.payload"]) << what << ": payload bytes the shards served, vs ember-sim";
    }
  }

  // ember-sim's prediction for the same data, seed, policy and lookahead (no warm-up;
  // the job's final flush): rows per kind, pulls with state, flushed rows, and payload
  // bytes per kind.
  std::map<std::string, std::uint64_t> simulate(const fs::path& data, const JobOptions& o) {
    std::string out;
    const std::string cmd =
        test::bin("ember-sim") + " --dataset " + data.string() + " --policy " + o.policy + " --workers " + std::to_string(o.workers) +
        " --batch-per-worker " + std::to_string(o.batch) + " --cache-ratio " + o.cache_ratio + " --iterations " +
        std::to_string(o.iterations) + " --warmup 0 --seed " + std::to_string(kSeed) + " --lookahead " + std::to_string(o.lookahead) +
        " --eviction " + o.eviction + " --dim " + std::to_string(kDim) + " --optimizer " + o.optimizer + (o.prefetch ? " --prefetch" : "") +
        (o.refine_allocation ? " --refine-allocation" : "") + (o.placement.empty() ? "" : " --placement " + o.placement) +
        " --eval-every " + std::to_string(o.eval_every) + (o.host_allocation ? " --host-allocation" : "") +
        (o.peer_sync ? " --peer-sync" : "") + " --cache-admission " + o.cache_admission +
        (std::ranges::count(o.worker_args, "--scheduler-per-host") > 0 ? " --scheduler-per-host" : "") +
        (o.workers_per_host > 0 ? " --ps " + std::to_string(o.shards) + " --hosts " + std::to_string(o.workers / o.workers_per_host) +
                                      " --ps-hosts " + (o.ps_on_host >= 0 ? std::to_string(o.ps_on_host) : std::string("own"))
                                : std::string()) +
        [&o] {
          std::string extra;
          for (const std::string& a : o.sim_args) extra += " " + a;
          return extra;
        }() +
        " --json -q 2>/dev/null";
    EXPECT_EQ(test::run_command(cmd, out), 0) << out;
    auto j = json::parse(out.substr(0, out.find('\n')));
    std::map<std::string, std::uint64_t> m;
    for (const char* k : {"pulls", "push_grad", "push_value", "push_evict", "pull_state", "prefetched", "flush_grad", "flush_value",
                          "eval_handed", "peer_value", "peer_grad", "hot_sync", "hot_flush", "not_admitted"}) {
      m[k] = j.at(k);
    }
    for (const auto& [kind, n] : j.at("bytes").items()) m["bytes." + kind] = n.get<std::uint64_t>();
    if (j.contains("dynamic_rows")) add_dynamic_rows(j.at("dynamic_rows"), m);
    // What the shards serve for the training ("ps.*", compared with JobResult::served):
    // pulls; gradients (sync, partial evictions, flushes); values (write-backs, dirty
    // evictions, flushes, replicated rows written back); per-host aggregation's sums
    // once per host (links_aggregated); the payload without peer sync's hand-offs.
    const auto add_ps = [&m, &j](const json& c) {
      // (The totals leave partial evictions out; the per-table counts, which add up to
      // them, have them.)
      std::uint64_t partial = 0;
      if (c.contains("evict_partial")) {
        partial = c.at("evict_partial");
      } else {
        for (const auto& t : j.at("tables")) partial += t.at("evict_partial").get<std::uint64_t>();
      }
      m["ps.pull"] += c.at("pulls").get<std::uint64_t>();
      m["ps.push_grad"] += c.at("push_grad").get<std::uint64_t>() + partial + c.at("flush_grad").get<std::uint64_t>();
      m["ps.push_value"] += c.at("push_value").get<std::uint64_t>() + c.at("push_evict").get<std::uint64_t>() - partial +
                            c.at("flush_value").get<std::uint64_t>() + c.at("hot_flush").get<std::uint64_t>();
    };
    if (j.contains("links")) {
      // Aggregation takes repeats off the cross-host link only (rows of a shard on another
      // host); what stays within a host is each worker's own.
      add_ps(j.at("links").at("intra_host"));
      add_ps(j.at(o.host_aggregation ? "links_aggregated" : "links").at("cross_host"));
    } else {
      add_ps(j);
    }
    m["ps.payload"] = m["bytes.total"] - m["bytes.peer"];
    // By link class (with virtual hosts): rows as the transport carries them, a pull
    // each, a gradient (partial evictions and flushed ones too) or a value each.
    if (j.contains("links")) {
      for (const auto& [link, l] : j.at(o.host_aggregation ? "links_aggregated" : "links").items()) {
        const std::uint64_t partial = l.at("evict_partial");
        m["links." + link + ".pull"] = l.at("pulls");
        // (Peer sync's gradients handed to a host-applied row's applier: within the host.)
        m["links." + link + ".push_grad"] = l.at("push_grad").get<std::uint64_t>() + partial + l.at("flush_grad").get<std::uint64_t>() +
                                            l.at("peer_grad").get<std::uint64_t>();
        // Peer sync's hand-offs (within the host) go as values.
        m["links." + link + ".push_value"] = l.at("push_value").get<std::uint64_t>() + l.at("push_evict").get<std::uint64_t>() - partial +
                                             l.at("flush_value").get<std::uint64_t>() + l.at("hot_flush").get<std::uint64_t>() +
                                             l.at("peer_value").get<std::uint64_t>();
      }
    }
    return m;
  }
};

}  // namespace ember::worker::test_jobs
