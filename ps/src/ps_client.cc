#include "ember/ps/ps_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/ps/protocol.h"
#include "ember/transport/tcp.h"

namespace ember::ps {

using transport::MessageType;
using transport::OutMessage;

namespace {

// Bytes of a message as framed on the wire (message.h): header, keys, values.
std::uint64_t wire_bytes(const OutMessage& m) { return transport::kHeaderBytes + 8ull * m.key_count + 4ull * m.value_count; }

// The reply `receive` reads, its bytes passed to `count_in`; a refusal (or a bad header)
// throws ProtocolError once its header was read: that much is counted.
template <typename CountIn, typename Receive>
transport::Message receive_counted(CountIn&& count_in, Receive&& receive) {
  try {
    transport::Message r = receive();
    count_in(transport::kHeaderBytes + r.header.payload_bytes());
    return r;
  } catch (const ProtocolError&) {
    count_in(transport::kHeaderBytes);
    throw;
  }
}

}  // namespace

WireTally::Dir& WireTally::Dir::operator+=(const Dir& o) {
  out += o.out;
  in += o.in;
  rows += o.rows;
  return *this;
}

WireTally& WireTally::operator+=(const WireTally& o) {
  pull += o.pull;
  push_grad += o.push_grad;
  push_value += o.push_value;
  commit += o.commit;
  read += o.read;
  hint += o.hint;
  reset += o.reset;
  return *this;
}

void PsClient::count(std::uint32_t lane, const Entry& e, std::uint64_t out, std::uint64_t in, std::uint64_t rows) {
  for (WireTally* t : {&tally_, &shard_tally_[lane / per_shard_]}) {
    WireTally::Dir& d = t->*e.kind;
    d.out += out;
    d.in += in;
    d.rows += rows;
  }
}

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
    for (std::uint32_t c = 0; c < per_shard_; ++c) conns_.push_back(connect(a.host, a.port));
  }
  in_flight_.resize(conns_.size());
  shard_tally_.resize(addresses_.size());
  retired_.resize(addresses_.size());
}

std::vector<PsClient::SocketBytes> PsClient::socket_bytes_by_shard() const {
  std::vector<SocketBytes> by = retired_;
  for (std::uint32_t lane = 0; lane < conns_.size(); ++lane) {
    if (!conns_[lane]) continue;
    by[lane / per_shard_].out += conns_[lane]->bytes_sent();
    by[lane / per_shard_].in += conns_[lane]->bytes_received();
  }
  return by;
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
  if (conns_[s]) {
    retired_[s / per_shard_].out += conns_[s]->bytes_sent();
    retired_[s / per_shard_].in += conns_[s]->bytes_received();
  }
  conns_[s].reset();
  conns_[s] = connect_(a.host, a.port);
  ++retries_;
}

namespace {

transport::Transport tcp_transport(const std::string& token, std::chrono::milliseconds timeout) {
  transport::TransportOptions o;
  o.token = token;
  o.timeout = timeout;
  return transport::Transport(std::move(o));
}

}  // namespace

PsClient::PsClient(const std::vector<ShardAddress>& shards, const std::string& token, std::uint32_t dim, std::uint32_t state_floats,
                   std::chrono::milliseconds timeout)
    : PsClient(shards, dim, state_floats, tcp_transport(token, timeout).make_connector()) {}

// What an operation in flight collects as its replies come in.
struct PsFuture::Op {
  std::vector<std::uint32_t> lanes;  // lanes it sent on (once each)
  std::uint64_t result = 0;          // a commit's updated rows
  bool commit = false;
  std::uint64_t iteration = 0;             // a commit's
  std::vector<std::uint64_t> checkpoints;  // later iterations shards' acks named, in order (checkpoints_at)
  std::uint64_t stop_at = 0;               // one after which the job stops (kAckStop)
  std::exception_ptr error;                // the first failure
  bool finished = false;
  // A de-duplicated pull: each repeated key's row is copied from its first occurrence
  // once all rows are in.
  float* out = nullptr;
  std::uint32_t per = 0;
  std::vector<std::uint32_t> first;
  void fail(std::exception_ptr e) {
    if (!error) error = std::move(e);
  }
};

