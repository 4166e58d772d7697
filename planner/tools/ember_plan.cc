// ember-plan: the planner's cost model (issue 29). Predicts, per table and per PS shard,
// the rows and bytes one iteration moves: `vanilla` analytically from a dataset's per-row
// frequencies, other policies from a short simulator sample (docs/planner.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/main.h"
#include "ember/data/dataset.h"
#include "ember/planner/cost_model.h"
#include "ember/planner/search.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/policy.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/scheduler/simulator.h"
#include "ember/scheduler/tier_report.h"

namespace {
using namespace ember;

// Seconds per iteration of `c` under `calibration` (ember-plan --calibration), if given.
std::optional<double> iteration_s(const planner::PlanCost& c, const std::optional<planner::Calibration>& calibration) {
  if (!calibration) return std::nullopt;
  return planner::iteration_seconds(c, *calibration);
}

nlohmann::ordered_json cost_json(const planner::PlanCost& c, const std::optional<planner::Calibration>& calibration) {
  const std::optional<double> it = iteration_s(c, calibration);
  return {{"busiest_link", c.worker_busiest() ? "worker" : "ps"},
          {"iteration_s", it ? nlohmann::ordered_json(*it) : nlohmann::ordered_json()},
          {"allreduce_rows_bytes", c.allreduce_rows},
          {"busiest_bytes", c.busiest()},
          {"worker_link_bytes", c.worker_link},
          {"ps_link_bytes", c.ps_link},
          {"total_bytes", c.total},
          {"seconds", c.busiest_s()},
          {"worker_link_seconds", c.worker_s},
          {"ps_link_seconds", c.ps_s},
          {"memory", c.memory},
          {"cache_rows", c.cache_rows},
          {"modelled_cache_rows", c.modelled_cache}};
}

std::string summary(const std::string& label, const planner::PlanCost& c, const std::optional<planner::Calibration>& calibration) {
  const std::optional<double> s = iteration_s(c, calibration);
  const std::string it = s ? fmt::format("iteration {:.1f} ms; ", *s * 1e3) : "";
  return fmt::format(
      "{:<28} {}busiest link {:>10.1f} KB ({}), {:>8.3f} ms; worker link {:.1f} KB ({:.3f} ms), PS link {:.1f} KB ({:.3f} ms); "
      "memory {:.1f} MB (cache {} rows, modelled at {})\n",
      label, it, c.busiest() / 1e3, c.worker_busiest() ? "worker" : "PS", c.busiest_s() * 1e3, c.worker_link / 1e3, c.worker_s * 1e3,
      c.ps_link / 1e3, c.ps_s * 1e3, static_cast<double>(c.memory) / (1 << 20), c.cache_rows, c.modelled_cache);
}

void print_plan(const std::string& label, const std::vector<planner::TableShape>& tables, const planner::PlanCost& c) {
  std::cout << label << "\n";
  std::cout << fmt::format("{:<8}{:>10}{:>12}{:>12}{:>12}{:>12}{:>12}\n", "table", "rows", "treatment", "rows/it", "KB/it", "worker KB",
                           "PS KB");
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    const auto& o = c.tables[t];
    std::cout << fmt::format("{:<8}{:>10}{:>12}{:>12.1f}{:>12.1f}{:>12.2f}{:>12.2f}\n", tables[t].name, tables[t].rows,
                             planner::treatment_name(o.treatment), o.rows, o.bytes / 1e3, o.worker_link / 1e3, o.ps_link / 1e3);
  }
}

// What a placement is planned with, besides the topology.
struct PlanOptions {
  scheduler::RowFormat row;
  std::string policy, order;
  bool analytic = true;
  std::uint64_t sample = 20, seed = 1, memory = 0;
  double ps_mbit = 1000, worker_mbit = 1000;
  bool shares = true;                               // try cache shares for the searched plan's cached tables
  std::optional<planner::Calibration> calibration;  // --calibration: iteration times
};

// The plans for one topology: all on PS + cache, the greedy baselines, the search.
struct Planned {
  std::vector<planner::TableShape> tables;
  std::uint64_t least = 0;  // the smallest feasible memory
  planner::PlanCost all_cost, best_greedy_cost, searched_cost;
  std::vector<planner::Treatment> best_greedy, searched;
  std::string best_order;
  std::vector<std::pair<std::string, planner::PlanCost>> greedies;
  std::size_t model_runs = 0;
  double model_seconds = 0, search_seconds = 0;
  // The searched plan's cache shares (choose_shares, from simulator samples of the plan),
  // when asked for; the label of the one chosen.
  planner::ShareChoice shares;
  double shares_seconds = 0;
};

