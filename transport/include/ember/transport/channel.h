// What every data-plane transport (TCP, RDMA) offers: messages (message.h) with their
// payload segments, a server that answers requests through a RequestHandler, and a
// client that sends requests and receives replies in order, with several in flight.
// The PS client and the conformance tests only see these two interfaces.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/common/types.h"
#include "ember/transport/message.h"

namespace ember::transport {

// A received message: header and payload segments (views into a transport's buffer).
struct Message {
  MessageHeader header;
  const Key* keys = nullptr;
  const float* values = nullptr;
  // Set in requests by a transport that can lend their payload to the handler (TCP):
  // returns an owner that keeps `keys` and `values` valid while any copy of it lives, the
  // transport reading later requests into other memory meanwhile. (A PS keeps a push's
  // gradients there until its commit applies them, instead of copying them.) Callable
  // during the handler's call only. Unset where payloads must be given back at once (RDMA
  // receive slots) and in replies.
  std::function<std::shared_ptr<const void>()> lend_payload;
};

// A run of floats that lives somewhere else (a PS store's rows).
struct Segment {
  const float* data = nullptr;
  std::uint32_t floats = 0;
};

// Appends `floats` values at `data` to `runs`, extending the last run when they follow
// it in memory (rows next to each other travel as one scatter-gather piece).
inline void append_run(std::vector<Segment>& runs, const float* data, std::uint32_t floats) {
  if (!runs.empty() && runs.back().data + runs.back().floats == data) {
    runs.back().floats += floats;
  } else {
    runs.push_back({data, floats});
  }
}

// Copies a reply's values, row_floats per row, to rows[i] (the reply has rows.size() rows).
void place_rows(const Message& reply, std::span<float* const> rows, std::uint32_t row_floats);

// Sending or receiving rows as separate scatter-gather pieces pays when the pieces hold
// at least this many rows on average (the kernel takes 64 pieces per call); with shorter
// pieces a copy into or out of one buffer is cheaper.
inline constexpr std::size_t kMinRowsPerPiece = 8;

// An outgoing message: header (counts are filled from the segments) and segments the
// caller owns until the send returns. The values are either one array (`values`) or,
// with `value_segments`, gathered from where they live (a PS replies from its store this
// way, without first copying the rows into one buffer); value_count is the total.
struct OutMessage {
  MessageHeader header;
  const Key* keys = nullptr;
  std::uint32_t key_count = 0;
  const float* values = nullptr;
  std::uint32_t value_count = 0;
  const Segment* value_segments = nullptr;
  std::uint32_t segment_count = 0;
};

// Per-connection storage a handler may point its reply into.
struct Scratch {
  std::vector<float> values;
  std::vector<Segment> segments;
  std::vector<const float*> rows;
};

// Answers one request: fills `reply` (its segments must stay valid until the handler is
// called again on this connection; `scratch` is per connection for that).
// Throwing ProtocolError sends kError and keeps the connection; other exceptions drop it.
using RequestHandler = std::function<void(const Message& request, OutMessage& reply, Scratch& scratch)>;

// What a server answers with: the handler, and optionally the handler's own work for
// after each reply, which the server calls on the thread that handled the request once
// that reply is handed to the kernel or fabric (or could not be without waiting), before
// doing anything else; not for a request whose connection failed first. What that work
// is, is the handler's business (a PS shard applies the rows a commit left with that
// thread: ps_service.h).
struct ServerHandler {
  RequestHandler handle;
  std::function<void()> after_reply;  // may be empty

  ServerHandler() = default;
  ServerHandler(RequestHandler h, std::function<void()> after) : handle(std::move(h)), after_reply(std::move(after)) {}
  // Any request handler alone (a lambda, a function, a RequestHandler).
  template <class F>
  requires std::is_invocable_v<F&, const Message&, OutMessage&, Scratch&> ServerHandler(F h)
      : handle(std::move(h)) {}  // NOLINT(google-explicit-constructor): a handler is a server's handler
};

// kError replies carry their reason as bytes packed into keys (flags = length).
void make_error_reply(const std::string& why, OutMessage& reply, std::vector<Key>& storage);
std::string error_reply_text(const Message& m);

class Server {
 public:
  virtual ~Server() = default;
  virtual std::uint16_t port() const = 0;
  // Connections dropped for misbehaving (bad message, wrong token, transport error).
  virtual std::uint64_t connections_dropped() const = 0;
  virtual std::uint64_t requests_served() const = 0;
  // Connections open now (over TCP also those not authenticated yet).
  virtual std::uint32_t connections_open() const = 0;
  // Graceful stop (SIGTERM): accepts no more connections or requests, lets the requests
  // being handled finish and their replies go out (up to `grace`), then closes.
  virtual void drain(std::chrono::milliseconds grace) = 0;
};

class Client {
 public:
  virtual ~Client() = default;
  // Sends a request (the request id is assigned here and returned). May block until the
  // transport has room (flow control), never past the client's timeout.
  virtual std::uint64_t send(OutMessage request) = 0;
  // Receives the next reply, in request order, into buffers the client owns (valid
  // until the next receive). A kError reply is thrown as ProtocolError with the reason;
  // a broken connection or a timeout as IoError naming the peer.
  virtual Message receive() = 0;
  // Like receive(), for a reply expected to carry rows.size() rows of row_floats values:
  // they are placed at rows[i] (TCP reads them there straight from the socket) and the
  // returned message has no values pointer. A reply of another shape is returned as is.
  virtual Message receive_rows(std::span<float* const> rows, std::uint32_t row_floats);
  // "host:port" of the server, for messages.
  virtual const std::string& peer() const = 0;
  // The bytes this connection sent and received since it was set up (its handshake left
  // out), counted where they left or entered the socket (TCP) or the device's queues
  // (RDMA): what the job's traffic per link is made of (worker/src/job/hosts.h).
  virtual std::uint64_t bytes_sent() const = 0;
  virtual std::uint64_t bytes_received() const = 0;
  // send + receive, checking that the reply answers this request.
  Message call(OutMessage request);
};

}  // namespace ember::transport
