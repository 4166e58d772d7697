#include "ember/ps/ps_client.h"

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

Connector tcp_connector(const std::string& token, std::chrono::milliseconds timeout) {
  return [token, timeout](const ShardAddress& a) { return std::make_unique<transport::TcpClient>(a.host, a.port, token, timeout); };
}

Connector rdma_connector(transport::verbs::Fabric& fabric, const std::string& token, transport::RdmaOptions options) {
  return [&fabric, token, options](const ShardAddress& a) {
    return std::make_unique<transport::RdmaClient>(fabric, a.host, a.port, token, options);
  };
}

PsClient::PsClient(const std::vector<ShardAddress>& shards, std::uint32_t dim, std::uint32_t state_floats, const Connector& connect)
    : dim_(dim), state_(state_floats) {
  if (shards.empty()) throw ConfigError("no PS shard addresses");
  for (const auto& a : shards) conns_.push_back(connect(a));
}

PsClient::PsClient(const std::vector<ShardAddress>& shards, const std::string& token, std::uint32_t dim, std::uint32_t state_floats,
                   std::chrono::milliseconds timeout)
    : PsClient(shards, dim, state_floats, tcp_connector(token, timeout)) {}

void PsClient::pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state, std::uint64_t iteration) {
  const std::uint32_t S = shards(), per = with_state ? dim_ + state_ : dim_;
  // Distinct keys per shard, and where each distinct key's row lands.
  std::vector<std::vector<Key>> by_shard(S);
  U64Map<std::uint64_t> where;  // key -> shard << 32 | index in shard list
  for (Key k : keys) {
    auto [p, fresh] = where.try_emplace(k, 0);
    if (!fresh) continue;
    std::uint32_t s = owner_shard(k, S);
    *p = (static_cast<std::uint64_t>(s) << 32) | by_shard[s].size();
    by_shard[s].push_back(k);
  }
  // One request per shard, all in flight before the first reply is read.
  for (std::uint32_t s = 0; s < S; ++s) {
    if (by_shard[s].empty()) continue;
    OutMessage m;
    m.header.type = MessageType::kPull;
    m.header.flags = with_state ? kWithState : 0;
    m.header.iteration = iteration;
    m.keys = by_shard[s].data();
    m.key_count = static_cast<std::uint32_t>(by_shard[s].size());
    conns_[s]->send(m);
  }
  // Each reply is scattered into the caller's order straight from the receive buffer.
  out.resize(keys.size() * per);
  std::vector<std::vector<std::uint32_t>> positions(S);  // for each shard's row j: where the first use of its key is
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint64_t w = *where.find(keys[i]);
    auto& pos = positions[w >> 32];
    if (pos.size() <= (w & 0xffffffff)) pos.resize((w & 0xffffffff) + 1, ~std::uint32_t{0});
    if (pos[w & 0xffffffff] == ~std::uint32_t{0}) pos[w & 0xffffffff] = static_cast<std::uint32_t>(i);
  }
  std::vector<float*> dst;
  for (std::uint32_t s = 0; s < S; ++s) {
    if (by_shard[s].empty()) continue;
    dst.resize(by_shard[s].size());
    for (std::size_t j = 0; j < dst.size(); ++j) dst[j] = &out[static_cast<std::size_t>(positions[s][j]) * per];
    transport::Message r = conns_[s]->receive_rows(dst, per);
    if (r.header.value_count != by_shard[s].size() * per || r.values != nullptr) {
      throw ProtocolError("PS shard " + std::to_string(s) + ": pull reply of the wrong size");
    }
  }
  // Repeated keys copy from their first occurrence.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint64_t w = *where.find(keys[i]);
    std::uint32_t first = positions[w >> 32][w & 0xffffffff];
    if (first != i) std::memcpy(&out[i * per], &out[static_cast<std::size_t>(first) * per], per * sizeof(float));
  }
}

void PsClient::push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                         const std::vector<float>& grads) {
  const std::uint32_t S = shards();
  std::vector<std::vector<Key>> k(S), t(S);
  std::vector<std::vector<float>> g(S);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint32_t s = owner_shard(keys[i], S);
    k[s].push_back(keys[i]);
    t[s].push_back(trainers[i]);
    g[s].insert(g[s].end(), grads.begin() + static_cast<std::ptrdiff_t>(i * dim_), grads.begin() + static_cast<std::ptrdiff_t>((i + 1) * dim_));
  }
  std::vector<bool> sent(S, false);
  for (std::uint32_t s = 0; s < S; ++s) {
    if (k[s].empty()) continue;
    k[s].insert(k[s].end(), t[s].begin(), t[s].end());  // keys, then trainer counts
    OutMessage m;
    m.header.type = MessageType::kPushGrad;
    m.header.iteration = iteration;
    m.keys = k[s].data();
    m.key_count = static_cast<std::uint32_t>(k[s].size());
    m.values = g[s].data();
    m.value_count = static_cast<std::uint32_t>(g[s].size());
    conns_[s]->send(m);
    sent[s] = true;
  }
  for (std::uint32_t s = 0; s < S; ++s) {
    if (sent[s]) conns_[s]->receive();
  }
}

void PsClient::push_value(const std::vector<Key>& keys, const std::vector<float>& rows) {
  const std::uint32_t S = shards(), per = dim_ + state_;
  std::vector<std::vector<Key>> k(S);
  std::vector<std::vector<float>> v(S);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint32_t s = owner_shard(keys[i], S);
    k[s].push_back(keys[i]);
    v[s].insert(v[s].end(), rows.begin() + static_cast<std::ptrdiff_t>(i * per), rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
  }
  for (std::uint32_t s = 0; s < S; ++s) {
    if (k[s].empty()) continue;
    OutMessage m;
    m.header.type = MessageType::kPushValue;
    m.keys = k[s].data();
    m.key_count = static_cast<std::uint32_t>(k[s].size());
    m.values = v[s].data();
    m.value_count = static_cast<std::uint32_t>(v[s].size());
    conns_[s]->call(m);
  }
}

std::uint64_t PsClient::commit(std::uint64_t iteration) {
  for (auto& c : conns_) {
    OutMessage m;
    m.header.type = MessageType::kCommit;
    m.header.iteration = iteration;
    c->send(m);
  }
  std::uint64_t updated = 0;
  for (auto& c : conns_) updated += c->receive().header.flags;
  return updated;
}

}  // namespace ember::ps
