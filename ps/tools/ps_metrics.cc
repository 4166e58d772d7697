#include "ps_metrics.h"

#include <string>

namespace ember::ps {

void export_ps_metrics(monitor::Exporter& exporter, PsService& service, const transport::Server& server, std::uint32_t shard,
                       const std::atomic<const transport::Coordinator*>& coordinator) {
  const std::string s = std::to_string(shard);
  exporter.on_scrape([&service, &server, s](monitor::Sink& out) {
    const ServedCounts& served = service.served();
    for (int k = 0; k < ServedCounts::kKinds; ++k) {
      const auto& c = served.kinds[k];
      const monitor::Labels kind = {{"shard", s}, {"kind", ServedCounts::name(k)}};
      out.counter("ember_ps_requests_total", "Requests answered, by kind", kind, static_cast<double>(c.requests.load()));
      out.counter("ember_ps_received_bytes_total", "Bytes of requests received, framed (48-byte header, 8 a key, 4 a float), by kind", kind,
                  static_cast<double>(c.bytes_in.load()));
      out.counter("ember_ps_sent_bytes_total", "Bytes of replies sent, framed, by kind of request", kind,
                  static_cast<double>(c.bytes_out.load()));
    }
    const auto rows = [&served](int k) { return static_cast<double>(served.kinds[k].rows.load()); };
    const char* pulled =
        "Rows sent to workers: pull (values), pull_state (values and optimizer state), prefetch, read (outside training: "
        "evaluations, dumps, loads)";
    out.counter("ember_ps_rows_pulled_total", pulled, {{"shard", s}, {"kind", "pull"}}, rows(ServedCounts::kPull));
    out.counter("ember_ps_rows_pulled_total", pulled, {{"shard", s}, {"kind", "pull_state"}}, rows(ServedCounts::kPullState));
    out.counter("ember_ps_rows_pulled_total", pulled, {{"shard", s}, {"kind", "prefetch"}}, rows(ServedCounts::kPrefetch));
    out.counter("ember_ps_rows_pulled_total", pulled, {{"shard", s}, {"kind", "read"}}, rows(ServedCounts::kRead));
    const char* pushed = "Rows received from workers: grad (gradients), value (rows written back with their state)";
    out.counter("ember_ps_rows_pushed_total", pushed, {{"shard", s}, {"kind", "grad"}}, rows(ServedCounts::kPushGrad));
    out.counter("ember_ps_rows_pushed_total", pushed, {{"shard", s}, {"kind", "value"}}, rows(ServedCounts::kPushValue));
    const monitor::Labels shard = {{"shard", s}};
    out.gauge("ember_ps_rows_stored", "Rows initialized on this shard (the rest are created on first use)", shard,
              static_cast<double>(service.store().initialized_rows()));
    out.gauge("ember_ps_connections", "Data connections open", shard, server.connections_open());
    if (const auto t = service.store().tier_stats()) {
      out.counter("ember_ps_tier_rows_touched_total", "Rows requests used on the disk tier", shard, static_cast<double>(t->rows_touched));
      out.counter("ember_ps_tier_misses_total",
                  "Rows a request waited for the disk for (read on the critical path, or a hinted read in flight)", shard,
                  static_cast<double>(t->misses));
      out.counter("ember_ps_tier_hint_loads_total", "Rows read in from disk by hints before use", shard,
                  static_cast<double>(t->hint_loads));
      out.counter("ember_ps_tier_read_bytes_total", "Bytes read from the tier's file (misses and hints)", shard,
                  static_cast<double>(t->bytes_read));
      out.counter("ember_ps_tier_written_bytes_total", "Bytes of dirty rows written back to the tier's file (whole sectors)", shard,
                  static_cast<double>(t->bytes_written));
      out.gauge("ember_ps_tier_resident_bytes", "Rows and state in memory, as the tier counts them", shard,
                static_cast<double>(t->resident * t->row_bytes));
      out.gauge("ember_ps_tier_budget_bytes", "The tier's RAM budget (--ram-budget-mb)", shard,
                static_cast<double>(t->budget_rows * t->row_bytes));
      out.counter("ember_ps_tier_slot_waits_total", "Requests that waited for the pager to free a row's slot", shard,
                  static_cast<double>(t->slot_waits));
      out.gauge("ember_ps_tier_hint_queue", "Hints waiting for the tier's loader thread", shard, static_cast<double>(t->hint_queue));
    }
    out.counter("ember_ps_connections_dropped_total", "Data connections dropped for misbehaving (bad message, wrong token, timeout)", shard,
                static_cast<double>(server.connections_dropped()));
    out.counter("ember_ps_checkpoints_written_total", "Checkpoints this shard wrote", shard,
                static_cast<double>(service.checkpoints_written()));
    out.counter("ember_ps_checkpoints_failed_total", "Checkpoints this shard failed to write (disk full, directory gone)", shard,
                static_cast<double>(service.checkpoint_failures()));
    out.gauge("ember_ps_committed_iteration", "The highest iteration committed (-1: none)", shard,
              static_cast<double>(service.committed_iteration()));
    out.gauge("ember_ps_last_checkpoint_iteration", "The last iteration this shard checkpointed or restored (-1: none)", shard,
              static_cast<double>(service.last_written_checkpoint()));
  });
  exporter.on_scrape([&coordinator](monitor::Sink& out) {
    const transport::Coordinator* c = coordinator.load();
    if (c == nullptr) return;
    out.gauge("ember_control_members_alive",
              "Members of the job joined and neither left nor failed (on the shard hosting the control plane)", {}, c->members_alive());
    out.counter("ember_control_joins_refused_total", "Joins refused (wrong token, a rank taken, the job already formed)", {},
                static_cast<double>(c->refused()));
    out.gauge("ember_control_job_failed", "1 once a member of the job has failed", {}, c->failure() ? 1.0 : 0.0);
  });
}

}  // namespace ember::ps
