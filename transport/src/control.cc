#include "ember/transport/control.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "ember/common/error.h"
#include "ember/common/process.h"

namespace ember::transport {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* role_name(Role role) { return role == Role::kPs ? "ps" : "worker"; }

namespace {

Role parse_role(const std::string& s) {
  if (s == "ps") return Role::kPs;
  if (s == "worker") return Role::kWorker;
  throw ProtocolError("unknown role '" + s + "'");
}

void send_json(zmq::socket_t& socket, const json& j) {
  const std::string text = j.dump();
  socket.send(zmq::buffer(text), zmq::send_flags::dontwait);
}

void send_to(zmq::socket_t& router, const std::string& identity, const json& j) {
  const std::string text = j.dump();
  router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  router.send(zmq::buffer(text), zmq::send_flags::dontwait);
}

std::string peer_name(Role role, std::uint32_t rank) { return std::string(role_name(role)) + " " + std::to_string(rank); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Coordinator

struct Coordinator::Impl {
  struct Member {
    Role role;
    int rank;  // -1 until assigned
    std::string data;
    Clock::time_point last_seen;
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
  mutable std::mutex mutex;  // guards failure (read by other threads)
  std::optional<std::string> failure;

  // Owned by the thread.
  std::map<std::string, Member> members;  // by ZeroMQ identity
  bool formed = false;
  std::map<std::uint8_t, std::map<std::uint64_t, std::set<std::string>>> barriers;  // group -> gen -> arrived
  std::map<std::string, std::string> board;
  std::multimap<std::string, std::string> waiting_lookups;  // key -> identity

  void loop() {
    const auto tick = std::max(std::chrono::milliseconds(10), timeouts.heartbeat_interval / 2);
    while (!stop.load()) {
      zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, tick);
      if (items[0].revents & ZMQ_POLLIN) {
        zmq::message_t id, body;
        if (!router.recv(id, zmq::recv_flags::dontwait)) continue;
        if (!id.more() || !router.recv(body, zmq::recv_flags::dontwait)) continue;
        while (body.more()) {  // drop extra frames
          zmq::message_t extra;
          if (!router.recv(extra, zmq::recv_flags::dontwait)) break;
        }
        const char* addr = body.gets("Peer-Address");
        handle(id.to_string(), body.to_string(), addr ? addr : "?");
      }
      check_heartbeats();
    }
  }

  void fail(const std::string& why) {
    {
      std::lock_guard lock(mutex);
      if (failure) return;
      failure = why;
    }
    spdlog::error("control: job failed: {}", why);
    for (auto& [id, m] : members)
      if (!m.dead && !m.left) send_to(router, id, json{{"op", "dead"}, {"why", why}});
  }

  void check_heartbeats() {
    const auto now = Clock::now();
    for (auto& [id, m] : members) {
      if (m.dead || m.left) continue;
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - m.last_seen);
      if (silent > timeouts.heartbeat_timeout) {
        m.dead = true;
        fail(fmt::format("{} ({}): no heartbeat for {} ms", m.rank >= 0 ? peer_name(m.role, m.rank) : std::string(role_name(m.role)),
                         m.data.empty() ? "no data address" : m.data, silent.count()));
      }
    }
  }

  void refuse(const std::string& id, const std::string& peer, const std::string& why) {
    refused.fetch_add(1);
    spdlog::warn("control: refused join from {}: {}", peer, why);
    send_to(router, id, json{{"op", "error"}, {"why", why}});
  }

  void handle(const std::string& id, const std::string& text, const std::string& peer) {
    json msg;
    try {
      msg = json::parse(text);
      if (!msg.is_object() || !msg.contains("op")) throw ProtocolError("no op");
    } catch (const std::exception& e) {
      spdlog::warn("control: dropped malformed message from {}: {}", peer, e.what());
      return;
    }
    const std::string op = msg.value("op", "");
    auto it = members.find(id);
    if (op == "join") return join(id, msg, peer);
    if (it == members.end()) {  // not joined: only join is allowed
      if (op == "hb") return;   // a refused member's last heartbeat
      spdlog::warn("control: dropped '{}' from {} (not joined)", op, peer);
      send_to(router, id, json{{"op", "error"}, {"why", "not joined"}});
      return;
    }
    Member& m = it->second;
    m.last_seen = Clock::now();
    try {
      if (op == "hb") {
        send_to(router, id, json{{"op", "hb_ack"}});
      } else if (op == "barrier") {
        barrier(id, msg.at("group").get<int>(), msg.at("gen").get<std::uint64_t>());
      } else if (op == "publish") {
        const std::string key = msg.at("key");
        board[key] = msg.at("value").get<std::string>();
        auto [b, e] = waiting_lookups.equal_range(key);
        for (auto w = b; w != e; ++w) send_to(router, w->second, json{{"op", "value"}, {"key", key}, {"value", board[key]}});
        waiting_lookups.erase(b, e);
      } else if (op == "lookup") {
        const std::string key = msg.at("key");
        auto v = board.find(key);
        if (v != board.end())
          send_to(router, id, json{{"op", "value"}, {"key", key}, {"value", v->second}});
        else
          waiting_lookups.emplace(key, id);
      } else if (op == "leave") {
        if (!m.left && m.role == Role::kPs) ps_left.fetch_add(1);
        m.left = true;
        spdlog::info("control: {} left", peer_name(m.role, m.rank));
        maybe_finish();
      } else {
        spdlog::warn("control: unknown op '{}' from {}", op, peer_name(m.role, m.rank));
      }
    } catch (const json::exception& e) {
      spdlog::warn("control: malformed '{}' from {}: {}", op, peer_name(m.role, m.rank), e.what());
    }
  }

  void join(const std::string& id, const json& msg, const std::string& peer) {
    if (msg.value("token", std::string()) != token) return refuse(id, peer, "wrong job token");
    if (formed) return refuse(id, peer, "the job is already formed");
    Member m;
    try {
      m.role = parse_role(msg.at("role").get<std::string>());
      m.rank = msg.at("rank").get<int>();
      m.data = msg.value("data", std::string());
    } catch (const std::exception& e) {
      return refuse(id, peer, std::string("malformed join: ") + e.what());
    }
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
    json peers = json::array();
    for (auto& [id, m] : members) peers.push_back({{"role", role_name(m.role)}, {"rank", m.rank}, {"data", m.data}});
    for (auto& [id, m] : members)
      send_to(router, id, json{{"op", "welcome"}, {"rank", m.rank}, {"peers", peers}, {"ps", shape.ps}, {"workers", shape.workers}});
    formed = true;
    spdlog::info("control: job formed: {} ps, {} workers", shape.ps, shape.workers);
  }

  void barrier(const std::string& id, int group, std::uint64_t gen) {
    Member& m = members[id];
    {
      std::lock_guard lock(mutex);
      if (failure) return send_to(router, id, json{{"op", "dead"}, {"why", *failure}});
    }
    auto& gens = barriers[static_cast<std::uint8_t>(group)];
    gens[gen].insert(id);
    if (gens.size() > 1)
      return fail(fmt::format("barrier generations disagree: {} is at {}, others at {}", peer_name(m.role, m.rank), gen,
                              gens.begin()->first == gen ? gens.rbegin()->first : gens.begin()->first));
    std::uint32_t expected = 0;
    for (auto& [oid, o] : members) expected += (group == static_cast<int>(BarrierGroup::kAll) || o.role == Role::kWorker);
    if (gens[gen].size() < expected) return;
    for (const auto& who : gens[gen]) send_to(router, who, json{{"op", "release"}, {"group", group}, {"gen", gen}});
    gens.erase(gen);
  }

  void maybe_finish() {
    for (auto& [id, m] : members)
      if (m.role == Role::kWorker && !m.left) return;
    if (finished.exchange(true)) return;
    spdlog::info("control: every worker left; stopping the parameter servers");
    for (auto& [id, m] : members)
      if (m.role == Role::kPs && !m.dead) send_to(router, id, json{{"op", "shutdown"}});
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
  try {
    impl_->router.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw IoError("control: cannot bind coordinator at " + endpoint + ": " + e.what());
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
std::uint64_t Coordinator::refused() const { return impl_->refused.load(); }
bool Coordinator::finished() const { return impl_->finished.load(); }
std::optional<std::string> Coordinator::failure() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->failure;
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
  bool left = false;

  mutable std::mutex mutex;  // guards everything below
  std::condition_variable cv;
  bool welcomed = false;
  std::optional<std::string> refused;
  std::uint32_t rank = 0;
  JobShape shape;
  std::vector<Peer> peers;
  std::set<std::pair<int, std::uint64_t>> released;
  std::map<std::string, std::string> values;
  std::set<std::string> asked;  // keys try_lookup asked the coordinator for
  std::optional<std::string> failure;
  bool shutdown = false;

  void post(const json& j) {
    std::lock_guard lock(send_mutex);
    send_json(cmd_out, j);
  }

  void loop() {
    auto last_heard = Clock::now();
    auto last_sent = Clock::now() - options.timeouts.heartbeat_interval;
    const auto tick = std::max(std::chrono::milliseconds(5), options.timeouts.heartbeat_interval / 3);
    while (!stop.load()) {
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
          handle(m.to_string());
        }
      }
      const auto now = Clock::now();
      if (now - last_sent >= options.timeouts.heartbeat_interval) {
        send_json(dealer, json{{"op", "hb"}});
        last_sent = now;
      }
      std::lock_guard lock(mutex);
      if (welcomed && !failure && !shutdown && now - last_heard > options.timeouts.heartbeat_timeout) {
        failure = fmt::format("lost the coordinator at {}: nothing heard for {} ms", options.coordinator,
                              std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard).count());
        spdlog::error("control: {}", *failure);
        cv.notify_all();
      }
    }
    // Forward what the API posted last (a leave), so closing the socket delivers it.
    zmq::message_t m;
    while (cmd_in.recv(m, zmq::recv_flags::dontwait)) dealer.send(m, zmq::send_flags::dontwait);
  }

