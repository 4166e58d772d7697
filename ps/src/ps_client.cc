#include "ember/ps/ps_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/ps/ps_service.h"
#include "ember/ps/shard_store.h"
#include "ember/transport/tcp.h"

namespace ember::ps {

using transport::MessageType;
using transport::OutMessage;

ShardAddress parse_address(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) throw ConfigError("address '" + text + "' is not host:port");
  int port = 0;
  try {
    port = std::stoi(text.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535) throw ConfigError("address '" + text + "': bad port");
  return {text.substr(0, colon), static_cast<std::uint16_t>(port)};
}

Connector tcp_connector(const std::string& token, std::chrono::milliseconds timeout, std::uint32_t socket_buffer_bytes) {
  return [token, timeout, socket_buffer_bytes](const ShardAddress& a) {
    return std::make_unique<transport::TcpClient>(a.host, a.port, token, timeout, socket_buffer_bytes);
  };
}

Connector rdma_connector(transport::verbs::Fabric& fabric, const std::string& token, transport::RdmaOptions options) {
  return [&fabric, token, options](const ShardAddress& a) {
    return std::make_unique<transport::RdmaClient>(fabric, a.host, a.port, token, options);
  };
}

PsClient::PsClient(const std::vector<ShardAddress>& shards, std::uint32_t dim, std::uint32_t state_floats, const Connector& connect,
                   std::uint32_t connections_per_shard)
    : connect_(connect),
      addresses_(shards),
      per_shard_(std::max<std::uint32_t>(1, connections_per_shard)),
      shards_div_(shards.size()),
      per_shard_div_(per_shard_),
      dim_(dim),
      state_(state_floats) {
  if (shards.empty()) throw ConfigError("no PS shard addresses");
  for (const auto& a : shards) {
    for (std::uint32_t c = 0; c < per_shard_; ++c) conns_.push_back(connect(a));
  }
}

std::uint32_t PsClient::lane_of(Key key) const {
  // Blocks of 64 rows that follow each other on the shard stay on one connection, so
  // replies of consecutive keys still travel as runs (sent and received without copies).
  constexpr std::uint64_t kBlock = 64;
  if (conns_.size() == 1) return 0;
  const std::uint64_t local = shards_div_.quotient(key);  // the key's row index on its shard
  const auto shard = static_cast<std::uint32_t>(key - local * shards_div_.divisor());
  if (per_shard_ == 1) return shard;
  return shard * per_shard_ + static_cast<std::uint32_t>(per_shard_div_.remainder(local / kBlock));
}

void PsClient::reconnect(std::uint32_t s, const std::string& why) {
  const ShardAddress& a = addresses_[s / per_shard_];
  spdlog::warn("PS shard {} ({}:{}): {}; retrying the pull on a new connection", s / per_shard_, a.host, a.port, why);
  conns_[s].reset();
  conns_[s] = connect_(a);
  ++retries_;
}

PsClient::PsClient(const std::vector<ShardAddress>& shards, const std::string& token, std::uint32_t dim, std::uint32_t state_floats,
                   std::chrono::milliseconds timeout)
    : PsClient(shards, dim, state_floats, tcp_connector(token, timeout)) {}

void PsClient::pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state, std::uint64_t iteration, Dedup dedup) {
  const std::uint32_t S = lanes(), per = with_state ? dim_ + state_ : dim_;
  const std::size_t n = keys.size();
  out.resize(n * per);
  // Keys per lane, each with where its row lands; with de-duplication, repeats are
  // dropped here and copied from their first occurrence at the end.
  by_shard_.resize(S);
  dst_.resize(S);
  for (std::uint32_t s = 0; s < S; ++s) {
    by_shard_[s].clear();
    dst_[s].clear();
  }
  if (dedup == Dedup::kYes) {
    first_.resize(n);
    // The map is kept between calls (cleared, not reallocated) unless far larger than needed.
    if (first_of_.capacity() > 16 * n + 64) first_of_ = U64Map<std::uint32_t>(n);
    first_of_.clear();
    first_of_.reserve(n);
  }
  if (dedup == Dedup::kNo && S == 1) {
    // One connection, every key sent: the keys as given, the rows in order.
    by_shard_[0].assign(keys.begin(), keys.end());
    dst_[0].resize(n);
    for (std::size_t i = 0; i < n; ++i) dst_[0][i] = out.data() + i * per;
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      if (dedup == Dedup::kYes) {
        auto [p, fresh] = first_of_.try_emplace(keys[i], static_cast<std::uint32_t>(i));
        first_[i] = *p;
        if (!fresh) continue;
      }
      const std::uint32_t s = lane_of(keys[i]);
      by_shard_[s].push_back(keys[i]);
      dst_[s].push_back(&out[i * per]);
    }
  }
  auto request = [&](std::uint32_t s) {
    OutMessage m;
    m.header.type = MessageType::kPull;
    m.header.flags = with_state ? kWithState : 0;
    m.header.iteration = iteration;
    m.keys = by_shard_[s].data();
    m.key_count = static_cast<std::uint32_t>(by_shard_[s].size());
    return m;
  };
  // One request per shard, all in flight before the first reply is read. A pull changes
  // nothing at the PS, so a connection that fails (not a refusal) is replaced and the
  // pull sent once more; pushes are never retried.
  std::vector<bool> resend(S, false);
  for (std::uint32_t s = 0; s < S; ++s) {
    if (by_shard_[s].empty()) continue;
    try {
      conns_[s]->send(request(s));
    } catch (const IoError&) {
      resend[s] = true;
    }
  }
  // Each reply's rows go straight to their places in `out`.
  for (std::uint32_t s = 0; s < S; ++s) {
    if (by_shard_[s].empty()) continue;
    transport::Message r;
    try {
      if (resend[s]) throw IoError("send failed");
      r = conns_[s]->receive_rows(dst_[s], per);
    } catch (const IoError& e) {
      reconnect(s, e.what());
      conns_[s]->send(request(s));
      r = conns_[s]->receive_rows(dst_[s], per);
    }
    if (r.header.value_count != by_shard_[s].size() * per || r.values != nullptr) {
      throw ProtocolError("PS shard " + std::to_string(s / per_shard_) + ": pull reply of the wrong size");
    }
  }
  if (dedup == Dedup::kNo) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (first_[i] != i) std::memcpy(&out[i * per], &out[static_cast<std::size_t>(first_[i]) * per], per * sizeof(float));
  }
}

