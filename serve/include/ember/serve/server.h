// ember-serve: a training job's model served while it trains. It loads the job's newest
// whole checkpoint into memory, then follows the checkpoints as they come: with
// `ember-ps --serving-deltas` each brings every shard's changed rows (values only), which
// it applies in place, with that version's dense weights; without, it loads each newer
// checkpoint whole. It answers scoring requests over HTTP with the newest version it holds,
// never an older one.
//
//   GET  /version  {"iteration", "loaded_unix_s", "source", "deltas_applied", "delta_rows",
//                   "delta_bytes", "whole_loads"} (503 before one)
//   POST /score    raw lines (as ember-predict reads them) -> one probability a line;
//                  header X-Ember-Iteration: the version that scored them
//   GET  /healthz  ok
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>

namespace ember::serve {

struct ServeOptions {
  // A launcher's --checkpoint-dir (its ps/ and dense/) or the shards' root, and the
  // workers' dense state when it is elsewhere (as ember-export's).
  std::filesystem::path checkpoints, dense;
  // What the model was trained on: a prepared dataset, or a stream's format.
  std::filesystem::path dataset;
  std::string stream_format, stream_multi_hot_sep;
  std::string format;  // the requests' lines (empty: the model's source format)
  std::string listen = "127.0.0.1:0";
  std::filesystem::path port_file;  // written once listening: the port
  std::uint32_t poll_ms = 200;
  std::uint64_t max_body_bytes = 64ull << 20;
};

// Runs until `stop` is set (checked every poll): follows the checkpoints in one thread,
// serves in others. Throws ConfigError for bad options, IoError when it cannot listen.
void serve_model(const ServeOptions& options, const std::atomic<bool>& stop);

}  // namespace ember::serve
