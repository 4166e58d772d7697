// PsClient: a worker's view of the PS shards: routes every key to its shard, sends one
// request per shard (in flight together), de-duplicates pulled keys, and puts the
// replies back in the caller's order. A pull whose connection fails is retried once on a
// new connection (it is idempotent); pushes and commits are not. One thread uses a
// PsClient at a time.
//
// Futures: start_pull / start_push_grad / start_push_value / start_commit send their
// requests and return a PsFuture; wait() receives the replies. Several operations may
// be in flight at once (a worker sends its write-backs, its evicted gradients and its
// pull together: one round trip instead of three). Each connection answers in order, so
// waiting for one operation also receives the replies of those sent before it on the
// same connections (kept for their own wait()). A request is never sent while a pull's
// rows are unread on its connection (that pull is received first): a peer blocked
// writing rows nobody reads while the client blocks writing a large request to it would
// stall both until the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ember/common/fast_div.h"
#include "ember/common/flat_map.h"
#include "ember/common/types.h"
#include "ember/ps/protocol.h"
#include "ember/transport/channel.h"
#include "ember/transport/transport.h"

namespace ember::ps {

struct ShardAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
};

// "host:port" -> address; ConfigError otherwise.
ShardAddress parse_address(const std::string& text);

// Opens the data connection to one shard: transport::Transport::make_connector()
// (transport.h), which picks TCP or RDMA by name.
using Connector = transport::Connector;

class PsClient;

// One operation in flight (see PsClient). wait() returns its result (a commit's updated
// row count, else 0) or throws what a shard refused (ProtocolError) or what broke
// (IoError); a second wait() returns or throws the same. The destructor waits for an
// operation not waited for (the pulled rows' destination must not outlive it), logging
// an error it would have thrown. Wait before the PsClient goes.
class PsFuture {
 public:
  struct Op;
  PsFuture() = default;
  PsFuture(PsClient* client, std::shared_ptr<Op> op) : client_(client), op_(std::move(op)) {}
  PsFuture(PsFuture&& o) noexcept = default;
  PsFuture& operator=(PsFuture&& o) noexcept;
  ~PsFuture();
  std::uint64_t wait();
  bool valid() const { return op_ != nullptr; }
  // After a commit's wait(): the iterations at which shards will checkpoint, asked for on
  // command and still ahead (the workers flush for each; protocol.h), in order; shards
  // signalled a commit apart name different ones. checkpoint_at(): the first, else 0.
  const std::vector<std::uint64_t>& checkpoints_at() const;
  std::uint64_t checkpoint_at() const { return checkpoints_at().empty() ? 0 : checkpoints_at().front(); }
  // The same for a checkpoint after which the job stops (a shard was asked to stop; the
  // first such if several shards were), else 0.
  std::uint64_t stop_at() const;

 private:
  void settle() noexcept;  // waits if nobody did, logging what wait() would throw
  PsClient* client_ = nullptr;
  std::shared_ptr<Op> op_;
};

