// PsClient: a worker's view of the PS shards: routes every key to its shard, sends one
// request per shard (in flight together), de-duplicates pulled keys, and puts the
// replies back in the caller's order. A pull whose connection fails is retried once on a
// new connection (it is idempotent); pushes and commits are not. One thread uses a
// PsClient at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/common/fast_div.h"
#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/transport/channel.h"
#include "ember/transport/rdma.h"

namespace ember::ps {

struct ShardAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
};

// "host:port" -> address; ConfigError otherwise.
ShardAddress parse_address(const std::string& text);

// Opens the data connection to one shard.
using Connector = std::function<std::unique_ptr<transport::Client>(const ShardAddress&)>;
// `socket_buffer_bytes`: 0 leaves the socket buffers to the kernel (TcpServerOptions).
Connector tcp_connector(const std::string& token, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000),
                        std::uint32_t socket_buffer_bytes = 0);
// `fabric` must outlive the clients made.
Connector rdma_connector(transport::verbs::Fabric& fabric, const std::string& token, transport::RdmaOptions options);

class PsClient {
 public:
  // `connections_per_shard` > 1: each shard's keys are spread over that many connections
  // (by key), whose requests the shard serves in parallel.
  PsClient(const std::vector<ShardAddress>& shards, std::uint32_t dim, std::uint32_t state_floats, const Connector& connect,
           std::uint32_t connections_per_shard = 1);
  // Over TCP.
  PsClient(const std::vector<ShardAddress>& shards, const std::string& token, std::uint32_t dim, std::uint32_t state_floats,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  std::uint32_t shards() const { return static_cast<std::uint32_t>(addresses_.size()); }
  // Pulls sent again on a new connection after the first one failed.
  std::uint64_t retries() const { return retries_; }
  // Whether pull() looks for repeated keys. kNo is for callers whose keys are distinct
  // (a cache's misses): it spares a hash lookup per key, and is still correct if some
  // key repeats (that row is then sent as often as it is asked for).
  enum class Dedup { kYes, kNo };
  // out[i * per] = row of keys[i] (per = dim, or dim + state with `with_state`);
  // repeated keys are fetched once. `iteration`: the iteration the rows are for; a shard
  // refuses a pull for an iteration it has not committed yet (t > 0).
  void pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state = false, std::uint64_t iteration = 0,
            Dedup dedup = Dedup::kYes);
  // Gradients (dim floats per key) of rows trained in `iteration` by trainers[i] workers.
  void push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                 const std::vector<float>& grads);
  // Rows written back (dim + state floats per key).
  void push_value(const std::vector<Key>& keys, const std::vector<float>& rows);
  // Commits `iteration` on every shard; returns the rows updated in all.
  std::uint64_t commit(std::uint64_t iteration);

 private:
  void reconnect(std::uint32_t lane, const std::string& why);
  // Splits rows (per floats each, in the order of `keys`) into by_shard_ / segments_ by
  // lane, each key's lane kept in lane_.
  void route_rows(const std::vector<Key>& keys, const float* rows, std::uint32_t per);
  // Sends every lane's keys and segments as one request each, all in flight, then waits
  // for the acknowledgements. keys_per_row: 2 for push-grad (keys, then trainer counts).
  void send_routed(transport::MessageType type, std::uint64_t iteration, std::uint32_t per, std::uint32_t keys_per_row);
  // A lane is one connection: shard s has lanes s * per_shard_ ... + per_shard_ - 1.
  std::uint32_t lanes() const { return static_cast<std::uint32_t>(conns_.size()); }
  std::uint32_t lane_of(Key key) const;

  Connector connect_;
  std::vector<ShardAddress> addresses_;
  std::uint32_t per_shard_ = 1;
  FastDiv shards_div_, per_shard_div_;  // every key is routed: no hardware divide
  std::vector<std::unique_ptr<transport::Client>> conns_;
  std::uint32_t dim_, state_;
  std::uint64_t retries_ = 0;
  // Per-call scratch, kept to spare allocations (a PsClient serves one thread).
  std::vector<std::vector<Key>> by_shard_;
  std::vector<std::vector<float*>> dst_;
  std::vector<std::vector<transport::Segment>> segments_;
  std::vector<std::uint32_t> first_, lane_;
  U64Map<std::uint32_t> first_of_;
};

}  // namespace ember::ps
