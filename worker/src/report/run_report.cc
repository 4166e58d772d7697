#include "report/run_report.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "ember/common/error.h"
#include "ember/monitor/exporter.h"
#include "ember/scheduler/dynamic_rows_json.h"

namespace ember::scheduler {
// The summary's rows by kind, by the scheduler's names (ember-sim's; cold_pulls and
// evict_partial are not the job's to report).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrafficCounts, pulls, push_grad, push_value, push_evict, hits, flush_grad, flush_value, hot_sync,
                                   hot_flush, pull_state, prefetched, peer_value, peer_grad, eval_handed)
}  // namespace ember::scheduler

namespace ember::worker {

using json = nlohmann::json;

std::uint64_t WireCounts::bytes_out() const {
  const scheduler::WireBytes b = bytes();
  return 8 * (rows.pulls + restored) + b.push_grad + b.push_value + b.push_evict + b.flush;
}

std::uint64_t WireCounts::bytes_in() const {
  return bytes().pull - 8 * rows.pulls + scheduler::pull_bytes(restored, format, true) - 8 * restored;
}

namespace {

// The summary's counts, by name (the payload and framed bytes are written apart).
json counts_json(const WireCounts& w) {
  json j = w.rows;
  j.update(json{{"hot_load", w.hot_load},
                {"restored", w.restored},
                {"reset_rows", w.reset_rows},
                {"allreduce_bytes", w.allreduce_bytes},
                {"scheduler_exchange_bytes_out", w.exchange_bytes_out},
                {"scheduler_exchange_bytes_in", w.exchange_bytes_in},
                {"bytes_out", w.bytes_out()},
                {"bytes_in", w.bytes_in()}});
  return j;
}

// The phases' times since `since`, scaled (1: seconds, 1e3: milliseconds).
json phase_json(const PhaseTimes& now, const PhaseTimes& since, double scale) {
  json j = json::object();
  for (const auto& [name, field] : PhaseTimes::kNamed) j[name] = (now.*field - since.*field) * scale;
  return j;
}

// The phases' shares of the time between `since` and `now`, the largest first, those
// under 1% left out: "embedding 41%, compute 22%, ...".
std::string phase_shares(const PhaseTimes& now, const PhaseTimes& since) {
  std::vector<std::pair<double, const char*>> parts;
  double all = 0;
  for (const auto& [name, field] : PhaseTimes::kNamed) {
    parts.emplace_back(now.*field - since.*field, name);
    all += parts.back().first;
  }
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (const auto& [t, name] : parts) {
    if (all <= 0 || t < 0.01 * all) continue;
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", name, 100 * t / all);
  }
  return out;
}

// One link class's traffic (summary.json "links", docs/cluster.md#traffic-per-link).
json link_json(const LinkTraffic& l) {
  return {{"ps_rows", {{"pull", l.ps.pull.rows}, {"push_grad", l.ps.push_grad.rows}, {"push_value", l.ps.push_value.rows}}},
          {"ps_bytes_out", l.ps_out},
          {"ps_bytes_in", l.ps_in},
          {"peer_bytes_out", l.peer_out},
          {"peer_bytes_in", l.peer_in},
          {"relay_rows", {{"pull", l.handed.pull.rows}, {"push_grad", l.handed.push_grad.rows}, {"push_value", l.handed.push_value.rows}}},
          {"relay_bytes_out", l.handed.out()},
          {"relay_bytes_in", l.handed.in()},
          {"bytes_out", l.out()},
          {"bytes_in", l.in()}};
}

}  // namespace

struct RunReport::Live {
  std::mutex mutex;
  bool ranked = false;  // nothing is served before the job assigns the rank
  std::string rank;
  std::uint64_t iterations = 0, iteration = 0, samples = 0;
  double loss = 0, wait_s = 0, last_hit_ratio = 0;
  WireCounts wire;
  PhaseTimes phases;
  std::optional<double> auc, logloss;
  std::optional<ProgressiveWindow::Scores> progressive;
  std::optional<monitor::Histogram> iteration_seconds;
  std::optional<RunReport::Restarts> restarts;  // a restarted job's (--restart-record)
  std::vector<scheduler::DirectoryCounts> dynamic_rows;

