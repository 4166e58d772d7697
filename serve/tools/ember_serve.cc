// ember-serve: serves a training job's model while it trains, following its checkpoints
// (each a version; with ember-ps --serving-deltas, applied as the rows changed since the
// one before), scoring raw lines over HTTP (serve/include/ember/serve/server.h).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>

#include "ember/common/blas_kernels.h"
#include "ember/common/cli.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/signals.h"
#include "ember/serve/server.h"

int main(int argc, char** argv) {
  using namespace ember;
  use_the_cpus_blas_kernels(argv);  // first: it may exec this program again
  CLI::App app{"ember-serve: serves a training job's newest checkpointed model over HTTP (POST /score raw lines, GET /version)"};
  serve::ServeOptions o;
  std::string log_level = "info";
  double max_body_mb = 64;
  app.add_option("--checkpoints", o.checkpoints,
                 "the job's checkpoints: a launcher's --checkpoint-dir (ps/ and dense/) or the shards' --checkpoint-dir")
      ->required();
  app.add_option("--dense", o.dense, "the workers' dense state, when not dense/ beside ps/ (as ember-export --dense)");
  auto* dataset = app.add_option("--dataset", o.dataset, "the prepared dataset the model trains on (tables, vocabulary)");
  app.add_option("--stream-format", o.stream_format, "or, for a job on a stream, its format: criteo, criteo-csv or avazu")
      ->excludes(dataset);
  app.add_option("--stream-multi-hot-sep", o.stream_multi_hot_sep, "with --stream-format: the bags' separator (the job's)");
  app.add_option("--format", o.format, "the requests' lines: criteo, criteo-csv or avazu (default: the model's source format)");
  app.add_option("--listen", o.listen, "HOST:PORT to serve on (port 0: any free port)")->capture_default_str();
  app.add_option("--port-file", o.port_file, "write the port here once listening");
  app.add_option("--poll-ms", o.poll_ms, "how often to look for a newer checkpoint")->capture_default_str();
  app.add_option("--max-body-mb", max_body_mb, "largest request body (413 past it)")->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  if (const int status = parse_command_line(app, argc, argv, "ember-serve"); status >= 0) return status;
  return guarded_main("ember-serve", [&] {
    setup_logging(log_level);
    o.max_body_bytes = static_cast<std::uint64_t>(max_body_mb * 1024 * 1024);
    std::atomic<bool> stop{false};
    SignalThread signals({SIGTERM, SIGINT}, [&stop](int sig) {
      spdlog::info("ember-serve: signal {}: stopping", sig);
      stop = true;
    });
    serve::serve_model(o, stop);
    return 0;
  });
}
