// How a member of a job, a PS shard (ember-ps) or a worker (ember-worker), reaches it: the
// control plane, the token, the data plane and this member's host. Both daemons take
// these flags alike, declared once (job_connection_options.h); each daemon's
// configuration extends this struct.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ember::transport {

struct JobConnection {
  std::string coordinator;                             // tcp://host:port of the control plane (ControlMember)
  std::string token;                                   // the job token (TransportOptions::token, the control plane's)
  std::string token_file;                              // the token read from this file instead (resolve_token)
  std::string transport = "tcp";                       // the data plane's name (parse_transport)
  std::uint32_t rdma_slot_mib = 4;                     // RDMA: a slot of the receive ring, in MiB
  std::uint32_t socket_buffer_kib = 0;                 // TCP send/receive buffers (0: kernel autotuning)
  std::chrono::milliseconds heartbeat_timeout{10000};  // ControlTimeouts::heartbeat_timeout
  std::string host;                                    // this member's host as the job names it (empty: the machine's name)
};

// Reads the token from c.token_file when one is given (read_secret_file's errors).
void resolve_token(JobConnection& c);

}  // namespace ember::transport