  void fill(monitor::Sink& out) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!ranked) return;
    const monitor::Labels r = {{"rank", rank}};
    fill_progress(out, r);
    fill_rows(out, r);
    fill_links(out);
    fill_cache_and_job(out, r);
    fill_dynamic_rows(out);
  }

  // Dynamic tables: each PS shard's rows (the directory's decisions, as this worker
  // took them: every worker takes the same).
  void fill_dynamic_rows(monitor::Sink& out) const {
    for (std::size_t s = 0; s < dynamic_rows.size(); ++s) {
      const scheduler::DirectoryCounts& c = dynamic_rows[s];
      const std::string shard = std::to_string(s);
      out.gauge("ember_worker_dynamic_rows", "Dynamic tables: rows live on each PS shard", {{"rank", rank}, {"shard", shard}}, d(c.live));
      const std::pair<const char*, std::uint64_t> events[] = {
          {"created", c.created}, {"refused", c.refused}, {"expired", c.expired}, {"capped", c.capped}};
      for (const auto& [event, n] : events) {
        out.counter("ember_worker_dynamic_row_events_total",
                    "Dynamic tables: rows made, ids kept out by --create-after (per batch), rows expired and capped, per PS shard",
                    {{"rank", rank}, {"shard", shard}, {"event", event}}, d(n));
      }
    }
  }

  static double d(std::uint64_t v) { return static_cast<double>(v); }

  // Iterations, samples, loss and time per phase.
  void fill_progress(monitor::Sink& out, const monitor::Labels& r) const {
    out.counter("ember_worker_iterations_total", "Iterations trained by this process", r, d(iterations));
    out.gauge("ember_worker_iteration", "The last iteration trained (counted from 1)", r, d(iteration));
    out.counter("ember_worker_samples_total", "Samples this worker trained", r, d(samples));
    out.gauge("ember_worker_loss", "Training loss of the last iteration", r, loss);
    out.counter("ember_worker_loader_wait_seconds_total", "Time spent waiting for the loader's next plan", r, wait_s);
    for (const auto& [phase, field] : PhaseTimes::kNamed)
      out.counter("ember_worker_phase_seconds_total", "Wall time per phase of the iteration (docs/training.md#phases)",
                  {{"rank", rank}, {"phase", phase}}, phases.*field);
  }

  // Rows and bytes moved with the PS, by kind.
  void fill_rows(monitor::Sink& out, const monitor::Labels& r) const {
    // Rows by kind and direction: in from the PS, out to it, or summed over the workers.
    // The kinds are an interface (dashboards, scripts): hot_* name the replicated rows.
    const char* rows_help = "Embedding rows moved, by kind and direction (in: from the PS, out: to it, allreduce: among workers)";
    const std::tuple<const char*, const char*, std::uint64_t> rows[] = {{"pull", "in", wire.rows.pulls},
                                                                        {"hot_load", "in", wire.hot_load},
                                                                        {"restored", "in", wire.restored},
                                                                        {"reset", "out", wire.reset_rows},
                                                                        {"push_grad", "out", wire.rows.push_grad},
                                                                        {"push_value", "out", wire.rows.push_value},
                                                                        {"push_evict", "out", wire.rows.push_evict},
                                                                        {"flush_grad", "out", wire.rows.flush_grad},
                                                                        {"flush_value", "out", wire.rows.flush_value},
                                                                        {"hot_sync", "allreduce", wire.rows.hot_sync},
                                                                        {"hot_flush", "out", wire.rows.hot_flush},
                                                                        {"eval_handed", "evaluator", wire.rows.eval_handed}};
    for (const auto& [kind, dir, n] : rows)
      out.counter("ember_worker_rows_total", rows_help, {{"rank", rank}, {"kind", kind}, {"direction", dir}}, d(n));
    out.counter("ember_worker_rows_prefetched_total", "Rows pulled during the iteration before (part of kind=pull)", r,
                d(wire.rows.prefetched));
    out.counter("ember_worker_rows_pulled_with_state_total", "Rows pulled with their optimizer state (part of kind=pull)", r,
                d(wire.rows.pull_state));
    const char* payload_help = "Row payload moved with the PS, by kind (keys, trainer counts, floats; what ember-sim predicts)";
    const scheduler::WireBytes bytes = wire.bytes();
    const std::pair<const char*, std::uint64_t> payload[] = {{"pull", bytes.pull},
                                                             {"push_grad", bytes.push_grad},
                                                             {"push_value", bytes.push_value},
                                                             {"push_evict", bytes.push_evict},
                                                             {"flush", bytes.flush}};
    for (const auto& [kind, n] : payload)
      out.counter("ember_worker_payload_bytes_total", payload_help, {{"rank", rank}, {"kind", kind}}, d(n));
    const std::pair<const char*, const ps::WireTally::Dir*> framed[] = {
        {"pull", &wire.framed.pull},     {"push_grad", &wire.framed.push_grad}, {"push_value", &wire.framed.push_value},
        {"commit", &wire.framed.commit}, {"read", &wire.framed.read},           {"reset", &wire.framed.reset}};
    for (const auto& [kind, dir] : framed) {
      out.counter("ember_worker_sent_bytes_total", "Bytes of PS requests sent, framed (headers included), by kind",
                  {{"rank", rank}, {"kind", kind}}, d(dir->out));
      out.counter("ember_worker_received_bytes_total", "Bytes of PS replies received, framed, by kind of request",
                  {{"rank", rank}, {"kind", kind}}, d(dir->in));
    }
  }

  // Bytes and rows by link class, and what the host hierarchy kept within the host.
  void fill_links(monitor::Sink& out) const {
    const char* link_bytes_help =
        "Bytes by link class (intra_host, cross_host) and peer: ps as counted at the sockets, worker the all-reduces' payload, "
        "relay the rows handed within the host (per-host aggregation, peer sync)";
    const char* link_rows_help = "Rows carried to and from the PS shards by link class (intra_host, cross_host) and kind of request";
    for (const auto& [link, l] : {std::pair<const char*, const LinkTraffic*>{"intra_host", &wire.links.intra_host},
                                  std::pair<const char*, const LinkTraffic*>{"cross_host", &wire.links.cross_host}}) {
      const std::tuple<const char*, const char*, std::uint64_t> bytes[] = {
          {"ps", "out", l->ps_out},          {"ps", "in", l->ps_in},         {"worker", "out", l->peer_out}, {"worker", "in", l->peer_in},
          {"relay", "out", l->handed.out()}, {"relay", "in", l->handed.in()}};
      for (const auto& [peer, dir, n] : bytes)
        out.counter("ember_worker_link_bytes_total", link_bytes_help, {{"rank", rank}, {"link", link}, {"peer", peer}, {"direction", dir}},
                    d(n));
      const std::pair<const char*, std::uint64_t> kinds[] = {
          {"pull", l->ps.pull.rows}, {"push_grad", l->ps.push_grad.rows}, {"push_value", l->ps.push_value.rows}};
      for (const auto& [kind, n] : kinds)
        out.counter("ember_worker_link_rows_total", link_rows_help, {{"rank", rank}, {"link", link}, {"kind", kind}}, d(n));
    }
    // The host hierarchy's hand-offs within the host (WireCounts::handed; the metric keeps
    // its older name, relay).
    const std::pair<const char*, std::uint64_t> handed[] = {
        {"pull", wire.handed.pull.rows}, {"push_grad", wire.handed.push_grad.rows}, {"push_value", wire.handed.push_value.rows}};
    for (const auto& [kind, n] : handed)
      out.counter("ember_worker_relay_rows_total",
                  "Rows handed within the host instead of crossing to the PS: pulled rows received (pull), gradients handed over "
                  "(push_grad), latest rows received by peer sync (push_value)",
                  {{"rank", rank}, {"kind", kind}}, d(n));
    for (const auto& [dir, n] : {std::pair<const char*, std::uint64_t>{"out", wire.exchange_bytes_out}, {"in", wire.exchange_bytes_in}})
      out.counter("ember_worker_scheduler_exchange_bytes_total",
                  "Bytes of the evictions the hosts' schedulers exchange (--scheduler-per-host): this worker's sent, the others' "
                  "received (payload)",
                  {{"rank", rank}, {"direction", dir}}, d(n));
  }

  // The cache's hits, the last evaluation and the job's restarts.
  void fill_cache_and_job(monitor::Sink& out, const monitor::Labels& r) const {
    out.counter("ember_worker_cache_hits_total", "Rows the iteration needed found in the cache", r, d(wire.rows.hits));
    out.counter("ember_worker_cache_lookups_total", "Rows the iteration needed (cache hits and pulls)", r,
                d(wire.rows.hits + wire.rows.pulls + wire.rows.peer_value));
    out.gauge("ember_worker_cache_hit_ratio", "Cache hits over lookups in the last iteration", r, last_hit_ratio);
    if (auc) out.gauge("ember_worker_eval_auc", "AUC of the last evaluation on the validation split", r, *auc);
    if (logloss) out.gauge("ember_worker_eval_logloss", "Log loss of the last evaluation on the validation split", r, *logloss);
    if (progressive) {
      out.gauge("ember_worker_progressive_auc", "AUC of the global batches scored before training on them, over the window", r,
                progressive->auc);
      out.gauge("ember_worker_progressive_logloss", "Log loss of the global batches scored before training on them, over the window", r,
                progressive->logloss);
    }
    if (restarts) {
      out.gauge("ember_worker_job_restarts", "Restarts of this job before this process started (its launcher's record)", r,
                d(restarts->restarts));
      out.gauge("ember_worker_job_iterations_recomputed", "Iterations the job's restarts trained again (lost since their checkpoints)", r,
                d(restarts->iterations_recomputed));
      if (restarts->recovery_s)
        out.gauge("ember_worker_job_recovery_seconds", "Seconds from the last loss to this process's first iteration trained", r,
                  *restarts->recovery_s);
    }
  }
};

