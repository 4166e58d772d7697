// PsService: a shard's request handling over the wire format: pull (values, or values
// and optimizer state), push-grad, push-value, commit. Bad requests (unknown keys, wrong
// sizes) get an error reply, never a crash.
//
// Payloads:
//   kPull       keys[n]                          -> kPullReply values[n * dim]
//               (flags & kWithState: values[n * (dim + state)])
//   kPushGrad   keys[n] then trainer counts[n] (2n keys), values[n * dim] gradients of
//               the header's iteration -> kAck
//   kPushValue  keys[n], values[n * (dim + state)] -> kAck
//   kCommit     (empty) -> kAck, flags = rows updated
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ember/ps/shard_store.h"
#include "ember/transport/tcp.h"

namespace ember::ps {

inline constexpr std::uint32_t kWithState = 1;

class PsService {
 public:
  explicit PsService(StoreConfig config) : store_(std::move(config)) {}

  // A transport::RequestHandler.
  void handle(const transport::Message& request, transport::OutMessage& reply, std::vector<float>& scratch);

  ShardStore& store() { return store_; }
  std::mutex& mutex() { return mutex_; }
  std::uint64_t rows_served() const { return rows_.load(); }

 private:
  ShardStore store_;
  std::mutex mutex_;  // one lock per shard for now; requests touch many rows each
  std::atomic<std::uint64_t> rows_{0};
};

}  // namespace ember::ps
