#include "ember/transport/control.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <variant>
#include <zmq.hpp>

#include "control_codec.h"
#include "ember/common/error.h"
#include "ember/common/host.h"
#include "ember/common/log.h"
#include "ember/common/process.h"
#include "ember/transport/auth.h"

namespace ember::transport {

using Clock = std::chrono::steady_clock;

const char* role_name(Role role) { return role == Role::kPs ? "ps" : "worker"; }

namespace {

// tcp://NAME:PORT with NAME's first IPv4 address for NAME; "" when NAME does not
// resolve or the endpoint is not tcp://.
std::string resolved_endpoint(const std::string& endpoint) {
  const std::string scheme = "tcp://";
  const auto colon = endpoint.rfind(':');
  if (endpoint.compare(0, scheme.size(), scheme) != 0 || colon == std::string::npos || colon <= scheme.size()) return "";
  const auto address = ipv4_address(endpoint.substr(scheme.size(), colon - scheme.size()));
  return address ? scheme + *address + endpoint.substr(colon) : "";
}

namespace codec = control_codec;

void send_frame(zmq::socket_t& socket, const std::string& text) { socket.send(zmq::buffer(text), zmq::send_flags::dontwait); }

std::string peer_name(Role role, std::uint32_t rank) { return std::string(role_name(role)) + " " + std::to_string(rank); }

// The peer's address from the frame's metadata; "?" when there is none (a ZMTP/1.0 peer
// sends no metadata, and cppzmq's gets() would throw).
std::string peer_address(zmq::message_t& frame) {
  const char* addr = zmq_msg_gets(frame.handle(), "Peer-Address");
  return addr ? addr : "?";
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Coordinator

struct Coordinator::Impl {
  struct Member {
    Role role;
    int rank;  // -1 until assigned
    std::string data;
    std::string peer;  // the address it joined from (ZeroMQ's Peer-Address)
    Clock::time_point last_seen;
    std::optional<std::string> ending;  // it said it is ending, and why (at last_seen)
    bool left = false;
    bool dead = false;
  };

  std::string token;
  JobShape shape;
  ControlTimeouts timeouts;
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::string bound;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<bool> finished{false};
  std::atomic<std::uint32_t> ps_left{0};
  std::atomic<std::uint32_t> alive{0};  // joined, neither left nor dead (counted every tick)
  mutable std::mutex mutex;             // guards failure and on_failure (used by other threads)
  std::optional<std::string> failure;
  std::function<void(const JobFailure&)> on_failure;
  LogLimiter malformed_log, refused_log, stray_log;

  // Owned by the thread.
  std::map<std::string, Member> members;  // by ZeroMQ identity
  bool formed = false;
  std::map<int, std::map<std::uint64_t, std::set<std::string>>> barriers;  // group -> gen -> arrived
  std::map<std::string, std::string> board;
  std::multimap<std::string, std::string> waiting_lookups;  // key -> identity
  // Challenges sent and not yet answered by a join, by ZeroMQ identity: each is good for
  // one join. At most kMaxChallenges (anyone may ask): the oldest goes first.
  struct Challenged {
    auth::Nonce coordinator, member;
    std::uint64_t seq = 0;
  };
  static constexpr std::size_t kMaxChallenges = 1024;
  std::map<std::string, Challenged> challenges;
  std::uint64_t challenge_seq = 0;

  void send_to(const std::string& identity, const codec::FromCoordinator& m) {
    const std::string text = codec::encode(m);
    router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router.send(zmq::buffer(text), zmq::send_flags::dontwait);
  }

  void loop() {
    const auto tick = std::max(std::chrono::milliseconds(10), timeouts.heartbeat_interval / 2);
    while (!stop.load()) {
      // Nothing a peer sends may end this thread: the job's failure detection is here.
      try {
        zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 1, tick);
        if (items[0].revents & ZMQ_POLLIN) receive();
        check_heartbeats();
        std::uint32_t n = 0;
        for (const auto& [id, m] : members) n += !m.dead && !m.left;
        alive.store(n);
      } catch (const std::exception& e) {
        malformed_log.warn(std::string("control: coordinator: ") + e.what());
      }
    }
  }

  void receive() {
    zmq::message_t id, body;
    if (!router.recv(id, zmq::recv_flags::dontwait)) return;
    if (!id.more() || !router.recv(body, zmq::recv_flags::dontwait)) return;
    while (body.more()) {  // drop extra frames
      zmq::message_t extra;
      if (!router.recv(extra, zmq::recv_flags::dontwait)) break;
    }
    const std::string peer = peer_address(body);
    codec::ToCoordinator msg;
    try {
      msg = codec::decode_to_coordinator(std::string_view(static_cast<const char*>(body.data()), body.size()));
    } catch (const ProtocolError& e) {
      malformed_log.warn("control: dropped a malformed message from " + peer + ": " + e.what());
      return;
    }
    handle(id.to_string(), msg, peer);
  }

  void fail(const std::string& member, const std::string& cause, int exit_status = 0) {
    std::function<void(const JobFailure&)> callback;
    {
      std::lock_guard lock(mutex);
      if (failure) return;
      failure = member + ": " + cause;
      callback = on_failure;
    }
    spdlog::error("control: job failed: {}: {}", member, cause);
    for (auto& [id, m] : members)
      if (!m.dead && !m.left) send_to(id, codec::Dead{member, cause});
    if (callback) callback(JobFailure{member, cause, exit_status});
  }

  std::string name_of(const Member& m) const { return m.rank >= 0 ? peer_name(m.role, m.rank) : std::string(role_name(m.role)); }

  void check_heartbeats() {
    const auto now = Clock::now();
    for (auto& [id, m] : members) {
      if (m.dead || m.left) continue;
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen);
      // A member that said it is ending is named only once a member lost before it would
      // have been found (its silence began earlier): a host lost just before is the cause.
      if (m.ending) {
        if (silent > timeouts.heartbeat_timeout + timeouts.heartbeat_timeout / 4) {
          m.dead = true;
          fail(name_of(m), *m.ending);
        }
        continue;
      }
      if (silent > timeouts.heartbeat_timeout) {
        m.dead = true;
        // Where it was: the address it joined from (a worker's host), and a shard's data plane.
        fail(name_of(m), fmt::format("no heartbeat for {} ms (joined from {}{})", silent.count(), m.peer.empty() ? "?" : m.peer,
                                     m.data.empty() ? "" : ", data plane " + m.data));
      }
    }
  }