RunReport::Restarts RunReport::read_restart_record(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(errno_message("--restart-record: open " + path));
  Restarts r;
  try {
    const json j = json::parse(in);
    r.restarts = j.at("restarts").get<std::uint64_t>();
    r.iterations_recomputed = j.at("iterations_recomputed").get<std::uint64_t>();
    r.lost_at = j.value("lost_at", 0.0);
  } catch (const json::exception& e) {
    throw ConfigError("--restart-record " + path + ": not a restart record (restarts, iterations_recomputed, lost_at): " + e.what());
  }
  return r;
}

RunReport::RunReport(const TrainConfig& c) : c_(c), global_n_(static_cast<double>(c.workers) * c.batch_per_worker) {
  if (!c_.restart_record.empty()) restarts_ = read_restart_record(c_.restart_record);
  if (!c_.metrics_file.empty()) {
    metrics_.open(c_.metrics_file, std::ios::trunc);
    if (!metrics_) throw IoError(errno_message("open " + c_.metrics_file));
  }
  if (c_.exporter != nullptr) {
    live_ = std::make_shared<Live>();
    if (!c_.restart_record.empty()) live_->restarts = restarts_;
    c_.exporter->on_scrape([live = live_](monitor::Sink& out) { live->fill(out); });
  }
}