scheduler::PlanFile plan_file(const std::vector<planner::TableShape>& tables, const std::vector<planner::Treatment>& plan,
                              std::uint32_t cache_rows, std::uint32_t batch_per_worker) {
  scheduler::PlanFile pf;
  for (const auto& t : tables) pf.names.push_back(t.name), pf.rows.push_back(t.rows);
  pf.treatments = plan;
  pf.cache_rows = cache_rows;
  pf.batch_per_worker = batch_per_worker;
  return pf;
}

Planned search_plans(const data::Dataset& ds, const planner::Frequencies& f, const planner::Topology& topo, const PlanOptions& o,
                     bool with_shares) {
  Planned r;
  planner::PlacementInput in;
  in.tables = planner::table_shapes(f, topo);
  in.workers = topo.workers;
  in.batch_per_worker = topo.batch_per_worker;
  in.shards = topo.shards;
  in.row = o.row;
  in.memory = o.memory;
  in.ps_mbit = o.ps_mbit;
  in.worker_mbit = o.worker_mbit;
  in.cache_model = [&](double ratio) {
    planner::Topology t = topo;
    t.cache_ratio = ratio;
    const auto start = std::chrono::steady_clock::now();
    planner::CostEstimate e = !o.analytic         ? planner::sampled_cost(ds, t, o.row, o.policy, o.sample, o.order == "shuffled", o.seed)
                              : o.order == "file" ? planner::vanilla_cost_in_order(ds, t, o.row)
                                                  : planner::vanilla_cost(f, t, o.row);
    r.model_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return e;
  };
  planner::Placement pl(std::move(in));
  r.tables = pl.input().tables;
  r.least = pl.min_memory();
  if (o.memory < r.least) {
    throw ConfigError(
        fmt::format("--memory {} is below the smallest feasible plan ({} bytes per worker: b rows of every table, or the "
                    "table if smaller) by {} bytes",
                    o.memory, r.least, r.least - o.memory));
  }
  const auto start = std::chrono::steady_clock::now();
  r.all_cost = pl.evaluate(std::vector<planner::Treatment>(r.tables.size(), planner::Treatment::kCache));
  for (const std::string key : {"size", "lookups", "size_x_lookups"}) {
    auto plan = pl.greedy(pl.order_by(key));
    planner::PlanCost c = pl.evaluate(plan);
    r.greedies.emplace_back(key, c);
    if (r.best_greedy.empty() || planner::better(c, r.best_greedy_cost)) r.best_greedy = plan, r.best_greedy_cost = c, r.best_order = key;
  }
  r.searched = pl.search(r.best_greedy);
  r.searched_cost = pl.evaluate(r.searched);
  r.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.model_runs = pl.model_runs();
  if (with_shares && r.searched_cost.feasible) {
    // Shares are costed by executing the plan in simulator samples (the analytic model has
    // one LRU): every candidate, one LRU included, on that same footing.
    const auto share_start = std::chrono::steady_clock::now();
    r.shares = planner::choose_shares(pl, r.searched, r.searched_cost, [&](const std::vector<std::uint32_t>& shares) {
      scheduler::PlanFile pf = plan_file(r.tables, r.searched, r.searched_cost.cache_rows, topo.batch_per_worker);
      pf.cache_shares = shares;
      return planner::sampled_cost(ds, topo, o.row, o.policy, o.sample, o.order == "shuffled", o.seed, &pf);
    });
    r.shares_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - share_start).count();
  }
  return r;
}

// A plan's cost per sample, what batch sizes are compared by: the calibrated iteration
// time if there is one (made at one batch size: a guide only at others), else the busiest
// link's.
double per_sample_seconds(const planner::PlanCost& c, const planner::Topology& topo, const PlanOptions& o) {
  const double t = iteration_s(c, o.calibration).value_or(c.busiest_s());
  return t / (static_cast<double>(topo.workers) * topo.batch_per_worker);
}

