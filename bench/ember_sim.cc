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

#include "ember/common/error.h"
#include "ember/common/main.h"
#include "ember/common/process.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"
#include "ember/ps/shard_store.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/scheduler/simulator.h"

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
// --host, ember-ps --host).
std::function<std::size_t(WorkerId, Key)> link_classes(std::uint32_t hosts, std::uint32_t workers, std::uint32_t shards,
                                                       const std::string& ps_hosts) {
  if (hosts > workers) throw ConfigError("--hosts " + std::to_string(hosts) + ": more hosts than --workers " + std::to_string(workers));
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
  return [=](WorkerId w, Key k) -> std::size_t {
    const std::int64_t host = static_cast<std::int64_t>(std::uint64_t{w} * hosts / workers);
    return host_of_shard[ps::owner_shard(k, shards)] == host ? 0 : 1;
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-sim: count embedding traffic per scheduling policy"};
  std::string data_dir, synthetic, policies = "vanilla,laia,plan,herald";
  data::GenOptions gen;
  bool json = false, quiet = false;
  scheduler::SimOptions o;
  auto* data_opt = app.add_option("--data", data_dir, "dataset directory from `ember-data prep`");
  auto* syn_opt = app.add_option("--synthetic", synthetic, "criteo or avazu: generate a dataset instead");
  data_opt->excludes(syn_opt);
  gen.rows = 0;
  app.add_option("--scale", gen.scale, "synthetic: table cardinalities relative to the real ones")->capture_default_str();
  app.add_option("--rows", gen.rows, "synthetic: rows to generate (default: exactly the batches needed)");
  app.add_flag("--iid", gen.iid, "synthetic: independent per-table draws (no entities or drift)");
  app.add_option("--coupling", gen.coupling, "synthetic: probability an id-like table takes the row's entity value")->capture_default_str();
  app.add_option("--session", gen.session, "synthetic: probability a row reuses the previous row's entity")->capture_default_str();
  app.add_option("--drift", gen.drift, "synthetic: popularity ranking positions shifted per 10,000 rows")->capture_default_str();
  app.add_option("--entities", gen.entities, "synthetic: latent entities (0 = 1e6 x scale)")->capture_default_str();
  scheduler::add_scheduler_options(app, o.scheduler, scheduler::FlagsFor::kSimulation);
  app.add_option("--policies", policies, "comma-separated: vanilla, laia, plan, herald, het:S, fae:F, brute")->capture_default_str();
  app.add_option("--iterations", o.iterations, "counted iterations")->capture_default_str();
  app.add_option("--warmup", o.warmup, "iterations run first and not counted")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "the job's evaluations: flush after every N iterations (0 = at the end only)")
      ->capture_default_str();
  app.add_option("--checkpoint-every", o.checkpoint_every, "the job's checkpoints (ember-ps --checkpoint-every): flush before each")
      ->capture_default_str();
  std::uint32_t dim = 16, ps_shards = 1;
  std::string optimizer = "sgd";
  app.add_option("--ps", ps_shards, "PS shards, for the per-shard counts (a key's shard as the PS places it)")->capture_default_str();
  std::uint32_t hosts = 0;
  std::string ps_hosts = "own";
  app.add_option("--hosts", hosts,
                 "worker hosts, for per-link counts: workers in rank order, as many on each (host h holds ranks h*W/H .. (h+1)*W/H - 1)");
  app.add_option("--ps-hosts", ps_hosts,
                 "with --hosts: the host of each PS shard (comma-separated, one for all), a host index 0..H-1 or 'own' (a host "
                 "without workers: all its traffic crosses hosts)")
      ->capture_default_str();
  app.add_option("--dim", dim, "embedding dimension, for bytes")->capture_default_str();
  app.add_option("--optimizer", optimizer, "sparse optimizer (its state travels with values), for bytes")->capture_default_str();
  app.add_flag("--json", json, "one JSON object per policy per line (with a per-table breakdown)");
  app.add_flag("--digest", o.digest, "also print a hash of every plan (identical across processes and thread counts)");
  app.add_flag("--quiet,-q", quiet, "no progress lines");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return guarded_main("ember-sim", [&] {
    if (data_dir.empty() && synthetic.empty()) throw ConfigError("give --data DIR or --synthetic criteo|avazu");
    if (ps_shards < 1) throw ConfigError("--ps must be at least 1");
    o.shards = ps_shards;
    o.shard_of = [ps_shards](Key k) { return ps::owner_shard(k, ps_shards); };
    if (hosts > 0) o.link_of = link_classes(hosts, o.scheduler.workers, ps_shards, ps_hosts);
    auto list = scheduler::parse_policies(policies);
    const scheduler::RowFormat row{dim, ps::state_floats(ps::parse_optimizer(optimizer), dim)};
    SyntheticDataset holder;
    fs::path dir = data_dir;
    if (!synthetic.empty()) {
      std::uint64_t need = (o.warmup + o.iterations) * o.scheduler.workers * o.scheduler.batch_per_worker;
      if (gen.rows == 0) gen.rows = need;
      gen.seed = o.scheduler.seed;
      dir = make_synthetic(holder, gen, synthetic, quiet);
    }
    data::Dataset ds = data::Dataset::open(dir, {false});
    if (!synthetic.empty()) {
      // The file holds a sample of each table; the key space (and the cache ratio) is
      // the generator's full tables, as it would be for the real dataset.
      o.scheduler.table_rows = data::synthetic_table_rows(data::parse_source_format(synthetic), gen.scale);
    }
    Stopwatch last;
    if (!quiet) {
      o.on_progress = [&](const std::string& p, std::uint64_t done, std::uint64_t total) {
        if (last.seconds() < 2.0 && done != total) return;
        last.reset();
        std::fprintf(stderr, "ember-sim: %s %llu/%llu iterations\n", p.c_str(), static_cast<unsigned long long>(done),
                     static_cast<unsigned long long>(total));
      };
    }
    std::vector<scheduler::SimResult> results;
    for (const auto& p : list) {
      o.scheduler.policy = p.name();
      results.push_back(scheduler::simulate(ds, o));
    }
    const scheduler::SimResult* vanilla = nullptr;
    for (const auto& r : results) {
      if (r.policy == "vanilla") vanilla = &r;
    }
    auto reduction = [&](std::uint64_t v, std::uint64_t x) { return v > 0 ? 1.0 - static_cast<double>(x) / static_cast<double>(v) : 0.0; };
    const auto total_rows = scheduler::key_space(ds, o.scheduler.table_rows).back();
    if (!json) {
      std::cout << fmt::format(
          "{} workers x {} samples, cache {} rows per worker ({} of {} rows), {} tables; {} iterations after {} warm-up; "
          "lookahead {}, eviction {}{}\n",
          o.scheduler.workers, o.scheduler.batch_per_worker, results.front().cache_rows,
          o.scheduler.placement.empty() ? fmt::format("{:g}", o.scheduler.cache_ratio) : "placement " + o.scheduler.placement, total_rows,
          ds.num_tables(), o.iterations, o.warmup, o.scheduler.lookahead, o.scheduler.eviction, o.scheduler.prefetch ? ", prefetch" : "");
      std::cout << fmt::format("{:<10}{:>11}{:>11}{:>11}{:>11}{:>11}{:>14}{:>9}{:>9}{:>9}{:>8}{:>10}\n", "policy", "pulls", "push_grad",
                               "push_value", "push_evict", "pushes", "transmissions", "pull -%", "push -%", "total -%", "hit", "ms/batch");
    }
    for (const auto& r : results) {
      const auto& t = r.traffic;
      const scheduler::WireBytes bytes = scheduler::wire_bytes(t, row);
      const double red_bytes = vanilla ? reduction(scheduler::wire_bytes(vanilla->traffic, row).total(), bytes.total()) : 0;
      double red_pull = vanilla ? reduction(vanilla->traffic.pulls, t.pulls) : 0;
      double red_push = vanilla ? reduction(vanilla->traffic.pushes(), t.pushes()) : 0;
      double red_all = vanilla ? reduction(vanilla->traffic.transmissions(), t.transmissions()) : 0;
      if (json) {
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
                                    {"placement", o.scheduler.placement},
                                    {"lookahead", o.scheduler.lookahead},
                                    {"eviction", o.scheduler.eviction},
                                    {"bytes",
                                     {{"pull", bytes.pull},
                                      {"push_grad", bytes.push_grad},
                                      {"push_value", bytes.push_value},
                                      {"push_evict", bytes.push_evict},
                                      {"flush", bytes.flush},
                                      {"total", bytes.total()}}}};
        // Per table (the table of each row's key): the same kinds; they add up to the totals.
        auto counts = [&](nlohmann::ordered_json head, const scheduler::TrafficCounts& c) {
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
                              {"bytes", scheduler::wire_bytes(c, row).total()}}) {
            head[k] = v;
          }
          return head;
        };
        auto& tables = j["tables"] = nlohmann::ordered_json::array();
        for (std::size_t ti = 0; ti < r.per_table.size(); ++ti) {
          tables.push_back(counts({{"name", ds.manifest().tables[ti].name}}, r.per_table[ti]));
        }
        // Per PS shard (the shard of each row's key): the rows and bytes it serves, and
        // the busiest shard over the mean.
        auto& shards = j["shards"] = nlohmann::ordered_json::array();
        for (std::size_t s = 0; s < r.per_shard.size(); ++s) shards.push_back(counts({{"shard", s}}, r.per_shard[s]));
        j["shard_balance"] = {
            {"pulls", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pulls; })},
            {"pushes", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pushes(); })},
            {"transmissions", scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.transmissions(); })},
            {"bytes", scheduler::max_over_mean(r.per_shard, [&](const auto& c) { return scheduler::wire_bytes(c, row).total(); })}};
        // Per link class (--hosts): the PS rows and payload that stay within a worker's
        // host and those that cross hosts.
        if (!r.per_link.empty()) j["links"] = {{"intra_host", counts({}, r.per_link[0])}, {"cross_host", counts({}, r.per_link[1])}};
        if (o.digest) j["plan_digest"] = fmt::format("{:016x}", r.plan_digest);
        if (vanilla) {
          j["pull_reduction"] = red_pull;
          j["push_reduction"] = red_push;
          j["reduction_vs_vanilla"] = red_all;
          j["bytes_reduction"] = red_bytes;
        }
        std::cout << j.dump() << "\n";
      } else {
        auto pct = [&](double v) { return vanilla ? fmt::format("{:.1f}", 100 * v) : std::string("-"); };
        std::cout << fmt::format("{:<10}{:>11}{:>11}{:>11}{:>11}{:>11}{:>14}{:>9}{:>9}{:>9}{:>8.3f}{:>10.3f}\n", r.policy, t.pulls,
                                 t.push_grad, t.push_value, t.push_evict, t.pushes(), t.transmissions(), pct(red_pull), pct(red_push),
                                 pct(red_all), r.hit_rate(), r.sched_ms_mean);
        if (o.digest) std::cout << fmt::format("{:<10}plan digest {:016x}\n", "", r.plan_digest);
        std::cout << fmt::format(
            "{:<10}bytes (dim {}, {}): pull {:.1f} MB, push {:.1f} MB, total {:.1f} MB ({} vs vanilla); flushes {:.1f} MB\n", "", dim,
            optimizer, static_cast<double>(bytes.pull) / 1e6,
            static_cast<double>(bytes.push_grad + bytes.push_value + bytes.push_evict) / 1e6,
            static_cast<double>(bytes.total() - bytes.flush) / 1e6, vanilla ? "-" + pct(red_bytes) + "%" : std::string("-"),
            static_cast<double>(bytes.flush) / 1e6);
        if (o.scheduler.budget_ms > 0 && r.laia_tables_mean > 0) {
          std::cout << fmt::format(
              "{:<10}adaptive LAIA: {:.1f} tables scored on average, scoring {:.3f} ms per batch (budget {:g} ms: {})\n", "",
              r.laia_tables_mean, r.scoring_ms_mean, o.scheduler.budget_ms,
              r.scoring_ms_mean <= o.scheduler.budget_ms ? "met" : "exceeded");
        }
        std::cout << fmt::format("{:<10}{} of the pulls ({:.0f}%) fetch rows no earlier iteration used (no policy avoids them)\n", "",
                                 t.cold_pulls, t.pulls ? 100.0 * static_cast<double>(t.cold_pulls) / static_cast<double>(t.pulls) : 0.0);
        if (!r.per_link.empty()) {
          const auto& [in, across] = std::pair(r.per_link[0], r.per_link[1]);
          std::cout << fmt::format("{:<10}{} hosts: across hosts {} rows, {:.1f} MB; within hosts {} rows, {:.1f} MB\n", "", hosts,
                                   across.transmissions() + across.flush_grad + across.flush_value,
                                   static_cast<double>(scheduler::wire_bytes(across, row).total()) / 1e6,
                                   in.transmissions() + in.flush_grad + in.flush_value,
                                   static_cast<double>(scheduler::wire_bytes(in, row).total()) / 1e6);
        }
        if (r.per_shard.size() > 1) {
          std::cout << fmt::format(
              "{:<10}{} PS shards, busiest over mean: pulls {:.3f}, pushes {:.3f}, bytes {:.3f}\n", "", r.per_shard.size(),
              scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pulls; }),
              scheduler::max_over_mean(r.per_shard, [](const auto& c) { return c.pushes(); }),
              scheduler::max_over_mean(r.per_shard, [&](const auto& c) { return scheduler::wire_bytes(c, row).total(); }));
        }
        if (t.hot_sync > 0) {
          std::cout << fmt::format(
              "{:<10}replicated rows all-reduced among workers (summed over workers): {}; written back at flushes: {}\n", "", t.hot_sync,
              t.hot_flush);
        }
      }
    }
    return 0;
  });
}
