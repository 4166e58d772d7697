// ember-sim: replay a dataset through the scheduler and count every row that would
// cross the network, per policy (docs/design.md accounting).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/main.h"
#include "ember/common/process.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/batch_stream.h"
#include "ember/scheduler/dynamic_rows_json.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/scheduler/simulator.h"
#include "ember/scheduler/tier_report.h"

namespace {

using namespace ember;
namespace fs = std::filesystem;

// A generated dataset in a temporary directory, removed on destruction.
struct SyntheticDataset {
  fs::path dir;
  ~SyntheticDataset() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

fs::path make_synthetic(SyntheticDataset& holder, data::GenOptions g, const std::string& like, bool quiet) {
  holder.dir = fs::temp_directory_path() / fmt::format("ember-sim-{}", ::getpid());
  fs::create_directories(holder.dir);
  g.like = data::parse_source_format(like);
  if (g.like == data::SourceFormat::kCriteoCsv) throw ConfigError("--synthetic must be criteo or avazu");
  g.output = holder.dir / "data.txt";
  if (!quiet)
    std::fprintf(stderr, "ember-sim: generating %llu %s-like rows (scale %g)...\n", static_cast<unsigned long long>(g.rows), like.c_str(),
                 g.scale);
  data::generate(g);
  data::PrepOptions p;
  p.format = g.like;
  p.inputs = {g.output};
  p.output = holder.dir / "dataset";
  data::prepare_dataset(p);
  fs::remove(g.output);
  return p.output;
}

// --hosts H, --ps-hosts LIST: link class 0 (within a host) or 1 (across hosts) of a
// worker's PS traffic for a key, as the workers of such a job count it (ember-worker
// --host, ember-ps --host); `host_of` numbers the workers' hosts.
std::function<std::size_t(WorkerId, Key)> link_classes(std::uint32_t hosts, const std::function<std::uint32_t(WorkerId)>& host_of,
                                                       std::uint32_t shards, const std::string& ps_hosts) {
  std::vector<std::string> given;
  for (std::size_t at = 0;;) {
    const auto comma = ps_hosts.find(',', at);
    given.push_back(ps_hosts.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (given.size() != 1 && given.size() != shards) {
    throw ConfigError("--ps-hosts '" + ps_hosts + "': one host for all shards or one per shard (--ps " + std::to_string(shards) + ")");
  }
  std::vector<std::int64_t> host_of_shard;  // -1: a host of its own
  for (std::uint32_t s = 0; s < shards; ++s) {
    const std::string& h = given.size() == 1 ? given[0] : given[s];
    std::int64_t v = -1;
    if (h != "own") {
      try {
        std::size_t used = 0;
        v = std::stoll(h, &used);
        if (used != h.size()) v = -2;
      } catch (const std::exception&) {
        v = -2;
      }
      if (v < 0 || v >= hosts) throw ConfigError("--ps-hosts '" + h + "': a host index 0.." + std::to_string(hosts - 1) + " or 'own'");
    }
    host_of_shard.push_back(v);
  }
  return [=](WorkerId w, Key k) -> std::size_t { return host_of_shard[ps::owner_shard(k, shards)] == host_of(w) ? 0 : 1; };
}

// What every policy's report needs.
struct Output {
  const scheduler::SimOptions& o;
  scheduler::RowFormat row;
  std::string optimizer;
  const data::Dataset& ds;
  const scheduler::SimResult* vanilla;  // none without vanilla among the policies
  std::uint32_t hosts;
};

double reduction(std::uint64_t v, std::uint64_t x) { return v > 0 ? 1.0 - static_cast<double>(x) / static_cast<double>(v) : 0.0; }

// A group's counts (a table, a PS shard, a link class) in --json, after `head`.
nlohmann::ordered_json counts(nlohmann::ordered_json head, const scheduler::TrafficCounts& c, scheduler::RowFormat row) {
  for (auto [k, v] : {std::pair<const char*, std::uint64_t>{"pulls", c.pulls},
                      {"pushes", c.pushes()},
                      {"push_grad", c.push_grad},
                      {"push_value", c.push_value},
                      {"push_evict", c.push_evict},
                      {"transmissions", c.transmissions()},
                      {"hits", c.hits},
                      {"pull_state", c.pull_state},
                      {"evict_partial", c.evict_partial},
                      {"flush_grad", c.flush_grad},
                      {"flush_value", c.flush_value},
                      {"hot_sync", c.hot_sync},
                      {"hot_flush", c.hot_flush},
                      {"eval_handed", c.eval_handed},
                      {"peer_value", c.peer_value},
                      {"peer_grad", c.peer_grad},
                      {"bytes", scheduler::wire_bytes(c, row).total()}}) {
    head[k] = v;
  }
  return head;
}

// A disk tier's prediction (--ram-budget-mb): per shard, rows read from disk per
// iteration and those a request waited for, without hints and with them.
nlohmann::ordered_json tier_json(const Output& out, const scheduler::SimResult& r) {
  std::vector<std::pair<scheduler::TierRates, scheduler::TierRates>> shards;
  for (std::size_t s = 0; s < r.per_shard_tier.size(); ++s) {
    shards.emplace_back(scheduler::per_iteration(r.per_shard_tier[s], r.iterations),
                        scheduler::per_iteration(r.per_shard_tier_hinted[s], r.iterations));
  }
  return scheduler::tier_json(out.o.tier_budget_bytes, out.o.tier_row_bytes, shards);
}

// The breakdowns of one policy's counts: per table (the table of each row's key: they
// add up to the totals), per PS shard (the shard of each row's key: the rows and bytes
// it serves, and the busiest over the mean), per link class (--hosts: the PS rows and
// payload within a worker's host and across hosts).
void add_breakdowns(nlohmann::ordered_json& j, const Output& out, const scheduler::SimResult& r) {
  const scheduler::RowFormat row = out.row;
  auto& tables = j["tables"] = nlohmann::ordered_json::array();
  for (std::size_t ti = 0; ti < r.per_table.size(); ++ti) {
    tables.push_back(counts({{"name", out.ds.manifest().tables[ti].name}}, r.per_table[ti], row));
  }
  auto& shards = j["shards"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < r.per_shard.size(); ++s) shards.push_back(counts({{"shard", s}}, r.per_shard[s], row));
  j["shard_balance"] = {
      {"pulls", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pulls; })},
      {"pushes", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pushes(); })},
      {"transmissions", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.transmissions(); })},
      {"bytes", scheduler::max_over_mean(r.per_shard, [&](const auto& c) { return scheduler::wire_bytes(c, row).total(); })}};
  if (!r.per_shard_tier.empty()) j["tier"] = tier_json(out, r);
  if (!r.per_link.empty()) {
    j["links"] = {{"intra_host", counts({}, r.per_link[0], row)}, {"cross_host", counts({}, r.per_link[1], row)}};
    // Per-host aggregation, modelled (SimResult::per_link_aggregated).
    j["links_aggregated"] = {{"intra_host", counts({}, r.per_link_aggregated[0], row)},
                             {"cross_host", counts({}, r.per_link_aggregated[1], row)}};
  }
}

