// ember-plan: the planner's cost model (issue 29, first slice). Predicts, per table, the
// rows and bytes one iteration moves under `vanilla` from a dataset's per-row
// frequencies (docs/planner.md).
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

int main(int argc, char** argv) {
  using namespace ember;
  CLI::App app{"ember-plan: predict per-table embedding traffic per iteration (vanilla) from a dataset's frequencies"};
  std::string data_dir;
  planner::Topology topo;
  std::uint32_t dim = 16;
  std::string optimizer = "sgd";
  bool json = false;
  std::string order = "file";
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
  app.add_flag("--json", json, "one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return guarded_main("ember-plan", [&] {
    if (dim < 1) throw ConfigError("--dim must be at least 1");
    const scheduler::RowFormat row{dim, ps::state_floats(ps::parse_optimizer(optimizer), dim)};
    data::Dataset ds = data::Dataset::open(data_dir, {false});
    const planner::Frequencies f = planner::load_frequencies(ds);
    const planner::CostEstimate est = order == "file" ? planner::vanilla_cost_in_order(ds, topo, row) : planner::vanilla_cost(f, topo, row);
    double pulls = 0, pushes = 0, bytes = 0;
    for (const auto& t : est.tables) {
      pulls += t.pulls;
      pushes += t.push_grad;
      bytes += t.bytes;
    }
    const std::string life = std::isinf(est.lifetime) ? "none" : fmt::format("{:.1f}", est.lifetime);
    if (json) {
      nlohmann::ordered_json j = {
          {"policy", est.policy},
          {"order", order},
          {"samples", f.samples},
          {"workers", topo.workers},
          {"batch_per_worker", topo.batch_per_worker},
          {"cache_ratio", topo.cache_ratio},
          {"cache_rows", est.cache_rows},
          {"cache_demand", est.cache_demand},
          {"lifetime", std::isinf(est.lifetime) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(est.lifetime)},
          {"warmup", topo.warmup},
          {"iterations", topo.iterations},
          {"dim", dim},
          {"optimizer", optimizer},
          {"pulls", pulls},
          {"pushes", pushes},
          {"bytes", bytes}};
      auto& arr = j["tables"] = nlohmann::ordered_json::array();
      for (const auto& t : est.tables) {
        arr.push_back({{"name", t.name},
                       {"rows", t.rows},
                       {"accessed", t.accessed},
                       {"distinct_per_worker", t.distinct_per_worker},
                       {"pulls", t.pulls},
                       {"push_grad", t.push_grad},
                       {"pushes", t.push_grad},
                       {"hits", t.hits},
                       {"pull_state", t.pull_state},
                       {"bytes", t.bytes}});
      }
      std::cout << j.dump() << "\n";
      return 0;
    }
    std::cout << fmt::format(
        "vanilla, {} workers x {} samples, {} order; frequencies of {} training samples; cache {} rows per worker (demand {:.2f} of it, "
        "copy lifetime {} iterations); mean of iterations {}..{}; rows per iteration\n",
        topo.workers, topo.batch_per_worker, order, f.samples, est.cache_rows, est.cache_demand, life, topo.warmup,
        topo.warmup + topo.iterations - 1);
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12}{:>12}{:>8}{:>12}\n", "table", "rows", "accessed", "E(b)", "pulled", "pushed",
                             "hit", "KB");
    for (const auto& t : est.tables) {
      const double hit = t.hits + t.pulls > 0 ? t.hits / (t.hits + t.pulls) : 0.0;
      std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>12.1f}{:>8.3f}{:>12.1f}\n", t.name, t.rows, t.accessed,
                               t.distinct_per_worker, t.pulls, t.push_grad, hit, t.bytes / 1e3);
    }
    std::cout << fmt::format("{:<8}{:>12}{:>12}{:>12}{:>12.1f}{:>12.1f}{:>8}{:>12.1f}\n", "total", "", "", "", pulls, pushes, "",
                             bytes / 1e3);
    std::cout << fmt::format("bytes: dim {}, {} (payload, as ember-sim counts them)\n", dim, optimizer);
    return 0;
  });
}
