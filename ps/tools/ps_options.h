// ember-ps's flags, declared once each (common/option_registry.h): the shard's own, and
// those it shares with ember-worker (the job connection, transport/job_connection_options.h;
// the rows' settings and --keep-checkpoints, ps/row_options.h), lifted into one registry
// over Flags. ember_ps.cc registers them (add_ps_options) and resolves them into the
// daemon's configuration.
#pragma once

#include <string>
#include <vector>

#include "../src/daemon.h"
#include "ember/common/option_registry.h"
#include "ember/ps/row_options.h"

namespace ember::ps {

// The flags: the daemon's configuration, and what is resolved into it once parsed.
struct Flags {
  DaemonConfig c;
  RowSettings rows;
  std::string listen = "127.0.0.1:0", dataset, allocate = "lazy", verify_dir, log_level = "info";
  std::string store_dir;
  double ram_budget_mb = 0;
  bool no_hints = false;
  // A dataset of hashed ids (dynamic tables): the rows each shard holds at most at once.
  std::uint64_t slots_per_shard = 1u << 20;
};

// Every flag of ember-ps, in its --help order.
const std::vector<OptionDecl<Flags>>& ps_options();

// Registers them on `app`, bound to `f` (its values the defaults).
void add_ps_options(CLI::App& app, Flags& f);

}  // namespace ember::ps