// Dynamic tables: the rows made and dropped, the shards' largest, the directory's bytes.
scheduler::DirectoryCounts dynamic_totals(const scheduler::SimResult& r, std::uint64_t& busiest_live) {
  scheduler::DirectoryCounts c;
  busiest_live = 0;
  for (const auto& s : r.per_shard_rows) {
    c += s;
    busiest_live = std::max(busiest_live, s.live);
  }
  return c;
}

void print_dynamic_rows(const scheduler::SimResult& r) {
  std::uint64_t busiest = 0;
  const scheduler::DirectoryCounts c = dynamic_totals(r, busiest);
  std::cout << fmt::format(
      "{:<10}dynamic rows: {} live at the end ({} on the fullest of {} shards, of {} slots), {} created, {} kept out by --create-after, "
      "{} expired, {} capped; key directory {:.1f} MB\n",
      "", c.live, busiest, r.per_shard_rows.size(), r.dynamic_slots, c.created, c.refused, c.expired, c.capped,
      static_cast<double>(r.directory_bytes) / 1e6);
}

nlohmann::ordered_json dynamic_json(const scheduler::SimResult& r) {
  std::uint64_t busiest = 0;
  dynamic_totals(r, busiest);
  nlohmann::ordered_json j = scheduler::dynamic_rows_json(r.per_shard_rows);
  j["busiest_shard_live"] = busiest;
  j["slots"] = r.dynamic_slots;
  j["directory_bytes"] = r.directory_bytes;
  return j;
}