  void refuse(const std::string& id, const std::string& peer, const std::string& why) {
    refused.fetch_add(1);
    refused_log.warn("control: refused join from " + peer + ": " + why);
    send_to(id, codec::Refusal{why});
  }

  // A fresh nonce for this join attempt, with this coordinator's proof over both nonces.
  void challenge(const std::string& id, const codec::Hello& hello) {
    if (challenges.size() >= kMaxChallenges && !challenges.count(id)) {
      auto oldest =
          std::min_element(challenges.begin(), challenges.end(), [](const auto& a, const auto& b) { return a.second.seq < b.second.seq; });
      challenges.erase(oldest);
    }
    Challenged& c = challenges[id];
    c.coordinator = auth::random_nonce();
    c.member = hello.nonce;
    c.seq = challenge_seq++;
    send_to(id, codec::Challenge{c.coordinator, auth::proof(token, auth::kJoinCoordinator, c.coordinator, c.member)});
  }

  void handle(const std::string& id, const codec::ToCoordinator& msg, const std::string& peer) {
    if (auto* join_msg = std::get_if<codec::Join>(&msg)) return join(id, *join_msg, peer);
    if (auto* hello = std::get_if<codec::Hello>(&msg)) {
      if (members.count(id)) return stray_log.warn("control: dropped a hello from " + peer + " (joined already)");
      return challenge(id, *hello);
    }
    auto it = members.find(id);
    if (it == members.end()) {                                    // not joined: only join is allowed
      if (std::holds_alternative<codec::Heartbeat>(msg)) return;  // a refused member's last heartbeat
      stray_log.warn("control: dropped a message from " + peer + " (not joined)");
      send_to(id, codec::Refusal{"not joined"});
      return;
    }
    Member& m = it->second;
    m.last_seen = Clock::now();
    if (std::holds_alternative<codec::Heartbeat>(msg)) {
      send_to(id, codec::HeartbeatAck{});
    } else if (auto* b = std::get_if<codec::BarrierEnter>(&msg)) {
      barrier(id, b->group, b->gen);
    } else if (auto* p = std::get_if<codec::Publish>(&msg)) {
      set_value(p->key, p->value);
    } else if (auto* l = std::get_if<codec::Lookup>(&msg)) {
      auto v = board.find(l->key);
      if (v != board.end())
        send_to(id, codec::Value{l->key, v->second});
      else
        waiting_lookups.emplace(l->key, id);
    } else if (auto* a = std::get_if<codec::Add>(&msg)) {
      add(id, *a);
    } else if (std::holds_alternative<codec::Leave>(msg)) {
      if (m.left || m.dead) return;
      if (m.role == Role::kPs) ps_left.fetch_add(1);
      m.left = true;
      spdlog::info("control: {} left", name_of(m));
      maybe_finish();
    } else if (auto* ab = std::get_if<codec::Abort>(&msg)) {
      if (m.left || m.dead) return;
      m.dead = true;
      fail(name_of(m), ab->why, ab->exit_status);
    } else if (auto* e = std::get_if<codec::Ending>(&msg)) {
      if (m.left || m.dead) return;
      spdlog::warn("control: {} is ending: {}", name_of(m), e->why);
      m.ending = e->why;
    }
  }

