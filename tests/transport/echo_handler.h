// The request handler the transport tests serve: echoes the keys and doubles the values;
// a pull of key 666 is refused; a commit of iteration 999 takes 600 ms (for timeouts).
#pragma once

#include <chrono>
#include <thread>

#include "ember/common/error.h"
#include "ember/transport/channel.h"

namespace ember::transport::test {

inline constexpr std::uint64_t kSlowIteration = 999;

// A commit that test::echo answers only after 600 ms.
inline OutMessage slow_commit() {
  OutMessage m;
  m.header.type = MessageType::kCommit;
  m.header.iteration = kSlowIteration;
  return m;
}

inline void echo(const Message& req, OutMessage& reply, Scratch& scratch) {
  if (req.header.type == MessageType::kPull && req.header.key_count > 0 && req.keys[0] == 666) throw ProtocolError("key 666 is unknown");
  if (req.header.type == MessageType::kCommit && req.header.iteration == kSlowIteration) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  scratch.values.assign(req.values, req.values + req.header.value_count);
  for (float& v : scratch.values) v *= 2;
  reply.header.type = MessageType::kAck;
  reply.keys = req.keys;
  reply.key_count = req.header.key_count;
  reply.values = scratch.values.data();
  reply.value_count = static_cast<std::uint32_t>(scratch.values.size());
}

}  // namespace ember::transport::test