// One policy's line of --json: the counts, the bytes, per table, per shard, per link.
nlohmann::ordered_json policy_json(const Output& out, const scheduler::SimResult& r) {
  const scheduler::SimOptions& o = out.o;
  const scheduler::RowFormat row = out.row;
  const auto& t = r.traffic;
  const scheduler::WireBytes bytes = scheduler::wire_bytes(t, row);
  // The field names are an interface (scripts and tests read them): hot_sync and
  // hot_flush keep their names although the code calls these rows replicated.
  nlohmann::ordered_json j = {{"policy", r.policy},
                              {"pulls", t.pulls},
                              {"pushes", t.pushes()},
                              {"push_grad", t.push_grad},
                              {"push_value", t.push_value},
                              {"push_evict", t.push_evict},
                              {"transmissions", t.transmissions()},
                              {"iterations", r.iterations},
                              {"sched_ms_per_batch", r.sched_ms_mean},
                              {"sched_ms_median", r.sched_ms_median},
                              {"hit_rate", r.hit_rate()},
                              {"hot_sync", t.hot_sync},
                              {"cold_pulls", t.cold_pulls},
                              {"not_admitted", t.not_admitted},
                              {"cache_admission", o.scheduler.cache_admission},
                              {"workers", o.scheduler.workers},
                              {"batch_per_worker", o.scheduler.batch_per_worker},
                              {"cache_ratio", o.scheduler.cache_ratio},
                              {"cache_rows", r.cache_rows},
                              {"laia_tables", r.laia_tables_mean},
                              {"refine_allocation", o.scheduler.refine_allocation},
                              {"scoring_ms_per_batch", r.scoring_ms_mean},
                              {"scheduler_bytes", r.scheduler_bytes},
                              {"pull_state", t.pull_state},
                              {"prefetched", t.prefetched},
                              {"prefetch", o.scheduler.prefetch},
                              {"flush_grad", t.flush_grad},
                              {"flush_value", t.flush_value},
                              {"hot_flush", t.hot_flush},
                              {"eval_handed", t.eval_handed},
                              {"peer_value", t.peer_value},
                              {"peer_grad", t.peer_grad},
                              {"host_allocation", o.scheduler.host_allocation},
                              {"peer_sync", o.scheduler.peer_sync},
                              {"placement", o.scheduler.placement},
                              {"lookahead", o.scheduler.lookahead},
                              {"eviction", o.scheduler.eviction},
                              {"bytes", bytes}};
  add_breakdowns(j, out, r);
  if (!r.per_shard_rows.empty()) j["dynamic_rows"] = dynamic_json(r);
  if (o.digest) j["plan_digest"] = fmt::format("{:016x}", r.plan_digest);
  if (const auto* v = out.vanilla) {
    j["pull_reduction"] = reduction(v->traffic.pulls, t.pulls);
    j["push_reduction"] = reduction(v->traffic.pushes(), t.pushes());
    j["reduction_vs_vanilla"] = reduction(v->traffic.transmissions(), t.transmissions());
    j["bytes_reduction"] = reduction(scheduler::wire_bytes(v->traffic, row).total(), bytes.total());
  }
  return j;
}