  void add(const std::string& id, const codec::Add& a) {
    std::int64_t value = 0;
    if (auto v = board.find(a.key); v != board.end()) {
      try {
        std::size_t used = 0;
        value = std::stoll(v->second, &used);
        if (used != v->second.size()) throw std::invalid_argument("trailing bytes");
      } catch (const std::exception&) {
        spdlog::warn("control: add to '{}', whose value is not a number: counted from 0", a.key);
        value = 0;
      }
    }
    value += a.delta;
    set_value(a.key, std::to_string(value));
    send_to(id, codec::Added{a.id, value});
  }

  // Sets a board entry and answers the lookups that waited for it.
  void set_value(const std::string& key, const std::string& value) {
    board[key] = value;
    auto [b, e] = waiting_lookups.equal_range(key);
    for (auto w = b; w != e; ++w) send_to(w->second, codec::Value{key, value});
    waiting_lookups.erase(b, e);
  }

  void join(const std::string& id, const codec::Join& msg, const std::string& peer) {
    // The proof answers this identity's last challenge, once: a recorded join answers no
    // other (nor the same one again).
    auto c = challenges.find(id);
    if (c == challenges.end()) return refuse(id, peer, "a join without a challenge (say hello first)");
    const Challenged challenged = c->second;
    challenges.erase(c);
    const auth::Digest proven = auth::proof(token, auth::kJoinMember, challenged.coordinator, challenged.member,
                                            codec::join_identity(msg.role, msg.rank, msg.data));
    if (!auth::equal(msg.proof, proven)) return refuse(id, peer, "wrong job token");
    if (formed) return refuse(id, peer, "the job is already formed");
    Member m;
    m.role = msg.role;
    m.rank = msg.rank;
    m.data = msg.data;
    m.peer = peer;
    const std::uint32_t expected = m.role == Role::kPs ? shape.ps : shape.workers;
    std::uint32_t have = 0;
    for (auto& [oid, o] : members) {
      if (o.role != m.role || oid == id) continue;
      ++have;
      if (m.rank >= 0 && o.rank == m.rank) return refuse(id, peer, fmt::format("{} is taken", peer_name(m.role, m.rank)));
    }
    if (m.rank >= static_cast<int>(expected) || have >= expected)
      return refuse(id, peer,
                    fmt::format("the job has {} {} member(s); {} does not fit", expected, role_name(m.role),
                                m.rank >= 0 ? peer_name(m.role, m.rank) : std::string("another")));
    m.last_seen = Clock::now();
    members[id] = m;
    spdlog::info("control: {} joined from {} ({}/{} ps, {}/{} workers)", role_name(m.role), peer, count(Role::kPs), shape.ps,
                 count(Role::kWorker), shape.workers);
    if (count(Role::kPs) == shape.ps && count(Role::kWorker) == shape.workers) form();
  }

