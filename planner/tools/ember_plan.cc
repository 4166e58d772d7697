// ember-plan: the planner's cost model (issue 29). Predicts, per table and per PS shard,
// the rows and bytes one iteration moves: `vanilla` analytically from a dataset's per-row
// frequencies, other policies from a short simulator sample (docs/planner.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/main.h"
#include "ember/data/dataset.h"
#include "ember/planner/cost_model.h"
#include "ember/ps/sparse_optimizer.h"
#include "ember/scheduler/policy.h"

int main(int argc, char** argv) {
  using namespace ember;
  CLI::App app{"ember-plan: predict per-table embedding traffic per iteration (vanilla) from a dataset's frequencies"};
  std::string data_dir;
  planner::Topology topo;
  std::uint32_t dim = 16;
  std::string optimizer = "sgd";
  bool json = false;
  std::string order = "file", policy = "vanilla";
  std::uint64_t sample = 20, seed = 1;
  app.add_option("--data", data_dir, "dataset directory from `ember-data prep` (train split frequencies)")->required();
  app.add_option("--workers", topo.workers, "workers")->capture_default_str();
  app.add_option("--batch-per-worker", topo.batch_per_worker, "samples per worker per iteration")->capture_default_str();
  app.add_option("--cache-ratio", topo.cache_ratio, "cache rows per worker as a share of all rows")->capture_default_str();
  app.add_option("--warmup", topo.warmup, "iterations before the ones averaged (caches start empty)")->capture_default_str();
  app.add_option("--iterations", topo.iterations, "iterations averaged over")->capture_default_str();
  app.add_option("--dim", dim, "embedding dimension, for bytes")->capture_default_str();
  app.add_option("--optimizer", optimizer, "sparse optimizer (its state travels with values), for bytes")->capture_default_str();
  app.add_option("--order", order,
                 "file: the job reads the split in file order (per-batch frequencies); shuffled: as with --shuffle (the split's "
                 "frequencies)")
      ->check(CLI::IsMember({"file", "shuffled"}))
      ->capture_default_str();
  app.add_option("--ps", topo.shards, "PS shards: the load per shard (a key's shard as the PS places it)")->capture_default_str();
  app.add_option("--policy", policy, "vanilla (analytic) or another ember-sim policy (herald, laia, ...: from a simulator sample)")
      ->capture_default_str();
  app.add_option("--sample", sample, "policies other than vanilla: iterations simulated (after --warmup) for their rows")
      ->capture_default_str();
  app.add_option("--seed", seed, "policies other than vanilla: the scheduler's seed, as ember-sim's")->capture_default_str();
  app.add_flag("--json", json, "one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return guarded_main("ember-plan", [&] {
    if (dim < 1) throw ConfigError("--dim must be at least 1");
    if (topo.shards < 1) throw ConfigError("--ps must be at least 1");
    const scheduler::RowFormat row{dim, ps::state_floats(ps::parse_optimizer(optimizer), dim)};
    data::Dataset ds = data::Dataset::open(data_dir, {false});
    const bool analytic = scheduler::parse_policy(policy).name() == "vanilla";
    planner::CostEstimate est;
    std::uint64_t samples = ds.split(data::Split::kTrain).rows();
    if (analytic) {
      const planner::Frequencies f = planner::load_frequencies(ds);
      samples = f.samples;
      est = order == "file" ? planner::vanilla_cost_in_order(ds, topo, row) : planner::vanilla_cost(f, topo, row);
    } else {
      est = planner::sampled_cost(ds, topo, row, policy, sample, order == "shuffled", seed);
    }
    double pulls = 0, pushes = 0, bytes = 0;
    for (const auto& t : est.tables) {
      pulls += t.pulls;
      pushes += t.pushes();
      bytes += t.bytes;
    }
    const std::string life = std::isinf(est.lifetime) ? "none" : fmt::format("{:.1f}", est.lifetime);
    const std::uint64_t first = topo.warmup, counted = est.sampled ? est.sample_iterations : topo.iterations;
    if (json) {
      nlohmann::ordered_json j = {
          {"policy", est.policy},
          {"order", order},
          {"sampled", est.sampled},
          {"samples", samples},
          {"workers", topo.workers},
          {"batch_per_worker", topo.batch_per_worker},
          {"cache_ratio", topo.cache_ratio},
          {"cache_rows", est.cache_rows},
          {"cache_demand", est.cache_demand},
          {"lifetime", std::isfinite(est.lifetime) ? nlohmann::ordered_json(est.lifetime) : nlohmann::ordered_json(nullptr)},
          {"warmup", first},
          {"iterations", counted},
          {"ps", topo.shards},
          {"dim", dim},
          {"optimizer", optimizer},
          {"pulls", pulls},
          {"pushes", pushes},
          {"bytes", bytes}};
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
      j["shard_balance"] = {{"pulls", planner::max_over_mean(est.shards, &planner::ShardCost::pulls)},
                            {"pushes", planner::max_over_mean(est.shards, &planner::ShardCost::pushes)},
                            {"bytes", planner::max_over_mean(est.shards, &planner::ShardCost::bytes)}};
      std::cout << j.dump() << "\n";
      return 0;
    }
    if (est.sampled) {
      std::cout << fmt::format(
          "{}, {} workers x {} samples, {} order; SAMPLED: rows counted by the simulator over iterations {}..{} (a {}-iteration "
          "sample, {:.2f} s); cache {} rows per worker; rows per iteration\n",
          est.policy, topo.workers, topo.batch_per_worker, order, first, first + counted - 1, counted, est.sample_seconds, est.cache_rows);
    } else {
      std::cout << fmt::format(
          "vanilla, {} workers x {} samples, {} order; frequencies of {} training samples; cache {} rows per worker (demand {:.2f} of it, "
          "copy lifetime {} iterations); mean of iterations {}..{}; rows per iteration\n",
          topo.workers, topo.batch_per_worker, order, samples, est.cache_rows, est.cache_demand, life, first, first + counted - 1);
    }
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12}{:>12}{:>8}{:>12}\n", "table", "rows", "accessed", "E(b)", "pulled", "pushed",
                             "hit", "KB");
    for (const auto& t : est.tables) {
      const double hit = t.hits + t.pulls > 0 ? t.hits / (t.hits + t.pulls) : 0.0;
      std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>12.1f}{:>8.3f}{:>12.1f}\n", t.name, t.rows, t.accessed,
                               t.distinct_per_worker, t.pulls, t.pushes(), hit, t.bytes / 1e3);
    }
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>8}{:>12.1f}\n", "total", "", "", "", pulls, pushes, "",
                             bytes / 1e3);
    std::cout << fmt::format("bytes: dim {}, {} (payload, as ember-sim counts them)\n", dim, optimizer);
    if (est.shards.size() > 1) {
      std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}\n", "shard", "pulled", "pushed", "KB");
      for (std::size_t s = 0; s < est.shards.size(); ++s) {
        const auto& c = est.shards[s];
        std::cout << fmt::format("{:<8}{:>12.1f}{:>12.1f}{:>12.1f}\n", s, c.pulls, c.pushes, c.bytes / 1e3);
      }
      std::cout << fmt::format("{} PS shards, busiest over mean: pulls {:.3f}, pushes {:.3f}, bytes {:.3f}\n", est.shards.size(),
                               planner::max_over_mean(est.shards, &planner::ShardCost::pulls),
                               planner::max_over_mean(est.shards, &planner::ShardCost::pushes),
                               planner::max_over_mean(est.shards, &planner::ShardCost::bytes));
    }
    return 0;
  });
}
