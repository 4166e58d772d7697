// ember-ps's Prometheus metrics (--metrics-port): what the shard served per kind of
// request, its rows, connections and checkpoints, and on the shard hosting the control
// plane the members alive. Read at each scrape from the counters the shard keeps anyway.
#pragma once

#include <atomic>
#include <cstdint>

#include "ember/monitor/exporter.h"
#include "ember/ps/ps_service.h"
#include "ember/transport/channel.h"
#include "ember/transport/control.h"

namespace ember::ps {

// `coordinator` is null until (and unless) this shard hosts the control plane; the
// Exporter must go before everything passed here.
void export_ps_metrics(monitor::Exporter& exporter, PsService& service, const transport::Server& server, std::uint32_t shard,
                       const std::atomic<const transport::Coordinator*>& coordinator);

}  // namespace ember::ps
