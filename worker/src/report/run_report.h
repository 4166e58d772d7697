// What a worker tells about its run: a JSON line per iteration, evaluation and the
// summary (--metrics), worker 0's progress line every --progress-every iterations, the
// share of time per phase at the end, and (--metrics-port) the same counters to
// Prometheus, as of the last iteration.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "ember/common/process.h"
#include "ember/worker/summary.h"
#include "ember/worker/train_config.h"
#include "report/progressive.h"
#include "stages/loader.h"

namespace ember::worker {

class RunReport {
 public:
  // Opens c.metrics_file (if any); IoError when it cannot be.
  explicit RunReport(const TrainConfig& c);
  void set_rank(std::uint32_t rank);
  // Training starts at `first_iteration`: the progress line's first window opens.
  void start(std::uint64_t first_iteration) {
    window_first_ = first_iteration;
    window_.reset();
  }

  // Marks the start of an iteration's counting (the counters and phase times so far).
  void begin(const WireCounts& wire, const PhaseTimes& phases);
  // Iteration `s` took `ms` (of which `wait_ms` waiting for the loader).
  // `loss`: none while no all-reduce has completed (written as null, not as 0).
  void iteration(const Step& s, double ms, double wait_ms, std::optional<double> loss, const WireCounts& wire, const PhaseTimes& phases);
  // `flush_s`: the flush before it (pushes, barrier, commit); `eval_s`: the evaluation.
  void evaluation(std::uint64_t iteration, double auc, double logloss, std::uint64_t samples, double flush_s, double eval_s);
  void summary(const TrainSummary& sum);
  // Progressive validation (--progressive-window): iteration t's global batch as scored
  // before training (ComputeStep::on_scored); worker 0 keeps the window, reports it in
  // its progress lines (and a JSON line each), on /metrics and in the summary.
  void scored(std::uint64_t iteration, const float* logits, const float* marks, std::size_t n);

  // What a launcher's --restart-record says (none: restarts == 0 and lost_at == 0).
  struct Restarts {
    std::uint64_t restarts = 0, iterations_recomputed = 0;
    double lost_at = 0;                // Unix seconds
    std::optional<double> recovery_s;  // from lost_at to this process's first iteration
  };
  // ConfigError naming the file when it cannot be read or is not such a record.
  static Restarts read_restart_record(const std::string& path);

 private:
  struct Live;  // what Prometheus reads: a snapshot taken once per iteration
  void write(const std::string& line);
  nlohmann::json progressive_json(const ProgressiveWindow::Scores& p) const;

  const TrainConfig& c_;
  std::uint32_t rank_ = 0;
  std::ofstream metrics_;
  double global_n_;
  WireCounts before_, at_window_;
  PhaseTimes phases_before_, phases_at_window_;
  Stopwatch window_;
  std::uint64_t window_first_ = 0;
  Restarts restarts_;
  std::vector<scheduler::DirectoryCounts> dynamic_rows_;  // dynamic tables: as of the last iteration
  std::optional<ProgressiveWindow> progressive_;          // worker 0's, with --progressive-window
  std::shared_ptr<Live> live_;                            // shared with the exporter's scrape (it may outlive this)
};

}  // namespace ember::worker