  std::uint32_t count(Role role) const {
    std::uint32_t n = 0;
    for (auto& [id, m] : members) n += m.role == role;
    return n;
  }

  void form() {
    for (Role role : {Role::kPs, Role::kWorker}) {
      std::set<int> taken;
      for (auto& [id, m] : members)
        if (m.role == role && m.rank >= 0) taken.insert(m.rank);
      int next = 0;
      for (auto& [id, m] : members) {
        if (m.role != role || m.rank >= 0) continue;
        while (taken.count(next)) ++next;
        m.rank = next++;
      }
    }
    codec::Welcome w;
    w.shape = shape;
    for (auto& [id, m] : members) w.peers.push_back(Peer{m.role, static_cast<std::uint32_t>(m.rank), m.data});
    for (auto& [id, m] : members) {
      w.rank = static_cast<std::uint32_t>(m.rank);
      send_to(id, w);
    }
    formed = true;
    spdlog::info("control: job formed: {} ps, {} workers", shape.ps, shape.workers);
  }

  void barrier(const std::string& id, int group, std::uint64_t gen) {
    Member& m = members[id];
    {
      std::lock_guard lock(mutex);
      if (failure) return send_to(id, codec::Dead{"", *failure});
    }
    auto& gens = barriers[group];
    gens[gen].insert(id);
    if (gens.size() > 1) {
      m.dead = true;
      return fail(name_of(m), fmt::format("barrier generations disagree: at {}, the others at {}", gen,
                                          gens.begin()->first == gen ? gens.rbegin()->first : gens.begin()->first));
    }
    std::uint32_t expected = 0;
    for (auto& [oid, o] : members) expected += (group == static_cast<int>(BarrierGroup::kAll) || o.role == Role::kWorker);
    if (gens[gen].size() < expected) return;
    for (const auto& who : gens[gen]) send_to(who, codec::Release{group, gen});
    gens.erase(gen);
  }

