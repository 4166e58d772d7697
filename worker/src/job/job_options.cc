#include "job/job_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"

namespace ember::worker {

namespace {

struct Source {
  const TrainConfig& c;
  const std::string& dataset;  // dataset_identity
};

std::string on_off(bool b) { return b ? "on" : "off"; }

std::string layers(const std::vector<std::int64_t>& l) {
  std::string s;
  for (std::int64_t n : l) s += (s.empty() ? "" : "-") + std::to_string(n);
  return s.empty() ? "none" : s;
}

// A model option only the kinds in `kinds` (space-separated) build from: the others
// ignore it, and workers of such a model may differ on it.
std::string for_models(const Source& s, const std::string& kinds, const std::string& value) {
  const std::string k = " " + kinds + " ";
  if (k.find(" " + s.c.model.kind + " ") != std::string::npos) return value;
  return "unused";  // the same for every kind that ignores it
}

// FNV-1a, 64 bits: an identity, not a defence against forgery.
std::uint64_t fnv1a(const std::string& bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

std::string placement_identity(const std::string& path) {
  if (path.empty()) return "none";
  const std::string text = read_file(path);
  return fmt::format("a plan of {} bytes, contents {:016x}", text.size(), fnv1a(text));
}

// The options the workers of one job must agree on, one line each: the flag
// (worker/tools/ember_worker.cc) and its value as compared and shown. TrainConfig, field
// by field (trainer.h):
//   must agree (in the table):
//     dataset         its identity (rows, tables, shard checksums), not its path
//     model.kind, bottom, top, deep, cross_layers  (the layers a kind does not build: not)
//     model.num_dense, num_tables, dim  from the dataset and the PS: agree with them
//     policy, cache_ratio, lookahead, eviction (as resolved: auto is lru or lookahead),
//     prefetch, refine_allocation, placement (its contents, not its path)  every worker
//                     runs the whole scheduler and follows the plans of all of them
//     batch_per_worker, iterations, seed, shuffle  the global batches and their order
//     dense_optimizer, dense_lr  the replicas of the dense model step alike
//     eval_every      the evaluations' flushes are barriers and commits of every worker
//     resume          where the job starts (the PS's restored iteration, or 0)
//   checked elsewhere: workers (the job's shape), transport (the PS's; join checks both)
//   may differ per worker (not compared):
//     threads (--sched-threads)  the plans do not depend on it (scheduler_test:
//                     SameInputsGiveIdenticalPlansWithAnyThreadCount)
//     torch_threads, device, cache_backend  where and how fast this worker computes;
//                     the dense gradients are summed before any replica steps
//     overlap_allreduce  one all-reduce per iteration either way, waited for before the
//                     next forward pass: the same sums, the same model
//     eval_samples, dump_dir  only worker 0 evaluates and dumps (its values count)
//     checkpoint_dir, keep_checkpoints  each worker's own files; one without reports "none"
//     progress_every, metrics_file, exporter, stop  reporting and signals of this process
//     coordinator, token  the same, or it would not have joined this job
//     rank, gloo_host, rdma_slot_mib, ps_connections, socket_buffer_kib, timeout,
//     heartbeat_timeout, join_timeout  this worker's addresses, connections and timeouts
// Adding an option that must agree: one line here.
struct AgreedOption {
  const char* flag;
  std::string (*value)(const Source&);
};
const AgreedOption kAgreed[] = {
    {"--dataset", [](const Source& s) { return s.dataset; }},
    {"--model", [](const Source& s) { return s.c.model.kind; }},
    {"--bottom-mlp", [](const Source& s) { return for_models(s, "dlrm", layers(s.c.model.bottom)); }},
    {"--top-mlp", [](const Source& s) { return for_models(s, "dlrm", layers(s.c.model.top)); }},
    {"--deep-mlp", [](const Source& s) { return for_models(s, "wide-deep deepfm dcn", layers(s.c.model.deep)); }},
    {"--cross-layers", [](const Source& s) { return for_models(s, "dcn", std::to_string(s.c.model.cross_layers)); }},
    {"--dense-optimizer", [](const Source& s) { return s.c.dense_optimizer; }},
    {"--dense-lr", [](const Source& s) { return fmt::format("{}", s.c.dense_lr); }},
    {"--policy", [](const Source& s) { return s.c.policy; }},
    {"--cache-ratio", [](const Source& s) { return fmt::format("{}", s.c.cache_ratio); }},
    {"--placement", [](const Source& s) { return placement_identity(s.c.placement); }},
    {"--lookahead", [](const Source& s) { return std::to_string(s.c.lookahead); }},
    {"--eviction",
     [](const Source& s) { return s.c.eviction == "auto" ? std::string(s.c.lookahead > 0 ? "lookahead" : "lru") : s.c.eviction; }},
    {"--prefetch", [](const Source& s) { return on_off(s.c.prefetch); }},
    {"--allreduce", [](const Source& s) { return s.c.allreduce; }},
    {"--host-aggregation", [](const Source& s) { return on_off(s.c.host_aggregation); }},
    {"--refine-allocation", [](const Source& s) { return on_off(s.c.refine_allocation); }},
    {"--host-allocation", [](const Source& s) { return on_off(s.c.host_allocation); }},
    {"--peer-sync", [](const Source& s) { return on_off(s.c.peer_sync); }},
    {"--scheduler-per-host", [](const Source& s) { return on_off(s.c.scheduler_per_host); }},
    {"--batch-per-worker", [](const Source& s) { return std::to_string(s.c.batch_per_worker); }},
    {"--iterations", [](const Source& s) { return std::to_string(s.c.iterations); }},
    {"--seed", [](const Source& s) { return std::to_string(s.c.seed); }},
    {"--shuffle", [](const Source& s) { return on_off(s.c.shuffle); }},
    {"--eval-every", [](const Source& s) { return std::to_string(s.c.eval_every); }},
    {"--resume", [](const Source& s) { return on_off(s.c.resume); }},
};

}  // namespace

std::string dataset_identity(const data::Manifest& m) {
  std::string bytes;
  for (const auto& t : m.tables) bytes += std::to_string(t.rows) + ",";
  for (const auto& sh : m.shards[static_cast<int>(data::Split::kTrain)])
    bytes += std::to_string(sh.rows) + ":" + std::to_string(sh.checksum) + ",";
  return fmt::format("{} training rows, {} dense features, {} tables of {} rows, contents {:016x}", m.rows[0], m.dense_names.size(),
                     m.tables.size(), m.total_table_rows(), fnv1a(bytes));
}

OptionValues agreed_options(const TrainConfig& c, const std::string& dataset) {
  const Source s{c, dataset};
  OptionValues v;
  for (const AgreedOption& o : kAgreed) v.emplace_back(o.flag, o.value(s));
  return v;
}

std::string options_to_json(const OptionValues& values) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [flag, value] : values) j.push_back({flag, value});
  return j.dump();
}

OptionValues options_from_json(const std::string& text) {
  try {
    OptionValues v;
    for (const auto& e : nlohmann::json::parse(text)) v.emplace_back(e.at(0).get<std::string>(), e.at(1).get<std::string>());
    return v;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("worker 0 published malformed options: ") + e.what());
  }
}

std::string compare_options(const OptionValues& mine, const OptionValues& job) {
  std::string out;
  const auto add = [&out](const std::string& line) { out += (out.empty() ? "" : "; ") + line; };
  const auto find = [](const OptionValues& in, const std::string& flag) {
    return std::find_if(in.begin(), in.end(), [&](const auto& e) { return e.first == flag; });
  };
  for (const auto& [flag, value] : mine) {
    auto j = find(job, flag);
    if (j == job.end())
      add(flag + " " + value + ", the job does not say (worker 0 is an ember-worker of another build)");
    else if (j->second != value)
      add(flag + " " + value + ", the job has " + j->second);
  }
  for (const auto& [flag, value] : job) {
    if (find(mine, flag) == mine.end())
      add(flag + ": the job has " + value + ", an option this ember-worker does not know (another build)");
  }
  return out;
}

}  // namespace ember::worker