PsFuture& PsFuture::operator=(PsFuture&& o) noexcept {
  if (this != &o) {
    settle();
    client_ = o.client_;
    op_ = std::move(o.op_);
  }
  return *this;
}

PsFuture::~PsFuture() { settle(); }

void PsFuture::settle() noexcept {
  if (op_ == nullptr || op_->finished) return;
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("a PS request nobody waited for failed: {}", e.what());
  } catch (...) {
    spdlog::error("a PS request nobody waited for failed");
  }
}

const std::vector<std::uint64_t>& PsFuture::checkpoints_at() const {
  static const std::vector<std::uint64_t> none;
  return op_ != nullptr ? op_->checkpoints : none;
}
std::uint64_t PsFuture::stop_at() const { return op_ != nullptr ? op_->stop_at : 0; }

std::uint64_t PsFuture::wait() {
  if (op_ == nullptr) throw std::logic_error("wait() on an empty PsFuture");
  Op& op = *op_;
  if (!op.finished) {
    op.finished = true;
    try {
      for (std::uint32_t lane : op.lanes) client_->complete_through(lane, &op);
    } catch (...) {  // receives record their errors in their ops; this is anything else
      op.fail(std::current_exception());
    }
    if (!op.error && op.out != nullptr) {
      for (std::size_t i = 0; i < op.first.size(); ++i) {
        if (op.first[i] != i)
          std::memcpy(op.out + i * op.per, op.out + static_cast<std::size_t>(op.first[i]) * op.per, op.per * sizeof(float));
      }
    }
  }
  if (op.error) std::rethrow_exception(op.error);
  return op.result;
}

PsClient::~PsClient() {
  // Operations still in flight can no longer be answered: their futures report it.
  for (auto& q : in_flight_) {
    for (Entry& e : q) {
      e.op->fail(std::make_exception_ptr(IoError("PS client closed with a request in flight")));
      e.op->finished = true;
    }
  }
}

transport::Client& PsClient::conn(std::uint32_t lane) {
  if (conns_[lane] == nullptr) {
    const ShardAddress& a = addresses_[lane / per_shard_];
    throw IoError("PS shard " + std::to_string(lane / per_shard_) + " (" + a.host + ":" + std::to_string(a.port) +
                  "): not connected (reconnecting failed)");
  }
  return *conns_[lane];
}

void PsClient::send_entry(std::uint32_t lane, const OutMessage& m, Entry e) {
  drain_pulls(lane);
  try {
    conn(lane).send(m);
    count(lane, e, wire_bytes(m), 0, e.rows);
  } catch (const IoError&) {
    // A pull is sent again on a new connection when its reply is due (it is idempotent
    // and, being the lane's last request, alone there); anything else fails.
    if (!e.pull) {
      e.op->fail(std::current_exception());
      return;
    }
    e.resend = true;
  }
  e.op->lanes.push_back(lane);
  in_flight_[lane].push_back(std::move(e));
}

OutMessage PsClient::Entry::pull_request() const {
  OutMessage m;
  m.header.type = MessageType::kPull;
  m.header.flags = flags;
  m.header.iteration = iteration;
  m.keys = keys.data();
  m.key_count = static_cast<std::uint32_t>(keys.size());
  return m;
}

void PsClient::drain_pulls(std::uint32_t lane) {
  // A pull is always its lane's last request (any later send reads it first).
  if (!in_flight_[lane].empty() && in_flight_[lane].back().pull) complete_through(lane, nullptr);
}

void PsClient::complete_through(std::uint32_t lane, const PsFuture::Op* op) {
  auto& q = in_flight_[lane];
  std::size_t n = q.size();
  if (op != nullptr) {
    while (n > 0 && q[n - 1].op.get() != op) --n;
  }
  for (std::size_t i = 0; i < n; ++i) complete_front(lane);
}