void RunReport::set_rank(std::uint32_t rank) {
  rank_ = rank;
  if (rank == 0 && c_.progressive_window > 0) progressive_.emplace(c_.progressive_window);  // worker 0 reports it
  if (!live_) return;
  // 1 ms to about 65 s: an iteration on a loaded CPU to one waiting on a slow peer.
  auto h = c_.exporter->histogram("ember_worker_iteration_seconds", "Wall time per iteration, loader wait included",
                                  monitor::Exporter::exponential_buckets(0.001, 2, 17), {{"rank", std::to_string(rank)}});
  std::lock_guard<std::mutex> lock(live_->mutex);
  live_->rank = std::to_string(rank);
  live_->ranked = true;
  live_->iteration_seconds = h;
}

void RunReport::scored(std::uint64_t iteration, const float* logits, const float* marks, std::size_t n) {
  if (progressive_) progressive_->add(iteration, logits, marks, n);
}

json RunReport::progressive_json(const ProgressiveWindow::Scores& p) const {
  return {{"window_iterations", progressive_->iterations()},
          {"first_iteration", p.first + 1},
          {"iteration", p.last + 1},
          {"samples", p.samples},
          {"auc", p.auc},
          {"logloss", p.logloss}};
}

void RunReport::write(const std::string& line) {
  if (metrics_.is_open()) metrics_ << line << '\n' << std::flush;
}

