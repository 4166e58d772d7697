#include "run_report.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"

namespace ember::worker {

using json = nlohmann::json;

namespace {

// The phases' times since `since`, scaled (1: seconds, 1e3: milliseconds).
json phase_json(const PhaseTimes& now, const PhaseTimes& since, double scale) {
  return {{"sync", (now.sync - since.sync) * scale},
          {"commit", (now.commit - since.commit) * scale},
          {"pull", (now.pull - since.pull) * scale},
          {"compute", (now.compute - since.compute) * scale},
          {"allreduce", (now.allreduce - since.allreduce) * scale},
          {"push", (now.push - since.push) * scale},
          {"update", (now.update - since.update) * scale}};
}

}  // namespace

RunReport::RunReport(const TrainConfig& c) : c_(c), global_n_(static_cast<double>(c.workers) * c.batch_per_worker) {
  if (!c_.metrics_file.empty()) {
    metrics_.open(c_.metrics_file, std::ios::trunc);
    if (!metrics_) throw IoError(errno_message("open " + c_.metrics_file));
  }
}

void RunReport::write(const std::string& line) {
  if (metrics_.is_open()) metrics_ << line << '\n' << std::flush;
}

void RunReport::begin(const WireCounts& wire, const PhaseTimes& phases) {
  before_ = wire;
  phases_before_ = phases;
}

void RunReport::iteration(const Step& s, double ms, double wait_ms, double loss, const WireCounts& wire, const PhaseTimes& phases) {
  const std::uint64_t t = s.iteration;
  write(json{{"iteration", t},
             {"loss", loss},
             {"iter_ms", ms},
             {"wait_ms", wait_ms},
             {"sched_ms", s.sched_ms},
             {"samples_s", global_n_ / (ms / 1e3)},
             {"pulls", wire.pulls - before_.pulls},
             {"push_grad", wire.push_grad - before_.push_grad},
             {"push_value", wire.push_value - before_.push_value},
             {"push_evict", wire.push_evict - before_.push_evict},
             {"hits", wire.hits - before_.hits},
             {"bytes_out", wire.bytes_out - before_.bytes_out},
             {"bytes_in", wire.bytes_in - before_.bytes_in},
             {"phase_ms", phase_json(phases, phases_before_, 1e3)}}
            .dump());
  if (rank_ != 0 || c_.progress_every == 0 || ((t + 1) % c_.progress_every != 0 && !s.last)) return;
  const double secs = window_.seconds();
  const std::uint64_t iters = t + 1 - window_first_;
  window_first_ = t + 1;
  const auto hits = static_cast<double>(wire.hits - at_window_.hits), pulls = static_cast<double>(wire.pulls - at_window_.pulls);
  spdlog::info("iteration {}/{} | {:.0f} samples/s | loss {:.4f} | hit {:.1f}% | worker 0 rows: {} pulled, {} pushed | {:.2f} MB", t + 1,
               c_.iterations, global_n_ * static_cast<double>(iters) / secs, loss, hits + pulls > 0 ? 100 * hits / (hits + pulls) : 0.0,
               wire.pulls - at_window_.pulls, wire.pushes() - at_window_.pushes(),
               static_cast<double>(wire.bytes.total() - at_window_.bytes.total()) / 1e6);
  window_.reset();
  at_window_ = wire;
}

void RunReport::evaluation(std::uint64_t iteration, double auc, double logloss, std::uint64_t samples) {
  write(json{{"eval", true}, {"iteration", iteration + 1}, {"auc", auc}, {"logloss", logloss}, {"samples", samples}}.dump());
}

void RunReport::summary(const TrainSummary& sum) {
  const WireCounts& w = sum.wire;
  write(json{{"summary", true},
             {"rank", sum.rank},
             {"iterations", sum.iterations},
             {"stopped_at", sum.stopped_at},
             {"seconds", sum.seconds},
             {"samples_s", sum.samples_per_s},
             {"loss", sum.final_loss},
             {"auc", sum.auc},
             {"logloss", sum.logloss},
             {"pulls", w.pulls},
             {"push_grad", w.push_grad},
             {"push_value", w.push_value},
             {"push_evict", w.push_evict},
             {"hits", w.hits},
             {"flush_grad", w.flush_grad},
             {"flush_value", w.flush_value},
             {"hot_load", w.hot_load},
             {"hot_sync", w.hot_sync},
             {"bytes_out", w.bytes_out},
             {"bytes_in", w.bytes_in},
             {"pull_state", w.pull_state},
             {"prefetched", w.prefetched},
             {"bytes",
              {{"pull", w.bytes.pull},
               {"push_grad", w.bytes.push_grad},
               {"push_value", w.bytes.push_value},
               {"push_evict", w.bytes.push_evict},
               {"flush", w.bytes.flush},
               {"total", w.bytes.total()}}},
             {"framed_bytes",
              {{"pull_out", w.framed.pull.out},
               {"pull_in", w.framed.pull.in},
               {"push_grad_out", w.framed.push_grad.out},
               {"push_grad_in", w.framed.push_grad.in},
               {"push_value_out", w.framed.push_value.out},
               {"push_value_in", w.framed.push_value.in},
               {"commit_out", w.framed.commit.out},
               {"commit_in", w.framed.commit.in},
               {"total", w.framed.out() + w.framed.in()}}},
             {"phase_s", phase_json(sum.phases, PhaseTimes{}, 1)}}
            .dump());
  const PhaseTimes& f = sum.phases;
  const double all = std::max(1e-9, f.total());
  auto pct = [all](double x) { return 100 * x / all; };
  spdlog::info(
      "worker {}: time per phase: PS sync {:.0f}%, barrier + commit {:.0f}%, pulls {:.0f}%, model {:.0f}%, all-reduce {:.0f}%, "
      "pushes {:.0f}%, updates {:.0f}% (of {:.1f} s)",
      sum.rank, pct(f.sync), pct(f.commit), pct(f.pull), pct(f.compute), pct(f.allreduce), pct(f.push), pct(f.update), f.total());
}

}  // namespace ember::worker