  void handle(const std::string& text) {
    json msg;
    try {
      msg = json::parse(text);
    } catch (const std::exception& e) {
      spdlog::warn("control: malformed message from the coordinator: {}", e.what());
      return;
    }
    const std::string op = msg.value("op", "");
    std::lock_guard lock(mutex);
    try {
      if (op == "welcome") {
        rank = msg.at("rank").get<std::uint32_t>();
        shape.ps = msg.at("ps").get<std::uint32_t>();
        shape.workers = msg.at("workers").get<std::uint32_t>();
        peers.clear();
        for (const auto& p : msg.at("peers"))
          peers.push_back(
              Peer{parse_role(p.at("role").get<std::string>()), p.at("rank").get<std::uint32_t>(), p.at("data").get<std::string>()});
        std::sort(peers.begin(), peers.end(),
                  [](const Peer& a, const Peer& b) { return std::pair(a.role, a.rank) < std::pair(b.role, b.rank); });
        welcomed = true;
      } else if (op == "error") {
        if (!welcomed)
          refused = msg.value("why", std::string("refused"));
        else
          spdlog::warn("control: coordinator: {}", msg.value("why", std::string()));
      } else if (op == "release") {
        released.emplace(msg.at("group").get<int>(), msg.at("gen").get<std::uint64_t>());
      } else if (op == "value") {
        values[msg.at("key").get<std::string>()] = msg.at("value").get<std::string>();
      } else if (op == "dead") {
        if (!failure) failure = msg.value("why", std::string("a peer died"));
      } else if (op == "shutdown") {
        shutdown = true;
      }
    } catch (const std::exception& e) {
      spdlog::warn("control: malformed '{}' from the coordinator: {}", op, e.what());
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
  try {
    impl_->dealer.connect(o.coordinator);
  } catch (const zmq::error_t& e) {
    throw ConfigError("control: bad coordinator address '" + o.coordinator + "': " + e.what());
  }
  send_json(impl_->dealer,
            json{{"op", "join"}, {"token", o.token}, {"role", role_name(o.role)}, {"rank", o.rank}, {"data", o.data_address}});
  impl_->thread = std::thread([this] {
    name_this_thread("control");
    impl_->loop();
  });
  std::unique_lock lock(impl_->mutex);
  const bool done = impl_->cv.wait_for(lock, o.timeouts.join_timeout, [&] { return impl_->welcomed || impl_->refused.has_value(); });
  if (impl_->refused || !done) {
    const std::string why = impl_->refused ? "control: coordinator " + o.coordinator + " refused the join: " + *impl_->refused
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
    leave();
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
  impl_->post(json{{"op", "barrier"}, {"group", g}, {"gen", generation}});
  std::unique_lock lock(impl_->mutex);
  impl_->wait(lock, timeout, fmt::format("barrier {}", generation), [&] { return impl_->released.count({g, generation}) > 0; });
  impl_->released.erase({g, generation});
}

void ControlMember::publish(const std::string& key, const std::string& value) {
  impl_->post(json{{"op", "publish"}, {"key", key}, {"value", value}});
}

std::string ControlMember::lookup(const std::string& key, std::chrono::milliseconds timeout) {
  impl_->post(json{{"op", "lookup"}, {"key", key}});
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
  impl_->post(json{{"op", "lookup"}, {"key", key}});
  return std::nullopt;
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
  if (impl_->left) return;
  impl_->left = true;
  impl_->post(json{{"op", "leave"}});
}

}  // namespace ember::transport