void PsClient::complete_front(std::uint32_t lane) {
  Entry e = std::move(in_flight_[lane].front());
  in_flight_[lane].pop_front();
  PsFuture::Op& op = *e.op;
  try {
    if (!e.pull) {
      const auto in = [&](std::uint64_t n) { count(lane, e, 0, n); };
      const transport::Message r = receive_counted(in, [&] { return conn(lane).receive(); });
      if (r.header.type == MessageType::kAck) {
        const CommitAck ack = decode_commit_ack(r.header, op.iteration);
        op.result += ack.rows_updated;  // 0 for pushes
        if (op.commit && ack.checkpoint_at != 0) {
          auto& c = op.checkpoints;
          if (auto at = std::lower_bound(c.begin(), c.end(), ack.checkpoint_at); at == c.end() || *at != ack.checkpoint_at)
            c.insert(at, ack.checkpoint_at);
          // Shards asked to stop at once (all signalled) may name iterations a commit
          // apart: the job stops at the first, which every worker learns in time.
          if (ack.stop && (op.stop_at == 0 || ack.checkpoint_at < op.stop_at)) op.stop_at = ack.checkpoint_at;
        }
      }
      return;
    }
    transport::Message r;
    const auto in = [&](std::uint64_t n) { count(lane, e, 0, n); };
    try {
      if (e.resend) throw IoError("send failed");
      r = receive_counted(in, [&] { return conn(lane).receive_rows(e.dst, e.per); });
    } catch (const IoError& err) {
      // Alone on its lane (see drain_pulls): the new connection owes nothing else.
      reconnect(lane, err.what());
      const OutMessage m = e.pull_request();
      conns_[lane]->send(m);
      count(lane, e, wire_bytes(m), 0);  // sent again: its bytes counted again
      r = receive_counted(in, [&] { return conns_[lane]->receive_rows(e.dst, e.per); });
    }
    if (r.header.value_count != e.keys.size() * e.per || r.values != nullptr) {
      throw ProtocolError("PS shard " + std::to_string(lane / per_shard_) + ": pull reply of the wrong size");
    }
  } catch (...) {  // the operation reports it: the entry is gone from its lane
    op.fail(std::current_exception());
  }
}

PsFuture PsClient::start_pull(const std::vector<Key>& keys, std::vector<float>& out, bool with_state, std::uint64_t iteration, Dedup dedup,
                              Pull when) {
  const std::uint32_t S = lanes(), per = when == Pull::kHint ? 0 : with_state ? dim_ + state_ : dim_;
  const std::size_t n = keys.size();
  out.resize(n * per);
  auto op = std::make_shared<PsFuture::Op>();
  // Keys per lane, each with where its row lands; with de-duplication, repeats are
  // dropped here and copied from their first occurrence at wait().
  std::vector<Entry> entries(S);
  for (Entry& e : entries) {
    e.op = op;
    e.pull = true;
    e.per = per;
    e.flags = when == Pull::kHint
                  ? kHint
                  : (with_state ? kWithState : 0) | (when == Pull::kAhead ? kPrefetch : 0) | (when == Pull::kRead ? kRead : 0);
    e.iteration = iteration;
    e.kind = when == Pull::kRead ? &WireTally::read : when == Pull::kHint ? &WireTally::hint : &WireTally::pull;
  }
  if (dedup == Dedup::kYes) {
    op->out = out.data();
    op->per = per;
    op->first.resize(n);
    // The map is kept between calls (cleared, not reallocated) unless far larger than needed.
    if (first_of_.capacity() > 16 * n + 64) first_of_ = U64Map<std::uint32_t>(n);
    first_of_.clear();
    first_of_.reserve(n);
  }
  if (dedup == Dedup::kNo && S == 1) {
    // One connection, every key sent: the keys as given, the rows in order.
    entries[0].keys.assign(keys.begin(), keys.end());
    entries[0].dst.resize(n);
    for (std::size_t i = 0; i < n; ++i) entries[0].dst[i] = out.data() + i * per;
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      if (dedup == Dedup::kYes) {
        auto [p, fresh] = first_of_.try_emplace(keys[i], static_cast<std::uint32_t>(i));
        op->first[i] = *p;
        if (!fresh) continue;
      }
      Entry& e = entries[lane_of(keys[i])];
      e.keys.push_back(keys[i]);
      e.dst.push_back(out.data() + i * per);
    }
  }
  // One request per lane, all in flight before the first reply is read.
  for (std::uint32_t s = 0; s < S; ++s) {
    if (entries[s].keys.empty()) continue;
    entries[s].rows = static_cast<std::uint32_t>(entries[s].keys.size());
    const OutMessage m = entries[s].pull_request();  // before the entry moves (it points into its keys)
    send_entry(s, m, std::move(entries[s]));
  }
  return PsFuture(this, std::move(op));
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
  if (S == 1) {  // one connection: the keys as given, the rows as one segment (lane_ unused)
    by_shard_[0].assign(keys.begin(), keys.end());
    if (!keys.empty() && per > 0) segments_[0].push_back({rows, static_cast<std::uint32_t>(keys.size() * per)});
    return;
  }
  lane_.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::uint32_t s = lane_[i] = lane_of(keys[i]);
    by_shard_[s].push_back(keys[i]);
    if (per > 0) transport::append_run(segments_[s], rows + i * per, per);
  }
}