void RunReport::begin(const WireCounts& wire, const PhaseTimes& phases) {
  before_ = wire;
  phases_before_ = phases;
}

void RunReport::iteration(const Step& s, double ms, double wait_ms, std::optional<double> loss, const WireCounts& wire,
                          const PhaseTimes& phases) {
  const std::uint64_t t = s.iteration;
  if (!s.dynamic_rows.empty()) dynamic_rows_ = s.dynamic_rows;
  if (restarts_.lost_at > 0 && !restarts_.recovery_s) {  // training again
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    restarts_.recovery_s = std::max(0.0, now - restarts_.lost_at);
  }
  if (live_) {
    std::lock_guard<std::mutex> lock(live_->mutex);
    if (live_->restarts) live_->restarts->recovery_s = restarts_.recovery_s;
    live_->iterations += 1;
    live_->iteration = t + 1;
    live_->samples += s.labels.size();
    if (loss) live_->loss = *loss;
    live_->wait_s += wait_ms / 1e3;
    // (Misses: pulls, and rows a worker of this host handed over: peer sync.)
    const auto hits = static_cast<double>(wire.rows.hits - before_.rows.hits),
               pulls = static_cast<double>(wire.rows.pulls + wire.rows.peer_value - before_.rows.pulls - before_.rows.peer_value);
    live_->last_hit_ratio = hits + pulls > 0 ? hits / (hits + pulls) : 0.0;
    live_->wire = wire;
    live_->phases = phases;
    if (!s.dynamic_rows.empty()) live_->dynamic_rows = s.dynamic_rows;
    if (live_->iteration_seconds) live_->iteration_seconds->observe(ms / 1e3);
  }
  write(json{{"iteration", t},
             {"loss", loss ? json(*loss) : json(nullptr)},
             {"iter_ms", ms},
             {"wait_ms", wait_ms},
             {"sched_ms", s.sched_ms},
             {"samples_s", global_n_ / (ms / 1e3)},
             {"pulls", wire.rows.pulls - before_.rows.pulls},
             {"push_grad", wire.rows.push_grad - before_.rows.push_grad},
             {"push_value", wire.rows.push_value - before_.rows.push_value},
             {"push_evict", wire.rows.push_evict - before_.rows.push_evict},
             {"hits", wire.rows.hits - before_.rows.hits},
             {"bytes_out", wire.bytes_out() - before_.bytes_out()},
             {"bytes_in", wire.bytes_in() - before_.bytes_in()},
             {"phase_ms", phase_json(phases, phases_before_, 1e3)}}
            .dump());
  if (rank_ != 0 || c_.progress_every == 0 || ((t + 1) % c_.progress_every != 0 && !s.last)) return;
  const double secs = window_.seconds();
  const std::uint64_t iters = t + 1 - window_first_;
  window_first_ = t + 1;
  const auto hits = static_cast<double>(wire.rows.hits - at_window_.rows.hits),
             pulls = static_cast<double>(wire.rows.pulls + wire.rows.peer_value - at_window_.rows.pulls - at_window_.rows.peer_value);
  // Bytes that left or reached this host (worker 0's): shown where the job spans hosts.
  const auto across = [](const WireCounts& w) { return w.links.cross_host.out() + w.links.cross_host.in(); };
  const std::uint64_t cross = across(wire) - across(at_window_);
  // Progressive validation over its window, as of the last all-reduce completed.
  std::string scored;
  if (const auto p = progressive_ ? progressive_->scores() : std::nullopt) {
    scored = fmt::format(" | progressive AUC {:.4f} log loss {:.4f}", p->auc, p->logloss);
    json line = progressive_json(*p);
    line["progressive"] = true;
    write(line.dump());
    if (live_) {
      std::lock_guard<std::mutex> lock(live_->mutex);
      live_->progressive = p;
    }
  }
  spdlog::info("iteration {}/{} | {:.0f} samples/s | loss {}{} | hit {:.1f}% | worker 0 rows: {} pulled, {} pushed | {:.2f} MB{} | {}",
               t + 1, c_.iterations, global_n_ * static_cast<double>(iters) / secs, loss ? fmt::format("{:.4f}", *loss) : std::string("-"),
               scored, hits + pulls > 0 ? 100 * hits / (hits + pulls) : 0.0, wire.rows.pulls - at_window_.rows.pulls,
               wire.pushes() - at_window_.pushes(), static_cast<double>(wire.bytes().total() - at_window_.bytes().total()) / 1e6,
               cross > 0 ? fmt::format(" | worker 0 across hosts {:.2f} MB", static_cast<double>(cross) / 1e6) : std::string(),
               phase_shares(phases, phases_at_window_));
  window_.reset();
  at_window_ = wire;
  phases_at_window_ = phases;
}