void PsClient::route_rows(const std::vector<Key>& keys, const float* rows, std::uint32_t per) {
  const std::uint32_t S = lanes();
  by_shard_.resize(S);
  segments_.resize(S);
  for (std::uint32_t s = 0; s < S; ++s) {
    by_shard_[s].clear();
    segments_[s].clear();
  }
  // The rows are gathered from the caller's array (consecutive rows of one lane are one
  // segment), never copied per shard.
  lane_.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::uint32_t s = lane_[i] = lane_of(keys[i]);
    by_shard_[s].push_back(keys[i]);
    transport::append_run(segments_[s], rows + i * per, per);
  }
}

void PsClient::send_routed(MessageType type, std::uint64_t iteration, std::uint32_t per, std::uint32_t keys_per_row) {
  const std::uint32_t S = lanes();
  for (std::uint32_t s = 0; s < S; ++s) {
    if (by_shard_[s].empty()) continue;
    OutMessage m;
    m.header.type = type;
    m.header.iteration = iteration;
    m.keys = by_shard_[s].data();
    m.key_count = static_cast<std::uint32_t>(by_shard_[s].size());
    m.value_segments = segments_[s].data();
    m.segment_count = static_cast<std::uint32_t>(segments_[s].size());
    m.value_count = static_cast<std::uint32_t>(by_shard_[s].size() / keys_per_row * per);
    conns_[s]->send(m);
  }
  for (std::uint32_t s = 0; s < S; ++s) {
    if (!by_shard_[s].empty()) conns_[s]->receive();
  }
}

void PsClient::push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                         const std::vector<float>& grads) {
  route_rows(keys, grads.data(), dim_);
  // Keys, then trainer counts.
  for (std::size_t i = 0; i < keys.size(); ++i) by_shard_[lane_[i]].push_back(trainers[i]);
  send_routed(MessageType::kPushGrad, iteration, dim_, 2);
}

void PsClient::push_value(const std::vector<Key>& keys, const std::vector<float>& rows) {
  route_rows(keys, rows.data(), dim_ + state_);
  send_routed(MessageType::kPushValue, 0, dim_ + state_, 1);
}

std::uint64_t PsClient::commit(std::uint64_t iteration) {
  // On each shard's first connection: every push before it was acknowledged already.
  for (std::uint32_t s = 0; s < shards(); ++s) {
    OutMessage m;
    m.header.type = MessageType::kCommit;
    m.header.iteration = iteration;
    conns_[s * per_shard_]->send(m);
  }
  std::uint64_t updated = 0;
  for (std::uint32_t s = 0; s < shards(); ++s) updated += conns_[s * per_shard_]->receive().header.flags;
  return updated;
}

}  // namespace ember::ps
