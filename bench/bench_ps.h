#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::bench {

struct PsBenchOptions {
  double seconds = 0.5;  // per run of a case (PS or raw)
  int repeats = 3;       // runs of each, alternating PS and raw; medians reported
  std::uint32_t rows_per_request = 1024;
  std::uint64_t num_keys = 1u << 18;
  std::vector<std::uint32_t> dims{16, 64, 256};
  std::vector<int> threads{1, 2, 4};
  std::vector<std::string> ops{"pull", "push"};
  std::uint32_t connections = 1;
  std::uint32_t socket_buffer_kib = 0;  // TCP buffers of the PS path (0: kernel autotuning)
  std::string optimizer = "sgd";        // the shard's sparse optimizer (what a push's apply costs)
  std::string keys = "consecutive";     // a request's keys: consecutive, or scattered (distinct random keys, as a worker's)
  std::string apply_commits = "auto";   // where the shard applies a commit: auto, handler or applier (ps_service.h)
  // store: pushes and commits served by the shard (PsService); ack: acknowledged unread,
  // the transport alone (what the shard's row work costs on top of it)
  std::string serve = "store";
  int io_threads = 4;               // the shard's TCP I/O threads
  std::uint32_t apply_threads = 0;  // the shard's applier threads (0: as many as io_threads)
  // CPU lists ("1", "0-3"): the server side (shard or raw server, and the store-alone
  // loop) on one set, the client threads on the other, as a shard with cores of its own
  // and clients on other hosts. Both or neither; empty: the scheduler's choice.
  std::string server_cpus, client_cpus;
  // A shard of dynamic tables (StoreConfig::hashed_ids): each push round first names
  // `reset_share` of its rows as new (kResetRows: a fresh id each), which the commit
  // resets, as a shard whose ids keep coming does.
  bool hashed_ids = false;
  double reset_share = 0;
};

void add_ps_options(CLI::App& app, PsBenchOptions& o);
int run_ps_bench(const PsBenchOptions& o, bool json);

}  // namespace ember::bench
