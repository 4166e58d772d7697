// The flags of a JobConnection, declared once (common/option_registry.h) for ember-ps and
// ember-worker: each lifts them into its own registry (lift_options), so a flag both
// daemons take has one name, default, help text and check.
#pragma once

#include <vector>

#include "ember/common/option_registry.h"
#include "ember/transport/job_connection.h"

namespace ember::transport {

// --coordinator, --token, --token-file, --transport, --rdma-slot-mib,
// --socket-buffer-kib, --heartbeat-timeout-ms, --host; none of them must agree among the
// workers (the join checks the transport against the PS shards' itself).
const std::vector<OptionDecl<JobConnection>>& job_connection_options();

}  // namespace ember::transport