// SCARS's trade-off: a larger micro-batch needs more staging and leaves less cache,
// and shares more rows within the batch. Each batch size gets its searched plan; the
// cheapest per sample is the one planned: `topo` gets its batch size. Returns each
// batch size's row of --json.
nlohmann::ordered_json choose_batch_size(const data::Dataset& ds, const planner::Frequencies& f, planner::Topology& topo,
                                         const PlanOptions& o, const std::vector<std::uint32_t>& batch_choices, bool json) {
  nlohmann::ordered_json trade = nlohmann::ordered_json::array();
  double best = std::numeric_limits<double>::infinity();
  std::uint32_t best_b = 0;
  std::string table = fmt::format("{:>10}{:>14}{:>12}{:>16}{:>14}{:>16}\n", "batch", "least memory", "cache rows", "busiest KB/it",
                                  "busiest link", "us per sample");
  for (std::uint32_t b : batch_choices) {
    planner::Topology t = topo;
    t.batch_per_worker = b;
    try {
      const Planned p = search_plans(ds, f, t, o, false);
      if (!p.searched_cost.feasible) {
        throw ConfigError(
            "the model refused every cache size (a cache below a micro-batch's rows, or a split shorter than "
            "--warmup + --iterations, or + --sample, global batches)");
      }
      const double per = per_sample_seconds(p.searched_cost, t, o);
      table += fmt::format("{:>10}{:>14}{:>12}{:>16.1f}{:>14}{:>16.3f}\n", b, p.least, p.searched_cost.cache_rows,
                           p.searched_cost.busiest() / 1e3, p.searched_cost.worker_busiest() ? "worker" : "PS", per * 1e6);
      trade.push_back({{"batch_per_worker", b},
                       {"least_memory", p.least},
                       {"searched", cost_json(p.searched_cost, o.calibration)},
                       {"per_sample_s", per}});
      if (per < best) best = per, best_b = b;
    } catch (const ConfigError& e) {
      table += fmt::format("{:>10}  not feasible: {}\n", b, e.what());
      trade.push_back({{"batch_per_worker", b}, {"infeasible", e.what()}});
    }
  }
  if (best_b == 0) throw ConfigError("--batch-choices: no batch size has a feasible plan under --memory " + std::to_string(o.memory));
  if (!json) {
    std::cout << "batch size against cache (the searched plan per batch size; "
              << (o.calibration ? "calibrated iteration time" : "busiest link") << " per sample):\n"
              << table << fmt::format("planned below: --batch-per-worker {}\n\n", best_b);
  }
  topo.batch_per_worker = best_b;
  return trade;
}

// --plan-out and --greedy-out: the searched plan (with its cache shares) and the best greedy one.
void write_plans(const Planned& p, const planner::Topology& topo, const std::string& plan_out, const std::string& greedy_out) {
  if (!plan_out.empty()) {
    scheduler::PlanFile pf = plan_file(p.tables, p.searched, p.searched_cost.cache_rows, topo.batch_per_worker);
    pf.cache_shares = p.shares.shares;
    planner::write_plan(plan_out, pf);
  }
  if (!greedy_out.empty()) {
    planner::write_plan(greedy_out, plan_file(p.tables, p.best_greedy, p.best_greedy_cost.cache_rows, topo.batch_per_worker));
  }
}

// The cache shares tried for the searched plan, as --json has them and as text lines;
// both empty when none were tried.
struct SharesReport {
  nlohmann::ordered_json json;
  std::string text;
};

// The report of the cache shares choose_shares tried (search_plans, with shares).
SharesReport shares_report(const Planned& p, const PlanOptions& o) {
  SharesReport r;
  if (!p.shares.tried.empty()) {
    auto tried = nlohmann::ordered_json::array();
    r.text = fmt::format("cache shares for the searched plan ({} simulator samples of it, {:.2f} s; chosen: {}):\n", p.shares.tried.size(),
                         p.shares_seconds, p.shares.label);
    for (const auto& [label, cost] : p.shares.tried) {
      tried.push_back({{"candidate", label}, {"cost", cost_json(cost, o.calibration)}});
      r.text += summary("  " + label + ":", cost, o.calibration);
    }
    nlohmann::ordered_json per_table = nlohmann::ordered_json::array();
    for (std::uint32_t s : p.shares.shares) per_table.push_back(s);
    r.json = {{"chosen", p.shares.label}, {"cache_shares", per_table}, {"tried", tried}, {"seconds", p.shares_seconds}};
  }
  return r;
}