// One policy's lines of the table.
void print_text(const Output& out, const scheduler::SimResult& r) {
  const scheduler::SimOptions& o = out.o;
  const scheduler::RowFormat row = out.row;
  const auto* vanilla = out.vanilla;
  const auto& t = r.traffic;
  const scheduler::WireBytes bytes = scheduler::wire_bytes(t, row);
  const double red_bytes = vanilla ? reduction(scheduler::wire_bytes(vanilla->traffic, row).total(), bytes.total()) : 0;
  const double red_pull = vanilla ? reduction(vanilla->traffic.pulls, t.pulls) : 0;
  const double red_push = vanilla ? reduction(vanilla->traffic.pushes(), t.pushes()) : 0;
  const double red_all = vanilla ? reduction(vanilla->traffic.transmissions(), t.transmissions()) : 0;
  auto pct = [&](double v) { return vanilla ? fmt::format("{:.1f}", 100 * v) : std::string("-"); };
  std::cout << fmt::format("{:<10}{:>11}{:>11}{:>11}{:>11}{:>11}{:>14}{:>9}{:>9}{:>9}{:>8.3f}{:>10.3f}\n", r.policy, t.pulls, t.push_grad,
                           t.push_value, t.push_evict, t.pushes(), t.transmissions(), pct(red_pull), pct(red_push), pct(red_all),
                           r.hit_rate(), r.sched_ms_mean);
  if (o.digest) std::cout << fmt::format("{:<10}plan digest {:016x}\n", "", r.plan_digest);
  std::cout << fmt::format("{:<10}bytes (dim {}, {}): pull {:.1f} MB, push {:.1f} MB, total {:.1f} MB ({} vs vanilla); flushes {:.1f} MB\n",
                           "", out.row.dim, out.optimizer, static_cast<double>(bytes.pull) / 1e6,
                           static_cast<double>(bytes.push_grad + bytes.push_value + bytes.push_evict) / 1e6,
                           static_cast<double>(bytes.total() - bytes.flush) / 1e6, vanilla ? "-" + pct(red_bytes) + "%" : std::string("-"),
                           static_cast<double>(bytes.flush) / 1e6);
  if (o.scheduler.budget_ms > 0 && r.laia_tables_mean > 0) {
    std::cout << fmt::format("{:<10}adaptive LAIA: {:.1f} tables scored on average, scoring {:.3f} ms per batch (budget {:g} ms: {})\n", "",
                             r.laia_tables_mean, r.scoring_ms_mean, o.scheduler.budget_ms,
                             r.scoring_ms_mean <= o.scheduler.budget_ms ? "met" : "exceeded");
  }
  std::cout << fmt::format("{:<10}{} of the pulls ({:.0f}%) fetch rows no earlier iteration used (no policy avoids them)\n", "",
                           t.cold_pulls, t.pulls ? 100.0 * static_cast<double>(t.cold_pulls) / static_cast<double>(t.pulls) : 0.0);
  if (!r.per_shard_rows.empty()) print_dynamic_rows(r);
  const auto links_line = [&](const std::string& what, const std::vector<scheduler::TrafficCounts>& l) {
    const auto& [in, across] = std::pair(l[0], l[1]);
    std::cout << fmt::format("{:<10}{}: across hosts {} rows, {:.1f} MB; within hosts {} rows, {:.1f} MB\n", "", what,
                             across.transmissions() + across.flush_grad + across.flush_value,
                             static_cast<double>(scheduler::wire_bytes(across, row).total()) / 1e6,
                             in.transmissions() + in.flush_grad + in.flush_value,
                             static_cast<double>(scheduler::wire_bytes(in, row).total()) / 1e6);
  };
  if (!r.per_link.empty()) links_line(fmt::format("{} hosts", out.hosts), r.per_link);
  if (!r.per_link_aggregated.empty()) links_line("with per-host aggregation (modelled)", r.per_link_aggregated);
  if (r.per_shard.size() > 1) {
    std::cout << fmt::format("{:<10}{} PS shards, busiest over mean: pulls {:.3f}, pushes {:.3f}, bytes {:.3f}\n", "", r.per_shard.size(),
                             scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pulls; }),
                             scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pushes(); }),
                             scheduler::max_over_mean(r.per_shard, [&](const auto& c) { return scheduler::wire_bytes(c, row).total(); }));
  }
  for (std::size_t s = 0; s < r.per_shard_tier.size(); ++s) {
    const auto a = scheduler::per_iteration(r.per_shard_tier[s], r.iterations);
    const auto h = scheduler::per_iteration(r.per_shard_tier_hinted[s], r.iterations);
    auto share = [](double part, double of) { return of > 0 ? 100.0 * part / of : 0.0; };
    std::cout << fmt::format(
        "{:<10}shard {} disk tier ({:g} MB budget): {:.0f} rows used per iteration; reads per iteration {:.0f} without hints, {:.0f} with "
        "them, of which a request waited for {:.0f} ({:.1f}% of rows used) and {:.0f} ({:.1f}%)\n",
        "", s, static_cast<double>(out.o.tier_budget_bytes) / (1024 * 1024), a.rows_touched, a.reads, h.reads, a.critical_reads,
        share(a.critical_reads, a.rows_touched), h.critical_reads, share(h.critical_reads, h.rows_touched));
  }
  if (t.hot_sync > 0) {
    std::cout << fmt::format("{:<10}replicated rows all-reduced among workers (summed over workers): {}; written back at flushes: {}\n", "",
                             t.hot_sync, t.hot_flush);
  }
}

