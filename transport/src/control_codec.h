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

#include "ember/transport/control.h"

namespace ember::transport::control_codec {

// Largest frame the coordinator accepts (ZMQ_MAXMSGSIZE): control messages are a few
// hundred bytes; a c10d store value (Gloo's addresses) a few KiB.
inline constexpr std::int64_t kMaxToCoordinator = 1 << 20;
// Largest frame a member accepts: the peer table of a large job.
inline constexpr std::int64_t kMaxFromCoordinator = 16 << 20;
// Longest string field (token, key, value, address, reason).
inline constexpr std::size_t kMaxField = 256 << 10;

// Member -> coordinator.
struct Join {
  std::string token;
  Role role = Role::kWorker;
  int rank = -1;
  std::string data;
};
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
};
using ToCoordinator = std::variant<Join, Heartbeat, BarrierEnter, Publish, Lookup, Add, Leave, Abort>;

// Coordinator -> member.
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
using FromCoordinator = std::variant<Welcome, Refusal, HeartbeatAck, Release, Value, Added, Dead, Shutdown>;

// Throw ProtocolError saying what is wrong (and which field).
ToCoordinator decode_to_coordinator(std::string_view frame);
FromCoordinator decode_from_coordinator(std::string_view frame);

std::string encode(const ToCoordinator& m);
std::string encode(const FromCoordinator& m);

}  // namespace ember::transport::control_codec