// The placement's --json: every plan's cost, the batch sizes tried, the shares, the plans.
void print_placement_json(const Planned& p, const planner::Topology& topo, const PlanOptions& o, const std::string& model,
                          const nlohmann::ordered_json& trade, const nlohmann::ordered_json& shares_json) {
  nlohmann::ordered_json greedy_json = nlohmann::ordered_json::object();
  for (const auto& [key, c] : p.greedies) greedy_json[key] = cost_json(c, o.calibration);
  nlohmann::ordered_json j = {{"policy", model},
                              {"batch_per_worker", topo.batch_per_worker},
                              {"memory", o.memory},
                              {"min_memory", p.least},
                              {"ps_link_mbit", o.ps_mbit},
                              {"worker_link_mbit", o.worker_mbit},
                              {"all_cache", cost_json(p.all_cost, o.calibration)},
                              {"greedy", greedy_json},
                              {"best_greedy", p.best_order},
                              {"searched", cost_json(p.searched_cost, o.calibration)},
                              {"model_runs", p.model_runs},
                              {"model_seconds", p.model_seconds},
                              {"search_seconds", p.search_seconds}};
  if (!trade.empty()) j["batch_choices"] = trade;
  if (!shares_json.is_null()) j["shares"] = shares_json;
  auto& arr = j["plan"] = nlohmann::ordered_json::array();
  for (std::size_t t = 0; t < p.searched.size(); ++t) {
    arr.push_back({{"name", p.tables[t].name},
                   {"greedy", planner::treatment_name(p.best_greedy[t])},
                   {"searched", planner::treatment_name(p.searched[t])}});
  }
  std::cout << j.dump() << "\n";
}

// The placement as text: the plans table by table, then every plan's cost.
void print_placement_text(const Planned& p, const planner::Topology& topo, const PlanOptions& o, const std::string& model,
                          const std::string& shares_text) {
  std::cout << fmt::format(
      "PREDICTED by the model (execute the plan with --placement on ember-worker, ember-sim or the launcher); PS + cache from {}; {} "
      "workers x {} samples, {} PS shard(s); memory {} bytes per worker (least feasible {}); {} cache model runs ({:.2f} s), search "
      "{:.2f} s\n",
      model, topo.workers, topo.batch_per_worker, topo.shards, o.memory, p.least, p.model_runs, p.model_seconds, p.search_seconds);
  print_plan("best greedy (by " + p.best_order + "):", p.tables, p.best_greedy_cost);
  print_plan("searched (beam + local moves):", p.tables, p.searched_cost);
  std::cout << fmt::format("links: {} Mbit/s per PS shard, {} Mbit/s per worker\n", o.ps_mbit, o.worker_mbit);
  std::cout << summary("all on PS + cache:", p.all_cost, o.calibration);
  for (const auto& [key, c] : p.greedies) std::cout << summary("greedy by " + key + ":", c, o.calibration);
  std::cout << summary("searched:", p.searched_cost, o.calibration);
  std::cout << shares_text;
}

int plan_placement(const data::Dataset& ds, planner::Topology topo, const PlanOptions& o, const std::vector<std::uint32_t>& batch_choices,
                   const std::string& plan_out, const std::string& greedy_out, bool json) {
  const planner::Frequencies f = planner::load_frequencies(ds);
  nlohmann::ordered_json trade = nlohmann::ordered_json::array();
  if (!batch_choices.empty()) trade = choose_batch_size(ds, f, topo, o, batch_choices, json);
  const Planned p = search_plans(ds, f, topo, o, o.shares);
  write_plans(p, topo, plan_out, greedy_out);
  const SharesReport shares = shares_report(p, o);
  const std::string model = o.analytic ? "vanilla (analytic, " + o.order + " order)" : o.policy + " (SAMPLED by the simulator)";
  if (json) {
    print_placement_json(p, topo, o, model, trade, shares.json);
    return 0;
  }
  print_placement_text(p, topo, o, model, shares.text);
  return 0;
}

// The disk tier's prediction (--ram-budget-mb), per shard and iteration: rows used,
// read from disk, and read while a request waited, without and with hints (the shape
// ember-sim prints), and how far ahead the hints come.
nlohmann::ordered_json tier_json(const planner::CostEstimate& est, const planner::Topology& topo, scheduler::RowFormat row) {
  std::vector<std::pair<scheduler::TierRates, scheduler::TierRates>> shards;
  for (const auto& s : est.shards) shards.emplace_back(s.tier, s.tier_hinted);
  nlohmann::ordered_json j = scheduler::tier_json(topo.tier_budget_bytes, row.stored_bytes(), shards);
  j["lookahead"] = topo.lookahead;
  return j;
}