// ember-sim's command line; its initial values are the flags' defaults.
struct Flags {
  Flags() {
    gen.rows = 0;  // exactly the batches needed
    o.scheduler.policy = "vanilla,laia,plan,herald";
    o.scheduler.iterations = 110;
  }
  std::string data_dir, synthetic;
  data::GenOptions gen;
  bool json = false, quiet = false;
  scheduler::SimOptions o;
  std::uint32_t dim = 16, ps_shards = 1, hosts = 0;
  double ram_budget_mb = 0;  // a disk tier under each shard (ember-ps --ram-budget-mb)
  std::string optimizer = "sgd", ps_hosts = "own", host_map;
};

// --host-map "0,0,1,1": each worker's host, by rank. ConfigError unless it is a partition
// of the workers into hosts 0..H-1 (one entry per worker, every host with a worker).
std::vector<std::uint32_t> parse_host_map(const std::string& text, std::uint32_t workers) {
  std::vector<std::uint32_t> host_of;
  for (std::size_t at = 0; at <= text.size();) {
    const auto comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    std::size_t used = 0;
    unsigned long v = 0;
    try {
      v = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) throw ConfigError("--host-map '" + text + "': '" + item + "' is not a host index");
    host_of.push_back(static_cast<std::uint32_t>(v));
    at = comma + 1;
  }
  if (host_of.size() != workers) {
    throw ConfigError("--host-map '" + text + "' gives " + std::to_string(host_of.size()) + " workers' hosts; --workers is " +
                      std::to_string(workers) + " (one host index per worker, by rank)");
  }
  const std::uint32_t hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<bool> used(hosts, false);
  for (std::uint32_t h : host_of) used[h] = true;
  for (std::uint32_t h = 0; h < hosts; ++h) {
    if (!used[h]) {
      throw ConfigError("--host-map '" + text + "' is not a partition of the workers: host " + std::to_string(h) +
                        " has none (number the hosts 0.." + std::to_string(hosts - 1) + ", each with a worker)");
    }
  }
  return host_of;
}

