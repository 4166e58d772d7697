#include "ember/transport/channel.h"

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"

namespace ember::transport {

void make_error_reply(const std::string& why, OutMessage& reply, std::vector<Key>& storage) {
  storage.assign((why.size() + 7) / 8, 0);
  std::memcpy(storage.data(), why.data(), why.size());
  reply = OutMessage{};
  reply.header.type = MessageType::kError;
  reply.header.flags = static_cast<std::uint32_t>(why.size());
  reply.keys = storage.data();
  reply.key_count = static_cast<std::uint32_t>(storage.size());
}

std::string error_reply_text(const Message& m) {
  std::size_t len = std::min<std::size_t>(m.header.flags, static_cast<std::size_t>(m.header.key_count) * 8);
  return std::string(reinterpret_cast<const char*>(m.keys), len);
}

Message Client::call(OutMessage request) {
  std::uint64_t id = send(request);
  Message m = receive();
  if (m.header.request_id != id) {
    throw ProtocolError("PS " + peer() + ": reply to request " + std::to_string(m.header.request_id) + ", expected " + std::to_string(id));
  }
  return m;
}

void place_rows(const Message& reply, std::span<float* const> rows, std::uint32_t row_floats) {
  for (std::size_t i = 0; i < rows.size(); ++i) std::memcpy(rows[i], reply.values + i * row_floats, 4ull * row_floats);
}

Message Client::receive_rows(std::span<float* const> rows, std::uint32_t row_floats) {
  Message m = receive();
  if (m.header.value_count != rows.size() * static_cast<std::uint64_t>(row_floats)) return m;
  place_rows(m, rows, row_floats);
  m.values = nullptr;
  return m;
}

}  // namespace ember::transport