void print_tier(const planner::CostEstimate& est, const planner::Topology& topo, scheduler::RowFormat row) {
  const std::string hints =
      topo.lookahead > 0 ? fmt::format("hints {} iteration(s) ahead", topo.lookahead) : "no hints without --lookahead";
  std::cout << fmt::format("disk tier: {:.1f} MB of rows in memory per shard, {}-byte rows; {}; rows per iteration\n",
                           static_cast<double>(topo.tier_budget_bytes) / (1024 * 1024), row.stored_bytes(), hints);
  std::cout << fmt::format("{:<8}{:>14}{:>14}{:>14}{:>14}{:>14}\n", "shard", "rows used", "read", "waited for", "read, hints",
                           "waited, hints");
  for (std::size_t s = 0; s < est.shards.size(); ++s) {
    const auto& a = est.shards[s].tier;
    const auto& h = est.shards[s].tier_hinted;
    std::cout << fmt::format("{:<8}{:>14.1f}{:>14.1f}{:>14.1f}{:>14.1f}{:>14.1f}\n", s, a.rows_touched, a.reads, a.critical_reads, h.reads,
                             h.critical_reads);
  }
}

// ember-plan's command line (the variables CLI11 writes into); its initial values are the
// flags' defaults.
struct Flags {
  Flags() {
    shape.workers = topo.workers;
    shape.batch_per_worker = topo.batch_per_worker;
    shape.cache_ratio = topo.cache_ratio;
    iterations = topo.warmup + topo.iterations;  // as ember-sim's: the --warmup ones included
  }
  std::string data_dir;
  planner::Topology topo;
  std::uint32_t dim = 16;
  std::string optimizer = "sgd";
  bool json = false;
  std::string order = "file", policy = "vanilla";
  std::uint64_t sample = 20, seed = 1;
  scheduler::SchedulerOptions shape;  // the job's shape, as every scheduler program takes it
  std::uint64_t iterations = 0;       // --iterations: the job's, --warmup included
  double ram_budget_mb = 0;
  std::string memory_arg, plan_out, greedy_out, calibration_file;
  std::vector<std::uint32_t> batch_choices;
  double link_mbit = 1000, worker_link_mbit = 0;
  bool no_shares = false;
};

// ember-plan's flags, declared once each (common/option_registry.h): the dataset, the
// job's shape by the flags every scheduler program declares (scheduler_cli.cc: ember-sim's,
// ember-worker's), the model's own and the placement search's.
using Decl = OptionDecl<Flags>;

template <class T>
Decl flag(const char* name, T Flags::*member, const char* help) {
  return field_option<Flags>(name, member, help, kShapeProgram);
}
template <class T>
Decl topo_flag(const char* name, T planner::Topology::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kShapeProgram, [](auto& f) -> auto& { return f.topo; });
}

// --batch-choices: sizes, comma-separated.
Decl batch_choices_flag(const char* help) {
  Decl d;
  d.flag = "--batch-choices";
  d.help = help;
  d.programs = kShapeProgram;
  d.kind = OptionKind::kText;
  d.add = [flag = d.flag, help = d.help](CLI::App& app, Flags& f) { return app.add_option(flag, f.batch_choices, help)->delimiter(','); };
  d.text = [](const Flags& f) {
    std::string s;
    for (std::uint32_t b : f.batch_choices) s += (s.empty() ? "" : ",") + std::to_string(b);
    return s;
  };
  d.value = d.text;
  return d;
}

// The traffic model: the run averaged, row sizes, data order, shards, the policy sampled.
std::vector<Decl> model_options() {
  return {
      topo_flag("--warmup", &planner::Topology::warmup, "of the --iterations, the first ones not averaged (caches start empty)"),
      flag("--iterations", &Flags::iterations, "global batches of the job (as ember-sim's), averaged after --warmup"),
      flag("--dim", &Flags::dim, "embedding dimension, for bytes"),
      flag("--optimizer", &Flags::optimizer, "sparse optimizer (its state travels with values), for bytes"),
      flag("--order", &Flags::order,
           "file: the job reads the split in file order (per-batch frequencies); shuffled: as with --shuffle (the split's "
           "frequencies)")
          .checked(CLI::IsMember({"file", "shuffled"})),
      topo_flag("--ps", &planner::Topology::shards, "PS shards: the load per shard (a key's shard as the PS places it)"),
      flag("--policy", &Flags::policy, "vanilla (analytic) or another ember-sim policy (herald, laia, ...: from a simulator sample)"),
      flag("--sample", &Flags::sample, "policies other than vanilla: iterations simulated (after --warmup) for their rows"),
      flag("--seed", &Flags::seed, "policies other than vanilla: the scheduler's seed, as ember-sim's"),
      flag("--ram-budget-mb", &Flags::ram_budget_mb,
           "a disk tier under each PS shard with this RAM budget (ember-ps --ram-budget-mb): predict its disk reads per "
           "iteration without and with hints (from a simulator sample, vanilla too)")
          .default_hidden(),
      topo_flag("--lookahead", &planner::Topology::lookahead,
                "sampled policies: batches the scheduler sees beyond the one it plans, and how far ahead the tier's hints come "
                "(ember-sim's --lookahead)"),
      flag("--json", &Flags::json, "one JSON object"),
  };
}