PsFuture PsClient::send_routed(MessageType type, std::uint64_t iteration, std::uint32_t per, std::uint32_t keys_per_row,
                               WireTally::Dir WireTally::*kind) {
  auto op = std::make_shared<PsFuture::Op>();
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
    Entry e;
    e.op = op;
    e.kind = kind;
    e.rows = m.key_count / keys_per_row;
    send_entry(s, m, std::move(e));
  }
  return PsFuture(this, std::move(op));
}

PsFuture PsClient::start_push_grad(std::uint64_t iteration, const std::vector<Key>& keys, const std::vector<std::uint32_t>& trainers,
                                   const std::vector<float>& grads, const std::vector<std::uint32_t>& shares, std::uint32_t group) {
  if (group > kMaxGroup) throw ConfigError("push-grad: host group " + std::to_string(group) + " over " + std::to_string(kMaxGroup));
  route_rows(keys, grads.data(), dim_);
  // Keys, then trainer counts (with their shares and group: protocol.h).
  if (lanes() == 1 && shares.empty() && group == 0) {
    by_shard_[0].insert(by_shard_[0].end(), trainers.begin(), trainers.end());
  } else {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      by_shard_[lanes() == 1 ? 0 : lane_[i]].push_back(encode_trainers(trainers[i], shares.empty() ? 1 : shares[i], group));
    }
  }
  return send_routed(MessageType::kPushGrad, iteration, dim_, 2, &WireTally::push_grad);
}

PsFuture PsClient::start_push_value(const std::vector<Key>& keys, const std::vector<float>& rows) {
  route_rows(keys, rows.data(), dim_ + state_);
  return send_routed(MessageType::kPushValue, 0, dim_ + state_, 1, &WireTally::push_value);
}

PsFuture PsClient::start_reset_rows(std::uint64_t iteration, const std::vector<Key>& slots, const std::vector<std::uint64_t>& ids) {
  if (slots.size() != ids.size()) throw ConfigError("reset-rows: as many ids as slots");
  route_rows(slots, nullptr, 0);
  // Each lane's slots, then their ids in the same order (protocol.h).
  for (std::size_t i = 0; i < slots.size(); ++i) by_shard_[lanes() == 1 ? 0 : lane_[i]].push_back(ids[i]);
  return send_routed(MessageType::kResetRows, iteration, 0, 2, &WireTally::reset);
}

PsFuture PsClient::start_commit(std::uint64_t iteration, std::uint32_t flags) {
  // Every push before it acknowledged (it may have gone on another connection of the
  // shard), then on each shard's first connection.
  for (std::uint32_t lane = 0; lane < lanes(); ++lane) complete_through(lane, nullptr);
  auto op = std::make_shared<PsFuture::Op>();
  op->commit = true;
  op->iteration = iteration;
  for (std::uint32_t s = 0; s < shards(); ++s) {
    OutMessage m;
    m.header.type = MessageType::kCommit;
    m.header.iteration = iteration;
    m.header.flags = flags;
    Entry e;
    e.op = op;
    e.kind = &WireTally::commit;
    send_entry(s * per_shard_, m, std::move(e));
  }
  return PsFuture(this, std::move(op));
}

}  // namespace ember::ps
