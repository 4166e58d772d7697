#include "ember/transport/job_connection.h"

#include "ember/common/fs.h"
#include "ember/transport/job_connection_options.h"

namespace ember::transport {

void resolve_token(JobConnection& c) {
  if (!c.token_file.empty()) c.token = read_secret_file(c.token_file, "--token-file");
}

namespace {

using Decl = OptionDecl<JobConnection>;
constexpr unsigned kDaemons = kWorkerProgram | kPsProgram;

template <class T>
Decl option(const char* flag, T JobConnection::*member, const char* help) {
  return field_option<JobConnection>(flag, member, help, kDaemons);
}

// The help texts speak of both daemons: each shows them in its --help.
std::vector<Decl> declare() {
  return {
      option("--coordinator", &JobConnection::coordinator,
             "the job's control plane, a ZeroMQ endpoint (tcp://host:port): PS shard 0 runs the coordinator there (port 0: "
             "any free port, see ember-ps --coordinator-file), the other shards and the workers join it"),
      option("--token", &JobConnection::token, "job token, required from every peer (or --token-file)"),
      option("--token-file", &JobConnection::token_file, "read the job token from this file"),
      option("--transport", &JobConnection::transport,
             "data plane between the workers and the PS shards: tcp or rdma (ibverbs, rdma_cm port space); a worker's must "
             "be the shards' (the join checks it)")
          .checked(CLI::IsMember({"tcp", "rdma"})),
      option("--rdma-slot-mib", &JobConnection::rdma_slot_mib,
             "RDMA: largest message received in MiB, a slot of the receive ring (a shard's: a request; a worker's: a reply "
             "of pulled rows)"),
      option("--socket-buffer-kib", &JobConnection::socket_buffer_kib,
             "TCP: send/receive buffer per connection in KiB (0: kernel autotuning)")
          .checked(CLI::Range(0u, 1u << 21)),
      millis_option<JobConnection>("--heartbeat-timeout-ms", &JobConnection::heartbeat_timeout,
                                   "silence after which a peer is reported dead", kDaemons),
      option("--host", &JobConnection::host,
             "the host this process runs on, as the job names it (default: this machine's host name): the workers' host "
             "map, and whether a shard's traffic counts as within a host or across hosts"),
  };
}

}  // namespace

const std::vector<OptionDecl<JobConnection>>& job_connection_options() {
  static const std::vector<Decl> decls = declare();  // immutable after its first use
  return decls;
}

}  // namespace ember::transport