// The placement search (--memory and what goes with it).
std::vector<Decl> placement_options() {
  return {
      flag("--memory", &Flags::memory_arg,
           "plan the tables' treatments under this memory per worker (bytes, or with K, M, G: binary): replicated tables "
           "plus one shared LRU of the rest"),
      flag("--link-mbit", &Flags::link_mbit, "with --memory: each link's rate in Mbit/s (the PS shards', and the workers' unless given)"),
      flag("--worker-link-mbit", &Flags::worker_link_mbit,
           "with --memory: each worker's link rate in Mbit/s (its PS traffic and the all-reduce), if not --link-mbit's")
          .default_hidden(),
      flag("--plan-out", &Flags::plan_out, "with --memory: write the searched plan as JSON here (ember-worker --placement)"),
      flag("--greedy-out", &Flags::greedy_out, "with --memory: write the best greedy plan as JSON here"),
      batch_choices_flag("with --memory: plan each of these samples per worker (comma-separated) and keep the cheapest per sample "
                         "(the cache against the batch size)"),
      flag("--no-shares", &Flags::no_shares,
           "with --memory: keep one LRU for the cached tables (by default cache shares are tried, each costed by a simulator "
           "sample of the searched plan)"),
      flag("--calibration", &Flags::calibration_file,
           "with --memory: predict each plan's iteration time from this calibration (scripts/bench_placement.py --calibrate)"),
  };
}

const std::vector<Decl>& plan_flags() {
  static const std::vector<Decl> decls = [] {  // immutable after its first use
    std::vector<Decl> d = {flag("--dataset", &Flags::data_dir, "dataset directory from `ember-data prep` (train split frequencies)")};
    for (const auto& s : scheduler::scheduler_options())
      d.push_back(rebind_option<Flags>(
          s, [](auto& f) -> auto& { return f.shape; }));
    for (Decl& m : model_options()) d.push_back(std::move(m));
    for (Decl& m : placement_options()) d.push_back(std::move(m));
    return d;
  }();
  return decls;
}

// ember-plan's flags, declared into `f` (which outlives the parse).
void add_flags(CLI::App& app, Flags& f) {
  add_options(app, plan_flags(), f, kShapeProgram);
  app.get_option("--dataset")->required();
  add_renamed_flag(app, "--data", "--dataset", true);
}

// The job's shape from the flags, checked (the topology the model takes).
void set_up_topology(Flags& f) {
  planner::Topology& topo = f.topo;
  topo.workers = f.shape.workers;
  topo.batch_per_worker = f.shape.batch_per_worker;
  topo.cache_ratio = f.shape.cache_ratio;
  topo.cache_admission = f.shape.cache_admission;
  topo.iterations = scheduler::counted_iterations(f.iterations, topo.warmup, "averaged");
  if (f.dim < 1) throw ConfigError("--dim must be at least 1");
  if (topo.shards < 1) throw ConfigError("--ps must be at least 1");
}

// Whether the traffic is modelled analytically (vanilla, without a disk tier or cache
// admission), after --ram-budget-mb's tier is set; checks the flags that depend on it.
bool set_up_model(Flags& f) {
  planner::Topology& topo = f.topo;
  if (f.ram_budget_mb < 0) throw ConfigError("--ram-budget-mb must not be negative");
  topo.tier_budget_bytes = static_cast<std::uint64_t>(f.ram_budget_mb * 1024 * 1024);
  // The tier and admission are modelled by the simulator only: with either, vanilla is
  // sampled too.
  const bool analytic = scheduler::parse_policy(f.policy).name() == "vanilla" && topo.tier_budget_bytes == 0 &&
                        scheduler::parse_admission(topo.cache_admission) == scheduler::Admission::kNone;
  if (analytic && topo.lookahead > 0) throw ConfigError("--lookahead applies to a sampled policy or --ram-budget-mb, not analytic vanilla");
  if ((!f.plan_out.empty() || !f.greedy_out.empty() || !f.batch_choices.empty()) && f.memory_arg.empty()) {
    throw ConfigError("--plan-out, --greedy-out and --batch-choices need --memory");
  }
  return analytic;
}

