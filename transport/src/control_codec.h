// The control plane's messages, decoded with every field's type and range checked.
// Every byte a peer sends is untrusted: a frame that is not one of these messages is a
// ProtocolError naming the field, never an exception of the JSON library or an abort.
// The coordinator and the members decode through these functions only, and the
// libFuzzer target (transport/fuzz/control_fuzz.cc) feeds them arbitrary bytes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ember/transport/auth.h"
#include "ember/transport/control.h"

namespace ember::transport::control_codec {

// Largest frame the coordinator accepts (ZMQ_MAXMSGSIZE): control messages are a few
// hundred bytes; a c10d store value (Gloo's addresses) a few KiB.
inline constexpr std::int64_t kMaxToCoordinator = 1 << 20;
// Largest frame a member accepts: the peer table of a large job.
inline constexpr std::int64_t kMaxFromCoordinator = 16 << 20;
// Longest string field (token, key, value, address, reason).
inline constexpr std::size_t kMaxField = 256 << 10;

// Member -> coordinator. Joining takes two messages: a Hello with the member's nonce,
// answered by a Challenge with the coordinator's, then the Join with the member's proof
// of the token over both nonces and its identity (auth.h; the token never crosses the
// wire). Nonces and proofs travel as lowercase hex of exactly their size.
struct Hello {
  auth::Nonce nonce{};
};
struct Join {
  auth::Digest proof{};  // auth::proof(token, kJoinMember, coordinator's nonce, member's, join_identity(...))
  Role role = Role::kWorker;
  int rank = -1;
  std::string data;
};
// What a member's join proof covers besides the nonces: its role, rank and data address.
std::string join_identity(Role role, int rank, const std::string& data);
struct Heartbeat {};
struct BarrierEnter {
  int group = 0;
  std::uint64_t gen = 0;
};
struct Publish {
  std::string key, value;
};
struct Lookup {
  std::string key;
};
struct Add {  // adds to a counter on the board (the c10d store's add)
  std::uint64_t id = 0;
  std::string key;
  std::int64_t delta = 0;
};
struct Leave {};
struct Abort {  // the member fails, and says why
  std::string why;
  int exit_status = 0;  // the status it exits with; 0: not said
};
struct Ending {  // the member is about to end (a signal), and says why
  std::string why;
};
using ToCoordinator = std::variant<Hello, Join, Heartbeat, BarrierEnter, Publish, Lookup, Add, Leave, Abort, Ending>;

// Coordinator -> member.
struct Challenge {
  auth::Nonce nonce{};   // the coordinator's, fresh for this join attempt
  auth::Digest proof{};  // auth::proof(token, kJoinCoordinator, nonce, the member's nonce)
};
struct Welcome {
  std::uint32_t rank = 0;
  JobShape shape;
  std::vector<Peer> peers;
};
struct Refusal {
  std::string why;
};
struct HeartbeatAck {};
struct Release {
  int group = 0;
  std::uint64_t gen = 0;
};
struct Value {
  std::string key, value;
};
struct Added {
  std::uint64_t id = 0;
  std::int64_t value = 0;
};
struct Dead {
  std::string member;  // "worker 2"
  std::string why;     // "no heartbeat for 5000 ms"
};
struct Shutdown {};
using FromCoordinator = std::variant<Challenge, Welcome, Refusal, HeartbeatAck, Release, Value, Added, Dead, Shutdown>;

// Throw ProtocolError saying what is wrong (and which field).
ToCoordinator decode_to_coordinator(std::string_view frame);
FromCoordinator decode_from_coordinator(std::string_view frame);

std::string encode(const ToCoordinator& m);
std::string encode(const FromCoordinator& m);

}  // namespace ember::transport::control_codec
