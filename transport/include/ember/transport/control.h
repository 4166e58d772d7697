// Control plane on ZeroMQ: forms the job and notices failures. Not on the data path.
//
// The Coordinator (run by PS rank 0, or by a launcher) binds one ROUTER socket whose
// address every process gets from its command line or config file. A ControlMember
// (every PS shard and worker) joins with the job token, its role, an optional requested
// rank and the address of its data plane; once every expected member has joined, all of
// them receive the same peer table (rank assignment + address exchange). Afterwards:
//   - barriers with generation numbers, among the workers or among everybody;
//   - a small key-value board (publish / lookup) for rendezvous data such as the dense
//     collective's store address;
//   - heartbeats both ways: a member silent for longer than the timeout is reported
//     dead to everyone, and a member that stops hearing the coordinator fails too;
//   - a member that fails on its own says so (abort) and is reported with its reason;
//   - clean shutdown: when every worker has left, the PS members are told to stop (never
//     after a failure: then every member hears that the job failed, and who failed).
// A join without the right token is refused with an error reply and logged. The token
// never crosses the wire: a member proves it knows it (HMAC-SHA256 over a nonce the
// coordinator draws for that join attempt, auth.h), and the coordinator proves it too.
//
// Messages are single JSON frames: control traffic is a few small messages per
// iteration, so readability wins over bytes. Every frame from a peer is decoded with its
// fields' types and ranges checked, at most 1 MiB (ZMQ_MAXMSGSIZE); a malformed one is
// logged (at most once per 10 s) and dropped, never an exception out of the thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ember::transport {

enum class Role : std::uint8_t { kPs = 0, kWorker = 1 };
const char* role_name(Role role);

struct JobShape {
  std::uint32_t ps = 1;
  std::uint32_t workers = 1;
};

struct ControlTimeouts {
  std::chrono::milliseconds heartbeat_interval{300};
  std::chrono::milliseconds heartbeat_timeout{5000};  // silence before a peer is declared dead
  std::chrono::milliseconds join_timeout{120000};     // until every member has joined
};

struct Peer {
  Role role = Role::kWorker;
  std::uint32_t rank = 0;
  std::string data_address;  // "host:port" of its data plane (empty for workers)
};

// The first failure of a job, as the coordinator names it.
struct JobFailure {
  std::string member;   // "worker 2", "ps 0"
  std::string cause;    // "no heartbeat for 5000 ms", or what the member said
  int exit_status = 0;  // what the member said it exits with (abort); 0: not said
};

class Coordinator {
 public:
  // endpoint: a ZeroMQ endpoint to bind, e.g. "tcp://127.0.0.1:5555" or
  // "tcp://127.0.0.1:*" (any free port; see endpoint()).
  Coordinator(const std::string& endpoint, std::string token, JobShape shape, ControlTimeouts timeouts = {});
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The bound endpoint with its actual port.
  std::string endpoint() const;
  // Joins refused (wrong token, duplicate rank, job already formed).
  std::uint64_t refused() const;
  // The first failure reported to the job ("worker 2: no heartbeat for 5000 ms"), if any.
  std::optional<std::string> failure() const;
  // Called once, on the coordinator's thread, with the first failure. For a failure
  // record a launcher reads.
  void on_failure(std::function<void(const JobFailure&)> callback);
  // True once every worker has left and the PS members were told to stop.
  bool finished() const;
  // Waits until every PS member left (so they heard the shutdown before this process,
  // which hosts the coordinator, exits); false on timeout.
  bool wait_ps_left(std::chrono::milliseconds timeout) const;
  // PS members that have left so far.
  std::uint32_t ps_left() const;
  // Members joined and neither left nor failed (Prometheus: ember_control_members_alive).
  std::uint32_t members_alive() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class BarrierGroup : std::uint8_t { kWorkers = 0, kAll = 1 };

struct MemberOptions {
  std::string coordinator;  // "tcp://host:port"
  std::string token;
  Role role = Role::kWorker;
  int rank = -1;             // -1: any free rank of the role
  std::string data_address;  // published to the peers
  ControlTimeouts timeouts;
};

class ControlMember {
 public:
  // Joins and blocks until the job is formed. Throws ProtocolError when refused (wrong
  // token, rank taken) and IoError when the coordinator does not answer in time.
  explicit ControlMember(MemberOptions options);
  ~ControlMember();  // leaves cleanly if leave() was not called
  ControlMember(const ControlMember&) = delete;
  ControlMember& operator=(const ControlMember&) = delete;

  std::uint32_t rank() const;
  JobShape shape() const;
  const std::vector<Peer>& peers() const;
  std::vector<Peer> peers_of(Role role) const;

  // Waits until every member of the group called barrier with the same generation.
  // Throws Error when a peer died, the generations disagree, or the timeout passes.
  void barrier(BarrierGroup group, std::uint64_t generation, std::chrono::milliseconds timeout = std::chrono::milliseconds(600000));
  void publish(const std::string& key, const std::string& value);
  // Waits until some member published `key`.
  std::string lookup(const std::string& key, std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  // Never waits: the value if it has arrived; otherwise asks the coordinator for it (once
  // per key), and a later call returns it once some member published it.
  std::optional<std::string> try_lookup(const std::string& key);
  // Adds `delta` to the board's counter `key` (absent: 0) and returns the new value; the
  // counter is the board's value in decimal (a c10d store's add).
  std::int64_t add(const std::string& key, std::int64_t delta, std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));

  // A failure of the job (dead peer, lost coordinator), if any was reported.
  std::optional<std::string> failure() const;
  // True once the coordinator said the job is over (PS members wait for this).
  bool shutdown_requested() const;
  // Waits for shutdown or failure; returns false on timeout.
  bool wait_shutdown(std::chrono::milliseconds timeout);
  // Leaves the job cleanly (workers: after the last iteration).
  void leave();
  // Tells the coordinator this member failed, and why: the job fails naming this member.
  // `exit_status`: the status this process will end with (common/error.h's exit_code),
  // 0 when not known; a launcher reads it to tell a refused setting (2) or refused data
  // (3), which a restart cannot mend, from a crash.
  // A member destroyed without leave() or abort() aborts ("exited without leaving").
  void abort(const std::string& why, int exit_status = 0);
  // Tells the coordinator this member is about to end (a signal that ends the process),
  // and why. It is named as the job's failure with `why` only if no other member is lost
  // within the heartbeat timeout: a cluster manager that kills the survivors of a lost
  // host at once (srun --kill-on-bad-exit) does not get them named instead of the host's.
  // Returns once the message is on its way (the caller gives it a moment before ending);
  // the member then neither leaves nor aborts.
  void ending(const std::string& why);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::transport