// --memory's placement search: its options from the flags, checked.
PlanOptions plan_options(const Flags& f, scheduler::RowFormat row, bool analytic) {
  if (f.topo.tier_budget_bytes > 0) throw ConfigError("--ram-budget-mb does not combine with --memory (the placement search)");
  if (!(f.link_mbit > 0)) throw ConfigError("--link-mbit must be positive");
  if (f.worker_link_mbit < 0) throw ConfigError("--worker-link-mbit must be positive");
  PlanOptions o;
  if (!f.calibration_file.empty()) o.calibration = planner::read_calibration(f.calibration_file);
  o.row = row;
  o.policy = f.policy;
  o.order = f.order;
  o.analytic = analytic;
  o.sample = f.sample;
  o.seed = f.seed;
  o.memory = planner::parse_bytes(f.memory_arg);
  o.ps_mbit = f.link_mbit;
  o.worker_mbit = f.worker_link_mbit > 0 ? f.worker_link_mbit : f.link_mbit;
  o.shares = !f.no_shares;
  for (std::uint32_t b : f.batch_choices) {
    if (b == 0) throw ConfigError("--batch-choices: every batch size must be at least 1");
  }
  return o;
}

// The traffic predicted without --memory, and its totals over the tables.
struct Prediction {
  planner::CostEstimate est;
  std::uint64_t samples = 0;  // the training samples the frequencies are of
  double pulls = 0, pushes = 0, bytes = 0;
};

// Predicts every table's and shard's rows: analytic vanilla, or a simulator sample.
Prediction predict(const data::Dataset& ds, const Flags& flags, scheduler::RowFormat row, bool analytic) {
  const planner::Topology& topo = flags.topo;
  Prediction p;
  planner::CostEstimate& est = p.est;
  p.samples = ds.split(data::Split::kTrain).rows();
  if (analytic) {
    const planner::Frequencies f = planner::load_frequencies(ds);
    p.samples = f.samples;
    est = flags.order == "file" ? planner::vanilla_cost_in_order(ds, topo, row) : planner::vanilla_cost(f, topo, row);
  } else {
    est = planner::sampled_cost(ds, topo, row, flags.policy, flags.sample, flags.order == "shuffled", flags.seed);
  }
  for (const auto& t : est.tables) {
    p.pulls += t.pulls;
    p.pushes += t.pushes();
    p.bytes += t.bytes;
  }
  return p;
}

// The prediction as one JSON object: the job, the totals, per table, per shard, the tier.
void print_prediction_json(const Flags& f, scheduler::RowFormat row, const Prediction& p) {
  const planner::Topology& topo = f.topo;
  const planner::CostEstimate& est = p.est;
  const std::uint64_t first = topo.warmup, counted = est.sampled ? est.sample_iterations : topo.iterations;
  nlohmann::ordered_json j = {
      {"policy", est.policy},
      {"order", f.order},
      {"sampled", est.sampled},
      {"samples", p.samples},
      {"workers", topo.workers},
      {"batch_per_worker", topo.batch_per_worker},
      {"cache_ratio", topo.cache_ratio},
      {"cache_rows", est.cache_rows},
      {"cache_demand", est.cache_demand},
      {"lifetime", std::isfinite(est.lifetime) ? nlohmann::ordered_json(est.lifetime) : nlohmann::ordered_json(nullptr)},
      {"warmup", first},
      {"iterations", counted},
      {"ps", topo.shards},
      {"dim", f.dim},
      {"optimizer", f.optimizer},
      {"pulls", p.pulls},
      {"pushes", p.pushes},
      {"bytes", p.bytes}};
  if (est.sampled) {
    j["sample_iterations"] = est.sample_iterations;
    j["sample_seconds"] = est.sample_seconds;
  }
  auto& arr = j["tables"] = nlohmann::ordered_json::array();
  for (const auto& t : est.tables) {
    arr.push_back({{"name", t.name},
                   {"rows", t.rows},
                   {"accessed", t.accessed},
                   {"distinct_per_worker", t.distinct_per_worker},
                   {"pulls", t.pulls},
                   {"push_grad", t.push_grad},
                   {"push_value", t.push_value},
                   {"push_evict", t.push_evict},
                   {"pushes", t.pushes()},
                   {"hits", t.hits},
                   {"pull_state", t.pull_state},
                   {"bytes", t.bytes}});
  }
  auto& sh = j["shards"] = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < est.shards.size(); ++s) {
    const auto& c = est.shards[s];
    sh.push_back({{"shard", s}, {"pulls", c.pulls}, {"pull_state", c.pull_state}, {"pushes", c.pushes}, {"bytes", c.bytes}});
  }
  if (topo.tier_budget_bytes > 0) j["tier"] = tier_json(est, topo, row);
  j["shard_balance"] = {{"pulls", scheduler::max_over_mean(est.shards, &planner::ShardCost::pulls)},
                        {"pushes", scheduler::max_over_mean(est.shards, &planner::ShardCost::pushes)},
                        {"bytes", scheduler::max_over_mean(est.shards, &planner::ShardCost::bytes)}};
  std::cout << j.dump() << "\n";
}