// ember-sim's flags, declared once each (common/option_registry.h): the dataset or the
// synthetic data, the job's options by the names ember-worker gives them
// (scheduler_cli.cc), and the simulator's own.
using Decl = OptionDecl<Flags>;

template <class T>
Decl flag(const char* name, T Flags::*member, const char* help) {
  return field_option<Flags>(name, member, help, kSimProgram);
}
// A flag bound to a field of the generator's options (--synthetic's data).
template <class T>
Decl gen_flag(const char* name, T data::GenOptions::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kSimProgram, [](auto& f) -> auto& { return f.gen; });
}
template <class T>
Decl sim_flag(const char* name, T scheduler::SimOptions::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kSimProgram, [](auto& f) -> auto& { return f.o; });
}

std::vector<Decl> data_options() {
  return {
      flag("--dataset", &Flags::data_dir, "dataset directory from `ember-data prep`"),
      flag("--synthetic", &Flags::synthetic, "criteo or avazu: generate a dataset instead"),
      gen_flag("--scale", &data::GenOptions::scale, "synthetic: table cardinalities relative to the real ones"),
      gen_flag("--rows", &data::GenOptions::rows, "synthetic: rows to generate (default: exactly the batches needed)").default_hidden(),
      gen_flag("--iid", &data::GenOptions::iid, "synthetic: independent per-table draws (no entities or drift)"),
      gen_flag("--coupling", &data::GenOptions::coupling, "synthetic: probability an id-like table takes the row's entity value"),
      gen_flag("--session", &data::GenOptions::session, "synthetic: probability a row reuses the previous row's entity"),
      gen_flag("--drift", &data::GenOptions::drift, "synthetic: popularity ranking positions shifted per 10,000 rows"),
      gen_flag("--entities", &data::GenOptions::entities, "synthetic: latent entities (0 = 1e6 x scale)"),
  };
}

// The replay: warm-up, flushes, the PS shards and hosts, row sizes, output.
std::vector<Decl> replay_options() {
  return {
      sim_flag("--warmup", &scheduler::SimOptions::warmup, "of the --iterations, the first ones run and not counted"),
      sim_flag("--checkpoint-every", &scheduler::SimOptions::checkpoint_every,
               "the job's checkpoints (ember-ps --checkpoint-every): flush before each"),
      flag("--ps", &Flags::ps_shards, "PS shards, for the per-shard counts (a key's shard as the PS places it)"),
      sim_flag("--slots-per-shard", &scheduler::SimOptions::slots_per_shard,
               "dynamic tables: each shard's slots, as ember-ps --slots-per-shard (0: enough for the batches simulated)")
          .default_hidden(),
      flag("--hosts", &Flags::hosts,
           "worker hosts, for per-link counts: workers in rank order, as many on each (host h holds ranks h*W/H .. (h+1)*W/H - 1)")
          .default_hidden(),
      flag("--host-map", &Flags::host_map,
           "worker hosts as a map instead of --hosts: each worker's host index by rank, comma-separated (e.g. 0,0,0,1,1: hosts "
           "of 3 and 2 workers)"),
      flag("--ps-hosts", &Flags::ps_hosts,
           "with --hosts: the host of each PS shard (comma-separated, one for all), a host index 0..H-1 or 'own' (a host without "
           "workers: all its traffic crosses hosts)"),
      flag("--dim", &Flags::dim, "embedding dimension, for bytes"),
      flag("--optimizer", &Flags::optimizer, "sparse optimizer (its state travels with values), for bytes"),
      flag("--ram-budget-mb", &Flags::ram_budget_mb,
           "a disk tier under each PS shard with this budget (ember-ps --ram-budget-mb): predict its disk reads per iteration, "
           "without hints and with the workers' hints (--lookahead iterations ahead)")
          .checked(CLI::NonNegativeNumber)
          .default_hidden(),
      flag("--json", &Flags::json, "one JSON object per policy per line (with a per-table breakdown)"),
      sim_flag("--digest", &scheduler::SimOptions::digest,
               "also print a hash of every plan (identical across processes and thread counts)"),
      flag("--quiet,-q", &Flags::quiet, "no progress lines"),
  };
}