void RunReport::evaluation(std::uint64_t iteration, double auc, double logloss, std::uint64_t samples, double flush_s, double eval_s) {
  if (live_) {
    std::lock_guard<std::mutex> lock(live_->mutex);
    live_->auc = auc;
    live_->logloss = logloss;
  }
  write(json{{"eval", true},
             {"iteration", iteration + 1},
             {"auc", auc},
             {"logloss", logloss},
             {"samples", samples},
             {"flush_s", flush_s},
             {"eval_s", eval_s},
             {"seconds", flush_s + eval_s}}
            .dump());
}

void RunReport::summary(const TrainSummary& sum) {
  const WireCounts& w = sum.wire;
  if (live_) {  // the final flushes included
    std::lock_guard<std::mutex> lock(live_->mutex);
    live_->wire = w;
    live_->phases = sum.phases;
  }
  json j = counts_json(w);
  const scheduler::WireBytes bytes = w.bytes();
  j.update(json{{"summary", true},
                {"rank", sum.rank},
                {"iterations", sum.iterations},
                {"stopped_at", sum.stopped_at},
                {"seconds", sum.seconds},
                {"samples_s", sum.samples_per_s},
                {"loss", sum.final_loss},
                {"auc", sum.auc},
                {"logloss", sum.logloss},
                {"hosts", sum.hosts},
                {"allreduce_cross_host_bytes", sum.allreduce_cross_host_bytes},
                {"bytes", bytes},
                {"framed_bytes",
                 {{"pull_out", w.framed.pull.out},
                  {"pull_in", w.framed.pull.in},
                  {"push_grad_out", w.framed.push_grad.out},
                  {"push_grad_in", w.framed.push_grad.in},
                  {"push_value_out", w.framed.push_value.out},
                  {"push_value_in", w.framed.push_value.in},
                  {"commit_out", w.framed.commit.out},
                  {"commit_in", w.framed.commit.in},
                  {"read_out", w.framed.read.out},
                  {"read_in", w.framed.read.in},
                  {"reset_out", w.framed.reset.out},
                  {"reset_in", w.framed.reset.in},
                  {"total", w.framed.out() + w.framed.in()}}},
                {"links", {{"intra_host", link_json(w.links.intra_host)}, {"cross_host", link_json(w.links.cross_host)}}},
                {"phase_s", phase_json(sum.phases, PhaseTimes{}, 1)}});
  j["bytes"]["peer"] = bytes.peer;  // every worker's summary has the same fields, alone on its host or not
  if (!dynamic_rows_.empty()) j["dynamic_rows"] = scheduler::dynamic_rows_json<json>(dynamic_rows_);
  if (const auto p = progressive_ ? progressive_->scores() : std::nullopt) j["progressive"] = progressive_json(*p);
  if (!c_.restart_record.empty()) {
    j["restarts"] = restarts_.restarts;
    j["iterations_recomputed"] = restarts_.iterations_recomputed;
    j["recovery_s"] = restarts_.recovery_s ? json(*restarts_.recovery_s) : json(nullptr);
  }
  write(j.dump());
  spdlog::info("worker {}: time per phase: {} (of {:.1f} s)", sum.rank, phase_shares(sum.phases, PhaseTimes{}), sum.phases.total());
}

}  // namespace ember::worker