  void maybe_finish() {
    for (auto& [id, m] : members)
      if (m.role == Role::kWorker && !m.left) return;
    {
      std::lock_guard lock(mutex);
      if (failure) return;  // the members heard that the job failed: no clean end
    }
    if (finished.exchange(true)) return;
    spdlog::info("control: every worker left; stopping the parameter servers");
    for (auto& [id, m] : members)
      if (m.role == Role::kPs && !m.dead) send_to(id, codec::Shutdown{});
  }
};

Coordinator::Coordinator(const std::string& endpoint, std::string token, JobShape shape, ControlTimeouts timeouts)
    : impl_(std::make_unique<Impl>()) {
  if (shape.ps == 0 || shape.workers == 0) throw ConfigError("a job needs at least one PS and one worker");
  impl_->token = std::move(token);
  impl_->shape = shape;
  impl_->timeouts = timeouts;
  impl_->router.set(zmq::sockopt::linger, 0);
  impl_->router.set(zmq::sockopt::router_mandatory, 0);
  // Larger frames close the peer's connection inside ZeroMQ, before any is buffered.
  impl_->router.set(zmq::sockopt::maxmsgsize, codec::kMaxToCoordinator);
  try {
    impl_->router.bind(endpoint);
  } catch (const zmq::error_t& e) {
    // ZeroMQ binds addresses and interfaces, not host names: a launcher's
    // tcp://host1:29600 binds host1's address, where the members connect by the name.
    const std::string by_address = resolved_endpoint(endpoint);
    if (by_address.empty() || by_address == endpoint) throw IoError("control: cannot bind coordinator at " + endpoint + ": " + e.what());
    try {
      impl_->router.bind(by_address);
    } catch (const zmq::error_t& e2) {
      throw IoError("control: cannot bind coordinator at " + endpoint + " (" + by_address + "): " + e2.what());
    }
  }
  impl_->bound = impl_->router.get(zmq::sockopt::last_endpoint);
  impl_->thread = std::thread([this] {
    name_this_thread("control-coord");
    impl_->loop();
  });
  spdlog::info("control: coordinator at {} expects {} ps and {} workers", impl_->bound, shape.ps, shape.workers);
}

Coordinator::~Coordinator() {
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string Coordinator::endpoint() const { return impl_->bound; }
bool Coordinator::wait_ps_left(std::chrono::milliseconds timeout) const {
  const auto until = Clock::now() + timeout;
  while (impl_->ps_left.load() < impl_->shape.ps) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::uint32_t Coordinator::ps_left() const { return impl_->ps_left.load(); }
std::uint32_t Coordinator::members_alive() const { return impl_->alive.load(); }
std::uint64_t Coordinator::refused() const { return impl_->refused.load(); }
bool Coordinator::finished() const { return impl_->finished.load(); }
std::optional<std::string> Coordinator::failure() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->failure;
}
void Coordinator::on_failure(std::function<void(const JobFailure&)> callback) {
  std::lock_guard lock(impl_->mutex);
  impl_->on_failure = std::move(callback);
}

// ---------------------------------------------------------------------------------------
// Member

struct ControlMember::Impl {
  MemberOptions options;
  zmq::context_t ctx{1};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  zmq::socket_t cmd_in{ctx, zmq::socket_type::pair};   // thread side
  zmq::socket_t cmd_out{ctx, zmq::socket_type::pair};  // API side, guarded by send_mutex
  std::mutex send_mutex;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> left{false};
  LogLimiter malformed_log;

  mutable std::mutex mutex;  // guards everything below
  std::condition_variable cv;
  bool welcomed = false;
  std::optional<std::string> refused;
  bool impostor = false;                           // the coordinator did not prove it knows the token
  const auth::Nonce nonce = auth::random_nonce();  // this member's, for the join
  bool joined = false;                             // the join went out (after the challenge)
  bool coordinator_proven = false;
  std::uint32_t rank = 0;
  JobShape shape;
  std::vector<Peer> peers;
  std::set<std::pair<int, std::uint64_t>> released;
  std::map<std::string, std::string> values;
  std::set<std::string> asked;  // keys try_lookup asked the coordinator for
  std::map<std::uint64_t, std::int64_t> added;
  std::uint64_t next_add = 0;
  std::optional<std::string> failure;
  bool shutdown = false;

  void post(const codec::ToCoordinator& m) {
    const std::string text = codec::encode(m);
    std::lock_guard lock(send_mutex);
    send_frame(cmd_out, text);
  }

  void loop() {
    auto last_heard = Clock::now();
    auto last_sent = Clock::now() - options.timeouts.heartbeat_interval;
    const auto tick = std::max(std::chrono::milliseconds(5), options.timeouts.heartbeat_interval / 3);
    const std::string heartbeat = codec::encode(codec::ToCoordinator{codec::Heartbeat{}});
    while (!stop.load()) {
      try {
        zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}, {cmd_in.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 2, tick);
        if (items[1].revents & ZMQ_POLLIN) {
          zmq::message_t m;
          while (cmd_in.recv(m, zmq::recv_flags::dontwait)) dealer.send(m, zmq::send_flags::dontwait);
        }
        if (items[0].revents & ZMQ_POLLIN) {
          zmq::message_t m;
          while (dealer.recv(m, zmq::recv_flags::dontwait)) {
            last_heard = Clock::now();
            handle(std::string_view(static_cast<const char*>(m.data()), m.size()));
          }
        }
        const auto now = Clock::now();
        if (now - last_sent >= options.timeouts.heartbeat_interval) {
          send_frame(dealer, heartbeat);
          last_sent = now;
        }
        std::lock_guard lock(mutex);
        if (welcomed && !failure && !shutdown && now - last_heard > options.timeouts.heartbeat_timeout) {
          failure = fmt::format("lost the coordinator at {}: nothing heard for {} ms", options.coordinator,
                                std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard).count());
          spdlog::error("control: {}", *failure);
          cv.notify_all();
        }
      } catch (const std::exception& e) {
        malformed_log.warn(std::string("control: member: ") + e.what());
      }
    }
    // Forward what the API posted last (a leave), so closing the socket delivers it.
    try {
      zmq::message_t m;
      while (cmd_in.recv(m, zmq::recv_flags::dontwait)) dealer.send(m, zmq::send_flags::dontwait);
    } catch (const std::exception&) {
    }
  }