const std::vector<Decl>& sim_options() {
  static const std::vector<Decl> decls = [] {  // immutable after its first use
    std::vector<Decl> d = data_options();
    for (const auto& s : scheduler::scheduler_options())
      d.push_back(rebind_option<Flags>(
          s, [](auto& f) -> auto& { return f.o.scheduler; }));
    for (Decl& r : replay_options()) d.push_back(std::move(r));
    return d;
  }();
  return decls;
}

void add_flags(CLI::App& app, Flags& f) {
  add_options(app, sim_options(), f, kSimProgram);
  app.get_option("--dataset")->excludes(app.get_option("--synthetic"));
  app.get_option("--stream")->excludes(app.get_option("--dataset"))->excludes(app.get_option("--synthetic"));
  app.get_option("--host-map")->excludes(app.get_option("--hosts"));
  // The names of earlier releases, now ember-worker's.
  add_renamed_flag(app, "--data", "--dataset", true);
  add_renamed_flag(app, "--policies", "--policy", true);
  add_renamed_flag(app, "--threads", "--sched-threads", true);
  add_renamed_flag(app, "--per-host", "--scheduler-per-host", false);
}

// Checks the job's flags and fills in what they imply: the counted iterations, the PS
// shards and the workers' hosts.
void set_up_job(Flags& f) {
  if (f.data_dir.empty() && f.synthetic.empty() && f.o.scheduler.stream.empty())
    throw ConfigError("give --dataset DIR, --stream DIR or --synthetic criteo|avazu");
  f.o.iterations = scheduler::counted_iterations(f.o.scheduler.iterations, f.o.warmup, "counted");
  if (f.ps_shards < 1) throw ConfigError("--ps must be at least 1");
  f.o.shards = f.ps_shards;
  f.o.shard_of = [shards = f.ps_shards](Key k) { return ps::owner_shard(k, shards); };
  const std::uint32_t workers = f.o.scheduler.workers;
  if (f.hosts > 0) {
    if (workers % f.hosts != 0) {
      throw ConfigError("--hosts " + std::to_string(f.hosts) + " does not divide --workers " + std::to_string(workers) +
                        " (each host holds --workers / --hosts of them; --host-map for hosts of other sizes)");
    }
    // Workers in rank order, as many on each host.
    f.o.host_of = [hosts = f.hosts, workers](WorkerId w) { return static_cast<std::uint32_t>(std::uint64_t{w} * hosts / workers); };
  } else if (!f.host_map.empty()) {
    const std::vector<std::uint32_t> map = parse_host_map(f.host_map, workers);
    f.hosts = *std::max_element(map.begin(), map.end()) + 1;
    f.o.host_of = [map](WorkerId w) { return map[w]; };
  }
  if (f.hosts > 0) f.o.link_of = link_classes(f.hosts, f.o.host_of, f.ps_shards, f.ps_hosts);
  if (f.o.scheduler.scheduler_per_host && f.hosts == 0) throw ConfigError("--scheduler-per-host needs --hosts or --host-map");
}

// The dataset's directory: --dataset's, or a generated one (--synthetic) that `holder` removes.
fs::path dataset_dir(Flags& f, SyntheticDataset& holder) {
  fs::path dir = f.data_dir;
  if (!f.synthetic.empty()) {
    std::uint64_t need = (f.o.warmup + f.o.iterations) * f.o.scheduler.workers * f.o.scheduler.batch_per_worker;
    if (f.gen.rows == 0) f.gen.rows = need;
    f.gen.seed = f.o.scheduler.seed;
    dir = make_synthetic(holder, f.gen, f.synthetic, f.quiet);
  }
  return dir;
}

