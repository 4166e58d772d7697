// ember-predict: scores a Criteo / Avazu text file (or a prepared split) with a model
// written by ember-export; prints AUC and log loss when the data has labels.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ember/common/blas_kernels.h"
#include "ember/common/cli.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/option_registry.h"
#include "ember/serve/export.h"

int main(int argc, char** argv) {
  using namespace ember;
  use_the_cpus_blas_kernels(argv);  // first: it may exec this program again
  CLI::App app{"ember-predict: scores a Criteo/Avazu file with a model written by ember-export"};
  serve::PredictOptions o;
  std::string log_level = "warn";
  bool json_out = false;
  int threads = 0;
  // --export, not --model: ember-worker's --model names a kind of model.
  app.add_option("--export", o.model, "the directory ember-export wrote")->required();
  add_renamed_flag(app, "--model", "--export", true);
  auto* input = app.add_option("file", o.input, "text file to score (plain or gzip), raw values mapped through the model's vocabulary");
  app.add_option("--format", o.format, "criteo, criteo-csv or avazu (default: the format the model's dataset was prepared from)");
  auto* dataset = app.add_option("--dataset", o.dataset, "or score a split of a prepared dataset (the one the model was trained on)");
  app.add_option("--split", o.split, "with --dataset: train, val or test")->capture_default_str();
  input->excludes(dataset);
  app.add_option("--output,-o", o.output, "write one probability per line here");
  app.add_option("--batch", o.batch, "samples per forward pass")->capture_default_str();
  app.add_option("--torch-threads", threads, "LibTorch intra-op threads (0: LibTorch's default)")->capture_default_str();
  app.add_flag("--json", json_out, "print the result as one JSON object");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  if (const int status = parse_command_line(app, argc, argv, "ember-predict"); status >= 0) return status;
  return guarded_main("ember-predict", [&] {
    setup_logging(log_level);
    if (threads > 0) torch::set_num_threads(threads);
    const serve::PredictReport r = serve::predict(o);
    if (json_out) {
      nlohmann::json j = {{"samples", r.samples}, {"labeled", r.labeled}, {"seconds", r.seconds}};
      if (r.labeled) {
        j["auc"] = r.auc;
        j["logloss"] = r.logloss;
      }
      std::cout << j.dump() << "\n";
    } else if (r.labeled) {
      std::cout << fmt::format("{} samples: AUC {:.10f}, log loss {:.10f} ({:.2f}s)\n", r.samples, r.auc, r.logloss, r.seconds);
    } else {
      std::cout << fmt::format("{} samples scored, no labels ({:.2f}s)\n", r.samples, r.seconds);
    }
    return 0;
  });
}