  void handle(std::string_view text) {
    codec::FromCoordinator msg;
    try {
      msg = codec::decode_from_coordinator(text);
    } catch (const ProtocolError& e) {
      malformed_log.warn(std::string("control: dropped a malformed message from the coordinator: ") + e.what());
      return;
    }
    std::lock_guard lock(mutex);
    if (auto* c = std::get_if<codec::Challenge>(&msg)) {
      if (joined || welcomed) return;  // one join per member
      // Whatever the coordinator's proof, the join goes out: a member with a wrong token
      // is refused and logged by the coordinator (an impostor learns no token from a proof).
      coordinator_proven = auth::equal(c->proof, auth::proof(options.token, auth::kJoinCoordinator, c->nonce, nonce));
      const auto& o = options;
      const auth::Digest proof =
          auth::proof(o.token, auth::kJoinMember, c->nonce, nonce, codec::join_identity(o.role, o.rank, o.data_address));
      send_frame(dealer, codec::encode(codec::ToCoordinator{codec::Join{proof, o.role, o.rank, o.data_address}}));
      joined = true;
    } else if (auto* w = std::get_if<codec::Welcome>(&msg)) {
      if (welcomed) return;
      if (!coordinator_proven) {
        impostor = true;
        refused = "it did not prove it knows the job token";
        cv.notify_all();
        return;
      }
      rank = w->rank;
      shape = w->shape;
      peers = w->peers;
      std::sort(peers.begin(), peers.end(),
                [](const Peer& a, const Peer& b) { return std::pair(a.role, a.rank) < std::pair(b.role, b.rank); });
      welcomed = true;
    } else if (auto* r = std::get_if<codec::Refusal>(&msg)) {
      if (!welcomed)
        refused = r->why;
      else
        spdlog::warn("control: coordinator: {}", r->why);
    } else if (auto* rel = std::get_if<codec::Release>(&msg)) {
      released.emplace(rel->group, rel->gen);
    } else if (auto* v = std::get_if<codec::Value>(&msg)) {
      values[v->key] = v->value;
    } else if (auto* a = std::get_if<codec::Added>(&msg)) {
      added[a->id] = a->value;
    } else if (auto* d = std::get_if<codec::Dead>(&msg)) {
      if (!failure) failure = d->member.empty() ? d->why : d->member + ": " + d->why;
    } else if (std::holds_alternative<codec::Shutdown>(msg)) {
      shutdown = true;
    }
    cv.notify_all();
  }

  // Waits for pred under the lock; throws on failure or timeout.
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout, const std::string& what, Pred pred) {
    const bool ok = cv.wait_for(lock, timeout, [&] { return pred() || failure.has_value(); });
    if (pred()) return;
    if (failure) throw Error("control: " + what + " failed: " + *failure);
    if (!ok) throw IoError(fmt::format("control: {} timed out after {} ms (coordinator {})", what, timeout.count(), options.coordinator));
  }
};

ControlMember::ControlMember(MemberOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  auto& o = impl_->options;
  const std::string inproc = fmt::format("inproc://control-{}", static_cast<const void*>(impl_.get()));
  impl_->cmd_in.bind(inproc);
  impl_->cmd_out.connect(inproc);
  impl_->dealer.set(zmq::sockopt::linger, 500);
  impl_->dealer.set(zmq::sockopt::maxmsgsize, codec::kMaxFromCoordinator);
  try {
    impl_->dealer.connect(o.coordinator);
  } catch (const zmq::error_t& e) {
    throw ConfigError("control: bad coordinator address '" + o.coordinator + "': " + e.what());
  }
  // Joining: hello (this member's nonce), the coordinator's challenge, then the join
  // with the proof (handle()); the token itself is never sent.
  send_frame(impl_->dealer, codec::encode(codec::ToCoordinator{codec::Hello{impl_->nonce}}));
  impl_->thread = std::thread([this] {
    name_this_thread("control");
    impl_->loop();
  });
  std::unique_lock lock(impl_->mutex);
  const bool done = impl_->cv.wait_for(lock, o.timeouts.join_timeout, [&] { return impl_->welcomed || impl_->refused.has_value(); });
  if (impl_->refused || !done) {
    const std::string why = impl_->impostor  ? "control: coordinator " + o.coordinator + ": " + *impl_->refused
                            : impl_->refused ? "control: coordinator " + o.coordinator + " refused the join: " + *impl_->refused
                                             : fmt::format("control: the job did not form within {} ms (coordinator {})",
                                                           o.timeouts.join_timeout.count(), o.coordinator);
    lock.unlock();
    impl_->left = true;  // nothing to leave
    impl_->stop = true;
    impl_->thread.join();
    if (done) throw ProtocolError(why);
    throw IoError(why);
  }
}