// Prints every policy's counts: a line of --json each, or the table (its heading first).
void print_results(const Flags& f, scheduler::RowFormat row, const data::Dataset& ds, const std::vector<scheduler::SimResult>& results) {
  const scheduler::SimResult* vanilla = nullptr;
  for (const auto& r : results) {
    if (r.policy == "vanilla") vanilla = &r;
  }
  const auto total_rows =
      ds.manifest().hashed_ids ? results.front().dynamic_slots : scheduler::key_space(ds, f.o.scheduler.table_rows).back();
  if (!f.json) {
    std::cout << fmt::format(
        "{} workers x {} samples, cache {} rows per worker ({} of {} rows), {} tables; {} iterations counted after {} warm-up "
        "(--iterations {} counts both); lookahead {}, eviction {}{}\n",
        f.o.scheduler.workers, f.o.scheduler.batch_per_worker, results.front().cache_rows,
        f.o.scheduler.placement.empty() ? fmt::format("{:g}", f.o.scheduler.cache_ratio) : "placement " + f.o.scheduler.placement,
        total_rows, ds.num_tables(), f.o.iterations, f.o.warmup, f.o.scheduler.iterations, f.o.scheduler.lookahead, f.o.scheduler.eviction,
        f.o.scheduler.prefetch ? ", prefetch" : "");
    std::cout << fmt::format("{:<10}{:>11}{:>11}{:>11}{:>11}{:>11}{:>14}{:>9}{:>9}{:>9}{:>8}{:>10}\n", "policy", "pulls", "push_grad",
                             "push_value", "push_evict", "pushes", "transmissions", "pull -%", "push -%", "total -%", "hit", "ms/batch");
  }
  const Output out{f.o, row, f.optimizer, ds, vanilla, f.hosts};
  for (const auto& r : results) {
    if (f.json) {
      std::cout << policy_json(out, r).dump() << "\n";
    } else {
      print_text(out, r);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-sim: count embedding traffic per scheduling policy"};
  Flags f;
  add_flags(app, f);
  if (const int status = parse_command_line(app, argc, argv, "ember-sim"); status >= 0) return status;
  return guarded_main("ember-sim", [&] {
    set_up_job(f);
    auto list = scheduler::parse_policies(f.o.scheduler.policy);
    const scheduler::RowFormat row{f.dim, ps::state_floats(ps::parse_optimizer(f.optimizer), f.dim)};
    if (f.ram_budget_mb > 0) {
      f.o.tier_budget_bytes = static_cast<std::uint64_t>(f.ram_budget_mb * 1024 * 1024);
      f.o.tier_row_bytes = row.stored_bytes();
    }
    SyntheticDataset holder;
    const fs::path dir = dataset_dir(f, holder);
    data::Dataset ds = scheduler::open_job_data(dir.string(), f.o.scheduler, {false});
    if (!f.synthetic.empty()) {
      // The file holds a sample of each table; the key space (and the cache ratio) is
      // the generator's full tables, as it would be for the real dataset.
      f.o.scheduler.table_rows = data::synthetic_table_rows(data::parse_source_format(f.synthetic), f.gen.scale);
    }
    Stopwatch last;
    if (!f.quiet) {
      f.o.on_progress = [&](const std::string& p, std::uint64_t done, std::uint64_t total) {
        if (last.seconds() < 2.0 && done != total) return;
        last.reset();
        std::fprintf(stderr, "ember-sim: %s %llu/%llu iterations\n", p.c_str(), static_cast<unsigned long long>(done),
                     static_cast<unsigned long long>(total));
      };
    }
    std::vector<scheduler::SimResult> results;
    for (const auto& p : list) {
      f.o.scheduler.policy = p.name();
      results.push_back(scheduler::simulate(ds, f.o));
    }
    print_results(f, row, ds, results);
    return 0;
  });
}