// The prediction as text: the model's heading, the tables, the shards, the tier.
void print_prediction_text(const Flags& f, scheduler::RowFormat row, const Prediction& p) {
  const planner::Topology& topo = f.topo;
  const planner::CostEstimate& est = p.est;
  const std::string life = std::isinf(est.lifetime) ? "none" : fmt::format("{:.1f}", est.lifetime);
  const std::uint64_t first = topo.warmup, counted = est.sampled ? est.sample_iterations : topo.iterations;
  if (est.sampled) {
    std::cout << fmt::format(
        "{}, {} workers x {} samples, {} order; SAMPLED: rows counted by the simulator over iterations {}..{} (a {}-iteration "
        "sample, {:.2f} s); cache {} rows per worker; rows per iteration\n",
        est.policy, topo.workers, topo.batch_per_worker, f.order, first, first + counted - 1, counted, est.sample_seconds, est.cache_rows);
  } else {
    std::cout << fmt::format(
        "vanilla, {} workers x {} samples, {} order; frequencies of {} training samples; cache {} rows per worker (demand {:.2f} of it, "
        "copy lifetime {} iterations); mean of iterations {}..{}; rows per iteration\n",
        topo.workers, topo.batch_per_worker, f.order, p.samples, est.cache_rows, est.cache_demand, life, first, first + counted - 1);
  }
  std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12}{:>12}{:>8}{:>12}\n", "table", "rows", "accessed", "E(b)", "pulled", "pushed",
                           "hit", "KB");
  for (const auto& t : est.tables) {
    const double hit = t.hits + t.pulls > 0 ? t.hits / (t.hits + t.pulls) : 0.0;
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>12.1f}{:>8.3f}{:>12.1f}\n", t.name, t.rows, t.accessed,
                             t.distinct_per_worker, t.pulls, t.pushes(), hit, t.bytes / 1e3);
  }
  std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>8}{:>12.1f}\n", "total", "", "", "", p.pulls, p.pushes, "",
                           p.bytes / 1e3);
  std::cout << fmt::format("bytes: dim {}, {} (payload, as ember-sim counts them)\n", f.dim, f.optimizer);
  if (est.shards.size() > 1) {
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}\n", "shard", "pulled", "pushed", "KB");
    for (std::size_t s = 0; s < est.shards.size(); ++s) {
      const auto& c = est.shards[s];
      std::cout << fmt::format("{:<8}{:>12.1f}{:>12.1f}{:>12.1f}\n", s, c.pulls, c.pushes, c.bytes / 1e3);
    }
    std::cout << fmt::format("{} PS shards, busiest over mean: pulls {:.3f}, pushes {:.3f}, bytes {:.3f}\n", est.shards.size(),
                             scheduler::max_over_mean(est.shards, &planner::ShardCost::pulls),
                             scheduler::max_over_mean(est.shards, &planner::ShardCost::pushes),
                             scheduler::max_over_mean(est.shards, &planner::ShardCost::bytes));
  }
  if (topo.tier_budget_bytes > 0) print_tier(est, topo, row);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ember;
  CLI::App app{"ember-plan: predict per-table embedding traffic per iteration (vanilla) from a dataset's frequencies"};
  Flags f;
  add_flags(app, f);
  if (const int status = parse_command_line(app, argc, argv, "ember-plan"); status >= 0) return status;
  return guarded_main("ember-plan", [&] {
    set_up_topology(f);
    const scheduler::RowFormat row{f.dim, ps::state_floats(ps::parse_optimizer(f.optimizer), f.dim)};
    data::Dataset ds = data::Dataset::open(f.data_dir, {false});
    ds.manifest().require_fixed_tables(f.data_dir, "ember-plan");
    const bool analytic = set_up_model(f);
    if (!f.memory_arg.empty()) {
      return plan_placement(ds, f.topo, plan_options(f, row, analytic), f.batch_choices, f.plan_out, f.greedy_out, f.json);
    }
    const Prediction p = predict(ds, f, row, analytic);
    if (f.json) {
      print_prediction_json(f, row, p);
    } else {
      print_prediction_text(f, row, p);
    }
    return 0;
  });
}