ControlMember::~ControlMember() {
  try {
    // Gone without saying it finished (an exception on the way out): the job must not
    // take this for a clean end, and should not wait a heartbeat timeout to know. A PS
    // member told to stop has finished.
    if (shutdown_requested())
      leave();
    else
      abort("exited without leaving the job");
  } catch (...) {
  }
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint32_t ControlMember::rank() const { return impl_->rank; }
JobShape ControlMember::shape() const { return impl_->shape; }
const std::vector<Peer>& ControlMember::peers() const { return impl_->peers; }
std::vector<Peer> ControlMember::peers_of(Role role) const {
  std::vector<Peer> out;
  for (const auto& p : impl_->peers)
    if (p.role == role) out.push_back(p);
  return out;
}

void ControlMember::barrier(BarrierGroup group, std::uint64_t generation, std::chrono::milliseconds timeout) {
  const int g = static_cast<int>(group);
  impl_->post(codec::BarrierEnter{g, generation});
  std::unique_lock lock(impl_->mutex);
  impl_->wait(lock, timeout, fmt::format("barrier {}", generation), [&] { return impl_->released.count({g, generation}) > 0; });
  impl_->released.erase({g, generation});
}

void ControlMember::publish(const std::string& key, const std::string& value) { impl_->post(codec::Publish{key, value}); }

std::string ControlMember::lookup(const std::string& key, std::chrono::milliseconds timeout) {
  impl_->post(codec::Lookup{key});
  std::unique_lock lock(impl_->mutex);
  impl_->wait(lock, timeout, "lookup of '" + key + "'", [&] { return impl_->values.count(key) > 0; });
  return impl_->values[key];
}

std::optional<std::string> ControlMember::try_lookup(const std::string& key) {
  {
    std::lock_guard lock(impl_->mutex);
    if (auto v = impl_->values.find(key); v != impl_->values.end()) return v->second;
    if (!impl_->asked.insert(key).second) return std::nullopt;  // asked before: its value comes once published
  }
  impl_->post(codec::Lookup{key});
  return std::nullopt;
}

std::int64_t ControlMember::add(const std::string& key, std::int64_t delta, std::chrono::milliseconds timeout) {
  std::uint64_t id;
  {
    std::lock_guard lock(impl_->mutex);
    id = impl_->next_add++;
  }
  impl_->post(codec::Add{id, key, delta});
  std::unique_lock lock(impl_->mutex);
  impl_->wait(lock, timeout, "add to '" + key + "'", [&] { return impl_->added.count(id) > 0; });
  const std::int64_t value = impl_->added[id];
  impl_->added.erase(id);
  return value;
}

std::optional<std::string> ControlMember::failure() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->failure;
}

bool ControlMember::shutdown_requested() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->shutdown;
}

bool ControlMember::wait_shutdown(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mutex);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->shutdown || impl_->failure.has_value(); });
}

void ControlMember::leave() {
  if (impl_->left.exchange(true)) return;
  impl_->post(codec::Leave{});
}

void ControlMember::abort(const std::string& why, int exit_status) {
  if (impl_->left.exchange(true)) return;
  impl_->post(codec::Abort{why, exit_status});
}

void ControlMember::ending(const std::string& why) {
  if (impl_->left.exchange(true)) return;
  impl_->post(codec::Ending{why});
}

}  // namespace ember::transport