// Bytes a PsClient sent and received, per kind of request, as framed on the wire
// (headers included): what the transport carried, not an estimate from row counts. A
// message counts as the transports frame it (message.h): a 48-byte header, 8 bytes a key
// (a push-grad's trainer counts included), 4 a float. `out` counts each request once the
// transport took it (a pull sent again on a new connection counts again); `in` each reply
// read (a refusal as its header alone: the transport does not pass on its reason's
// length). Not counted: the connections' hellos, framing below the message (TCP/IP,
// RDMA's frame header), a send or receive that failed midway. `rows`: the rows a request
// carried (a pull's keys, a push's rows), once per request even if it is sent again.
struct WireTally {
  struct Dir {
    std::uint64_t out = 0, in = 0, rows = 0;
    Dir& operator+=(const Dir& o);
  };
  // `read`: pulls outside training (Pull::kRead: evaluations, dumps, loads), apart from
  // the training's pulls.
  // `hint`: rows named ahead for a shard's disk tier (Pull::kHint).
  // `reset`: dynamic tables' new rows named to their shards (slot and id, no row).
  Dir pull, push_grad, push_value, commit, read, hint, reset;
  std::uint64_t out() const { return pull.out + push_grad.out + push_value.out + commit.out + read.out + hint.out + reset.out; }
  std::uint64_t in() const { return pull.in + push_grad.in + push_value.in + commit.in + read.in + hint.in + reset.in; }
  WireTally& operator+=(const WireTally& o);
};

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
  // Bytes sent and received so far, per kind of request (WireTally), and the same per
  // shard (where the shard's host decides the link it crossed).
  const WireTally& tally() const { return tally_; }
  const std::vector<WireTally>& tally_by_shard() const { return shard_tally_; }
  // Bytes the connections to each shard sent and received, as the transport counted them
  // at its socket (transport::Client::bytes_sent; connections replaced after a failure
  // included): the link traffic, independent of the tallies above.
  struct SocketBytes {
    std::uint64_t out = 0, in = 0;
  };
  std::vector<SocketBytes> socket_bytes_by_shard() const;
  // Whether pull() looks for repeated keys. kNo is for callers whose keys are distinct
  // (a cache's misses): it spares a hash lookup per key, and is still correct if some
  // key repeats (that row is then sent as often as it is asked for).
  enum class Dedup { kYes, kNo };
  // out[i * per] = row of keys[i] (per = dim, or dim + state with `with_state`);
  // repeated keys are fetched once. `iteration`: the iteration the rows are for; a shard
  // refuses a pull for an iteration it has not committed yet (t > 0).
  void pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state = false, std::uint64_t iteration = 0,
            Dedup dedup = Dedup::kYes) {
    start_pull(keys, out, with_state, iteration, dedup).wait();
  }
  // pull() as a read outside training (an evaluation, a dump, rows loaded at the start).
  void read(const std::vector<Key>& keys, std::vector<float>& out, bool with_state = false, std::uint64_t iteration = 0) {
    start_pull(keys, out, with_state, iteration, Dedup::kYes, Pull::kRead).wait();
  }
  // Gradients (dim floats per key) of rows trained in `iteration` by trainers[i] workers.
  void push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                 const std::vector<float>& grads) {
    start_push_grad(iteration, keys, trainers, grads).wait();
  }
  // Rows written back (dim + state floats per key).
  void push_value(const std::vector<Key>& keys, const std::vector<float>& rows) { start_push_value(keys, rows).wait(); }
  // Commits `iteration` on every shard; returns the rows updated in all.
  std::uint64_t commit(std::uint64_t iteration) { return start_commit(iteration).wait(); }

  // The same, sent now and answered at wait(). The inputs are read before these return;
  // start_pull's `out` is resized here and filled by wait() (leave it alone until then).
  // With Pull::kAhead, a prefetch (protocol.h kPrefetch): rows for `iteration` pulled
  // once commit(iteration - 1) is in, which no push may change until commit(iteration).
  // With Pull::kRead, a read outside training (protocol.h kRead): the shards count it
  // apart from the training's pulls.
  // With Pull::kHint, a hint (protocol.h kHint): the rows are named, none comes back
  // (`out` is left empty).
  enum class Pull { kCommitted, kAhead, kRead, kHint };
  PsFuture start_pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state = false, std::uint64_t iteration = 0,
                      Dedup dedup = Dedup::kYes, Pull when = Pull::kCommitted);
  // `shares` (empty: 1 each): how many of the row's trainers each gradient sums (a host's
  // sum, per-host aggregation; protocol.h); `group`: the aggregating host (0: none).
  PsFuture start_push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                           const std::vector<float>& grads, const std::vector<std::uint32_t>& shares = {}, std::uint32_t group = 0);
  PsFuture start_push_value(const std::vector<Key>& keys, const std::vector<float>& rows);
  // Dynamic tables: slots[i] holds a new row of ids[i] from iteration `iteration`, which
  // its shard resets at that iteration's commit (protocol.h kResetRows).
  PsFuture start_reset_rows(std::uint64_t iteration, const std::vector<Key>& slots, const std::vector<std::uint64_t>& ids);
  // Sent once every request before it is answered (its pushes on the shards' other
  // connections must be in before the commit applies them). `flags` (protocol.h):
  // kCommitCheckpoint: the caller flushed for a checkpoint of this iteration, which every
  // shard then writes; kCommitStop: the caller asks the job to stop at a checkpoint.
  PsFuture start_commit(std::uint64_t iteration, std::uint32_t flags = 0);

  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

 private:
  friend class PsFuture;
  // A request on one lane whose reply is not read yet, oldest first per lane.
  struct Entry {
    std::shared_ptr<PsFuture::Op> op;
    bool pull = false;
    bool resend = false;      // a pull whose send failed: sent again on a new connection
    std::vector<Key> keys;    // a pull's keys (to send it again)
    std::vector<float*> dst;  // a pull's row destinations
    std::uint32_t per = 0;    // floats per pulled row
    std::uint32_t flags = 0;  // a pull's header flags and iteration (to send it again)
    std::uint64_t iteration = 0;
    WireTally::Dir WireTally::*kind = nullptr;   // where its bytes are counted (tally_, shard_tally_)
    std::uint32_t rows = 0;                      // rows it carries (WireTally::Dir::rows)
    transport::OutMessage pull_request() const;  // a pull's request, from the fields above
  };
  // Reads replies on `lane` up to and including the last entry of `op` (all if null),
  // each into its own operation.
  void complete_through(std::uint32_t lane, const PsFuture::Op* op);
  void complete_front(std::uint32_t lane);
  // Before a send on `lane`: the rows of pulls in flight there are read first.
  void drain_pulls(std::uint32_t lane);
  // Sends on `lane` for `op`: kept in the lane's queue; a failed send fails the op.
  void send_entry(std::uint32_t lane, const transport::OutMessage& m, Entry e);
  void reconnect(std::uint32_t lane, const std::string& why);
  // The lane's connection; IoError if a reconnect failed (a pull then tries again).
  transport::Client& conn(std::uint32_t lane);
  // Splits rows (per floats each, in the order of `keys`) into by_shard_ / segments_ by
  // lane, each key's lane kept in lane_ (with more lanes than one). per = 0: keys only.
  void route_rows(const std::vector<Key>& keys, const float* rows, std::uint32_t per);
  // Sends every lane's keys and segments as one request each, all in flight; the future
  // receives the acknowledgements. keys_per_row: 2 for push-grad (keys, then trainer counts).
  // Their bytes are counted in `wire`.
  PsFuture send_routed(transport::MessageType type, std::uint64_t iteration, std::uint32_t per, std::uint32_t keys_per_row,
                       WireTally::Dir WireTally::*kind);
  // Counts bytes of `e`'s kind sent and received on `lane`, in the total and its shard's.
  void count(std::uint32_t lane, const Entry& e, std::uint64_t out, std::uint64_t in, std::uint64_t rows = 0);
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
  WireTally tally_;
  std::vector<WireTally> shard_tally_;        // per shard
  std::vector<SocketBytes> retired_;          // per shard: connections replaced (reconnect)
  std::vector<std::deque<Entry>> in_flight_;  // per lane
  // Per-call scratch, kept to spare allocations (a PsClient serves one thread).
  std::vector<std::vector<Key>> by_shard_;
  std::vector<std::vector<transport::Segment>> segments_;
  std::vector<std::uint32_t> lane_;
  U64Map<std::uint32_t> first_of_;
};

}  // namespace ember::ps
