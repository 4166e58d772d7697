// ember-export: a whole checkpoint (or the final model of --dump-dir) as a directory
// PyTorch loads: the dense model as TorchScript, one torch.load file per table, the
// vocabulary and a manifest (worker/include/ember/worker/export.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "ember/common/blas_kernels.h"
#include "ember/common/cli.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/serve/export.h"

int main(int argc, char** argv) {
  using namespace ember;
  use_the_cpus_blas_kernels(argv);  // first: it may exec this program again
  CLI::App app{"ember-export: turns a checkpoint or a --dump-dir into a model PyTorch loads (TorchScript, torch.load tables, manifest)"};
  serve::ExportOptions o;
  std::string log_level = "info";
  auto* ckpt = app.add_option("--checkpoint", o.checkpoint,
                              "ember-ps checkpoint: one iter-N directory, a --checkpoint-dir root (its newest whole checkpoint), or "
                              "a launcher's --checkpoint-dir (ps/ and dense/)");
  app.add_option("--dense", o.dense,
                 "with --checkpoint: the workers' dense state, an ember-worker --checkpoint-dir or one worker-R-iter-N.pt file "
                 "(default: dense/ beside the launcher's ps/)");
  auto* dump = app.add_option("--dump", o.dump, "or the final model an ember-worker --dump-dir wrote (dense.bin, rows.bin, model.json)");
  ckpt->excludes(dump);
  auto* dataset = app.add_option("--dataset", o.dataset, "the prepared dataset the model was trained on (tables, vocabulary)");
  app.add_option("--stream-format", o.stream_format,
                 "or, for a model trained on a stream (ember-worker --stream), the stream's format: criteo, criteo-csv or avazu")
      ->excludes(dataset);
  app.add_option("--stream-multi-hot-sep", o.stream_multi_hot_sep, "with --stream-format: the bags' separator (ember-worker's)");
  app.add_option("--output,-o", o.output, "export directory to create")->required();
  app.add_flag("--force", o.overwrite, "replace an existing export directory");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  if (const int status = parse_command_line(app, argc, argv, "ember-export"); status >= 0) return status;
  return guarded_main("ember-export", [&] {
    setup_logging(log_level);
    const serve::ExportReport r = serve::export_model(o);
    std::cout << fmt::format("exported {} to {}: {} rows ({} from it, {} at their initial values), {:.1f} MB\n", r.source,
                             o.output.string(), r.rows, r.rows_stored, r.rows - std::min(r.rows, r.rows_stored), r.bytes / 1e6);
    return 0;
  });
}
