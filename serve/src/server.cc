#include "ember/serve/server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/process.h"
#include "ember/ps/checkpoints.h"
#include "ember/serve/export.h"
#include "live_model.h"

namespace ember::serve {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr int kMaxConnections = 64;
constexpr int kSocketTimeoutS = 30;

// The model served: replaced whole, or changed in place by deltas under `mutex`, which
// scoring holds too (the TorchScript module scores one request at a time).
struct Served {
  std::mutex mutex;
  std::unique_ptr<LiveModel> live;
  std::string source;
  double loaded_unix_s = 0;
  std::uint64_t deltas = 0, delta_rows = 0, delta_bytes = 0;  // applied since its whole load
  bool broken = false;                                        // a delta failed half applied: a whole load replaces it
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

class Server {
 public:
  explicit Server(const ServeOptions& o) : o_(o) {
    if (o_.checkpoints.empty()) throw ConfigError("--checkpoints is required (the job's --checkpoint-dir)");
    if (o_.dataset.empty() == o_.stream_format.empty())
      throw ConfigError("give --dataset (the model's prepared dataset) or --stream-format (a model trained on a stream)");
    if (o_.stream_multi_hot_sep.size() > 1 || (!o_.stream_multi_hot_sep.empty() && o_.stream_format.empty()))
      throw ConfigError("--stream-multi-hot-sep '" + o_.stream_multi_hot_sep + "': one character, with --stream-format");
  }

  // Takes the model to the newest checkpoint when the job has written a newer one;
  // errors (a checkpoint whose dense state is not there yet) are logged and retried at
  // the next poll.
  void follow(const std::atomic<bool>& stop) {
    while (!stop.load()) {
      try {
        refresh();
      } catch (const std::exception& e) {
        if (e.what() != last_warning_) spdlog::warn("ember-serve: {} (retrying every {} ms)", e.what(), o_.poll_ms);
        last_warning_ = e.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.poll_ms));
    }
  }

  std::shared_ptr<Served> current() {
    std::lock_guard lock(mutex_);
    return current_;
  }

  http::response<http::string_body> handle(const http::request<http::string_body>& req) {
    const std::string target(req.target());
    if (target == "/healthz") return reply(req, http::status::ok, "ok\n", "text/plain");
    const std::shared_ptr<Served> v = current();
    if (target == "/version" && req.method() == http::verb::get) {
      if (!v) return reply(req, http::status::service_unavailable, "{\"error\": \"no version loaded yet\"}\n", "application/json");
      std::lock_guard lock(v->mutex);
      const nlohmann::json j = {{"iteration", v->live->iteration()}, {"loaded_unix_s", v->loaded_unix_s}, {"source", v->source},
                                {"deltas_applied", v->deltas},       {"delta_rows", v->delta_rows},       {"delta_bytes", v->delta_bytes},
                                {"whole_loads", whole_loads_.load()}};
      return reply(req, http::status::ok, j.dump() + "\n", "application/json");
    }
    if (target == "/score" && req.method() == http::verb::post) {
      if (!v) return reply(req, http::status::service_unavailable, "no version loaded yet\n", "text/plain");
      return score(req, *v);
    }
    return reply(req, http::status::not_found, "GET /version, POST /score, GET /healthz\n", "text/plain");
  }

  std::uint64_t max_body() const { return o_.max_body_bytes; }

 private:
  // The checkpoints newer than the version served, each with a manifest (whole), oldest
  // first: applied as deltas when each one's deltas apply to the one before, else the
  // newest loaded whole.
  void refresh() {
    const std::shared_ptr<Served> held = current();
    const std::int64_t at = held ? held->live->iteration() : -2;
    std::vector<std::pair<std::int64_t, fs::path>> newer;
    // A launcher's directory has its ps/ once the job has begun.
    const fs::path ps_root = fs::is_directory(o_.checkpoints / "ps") ? o_.checkpoints / "ps" : o_.checkpoints;
    for (const auto& [it, dir] : ps::checkpoints_under(ps_root)) {
      std::error_code ec;
      if (it > at && fs::exists(dir / "manifest.json", ec)) newer.emplace_back(it, dir);
    }
    if (newer.empty()) return;
    std::reverse(newer.begin(), newer.end());
    if (held && !held->broken && apply_deltas(*held, newer)) return;
    load_whole();
  }

  bool apply_deltas(Served& held, const std::vector<std::pair<std::int64_t, fs::path>>& newer) {
    const Stopwatch took;
    std::vector<ModelUpdate> updates;
    std::int64_t after = held.live->held();
    std::vector<std::uint64_t> sums = held.live->held_sums();
    for (const auto& [it, dir] : newer) {
      std::optional<ModelUpdate> u = held.live->read_update(dir, it, after, sums);
      if (!u) return false;
      sums = u->sums;
      updates.push_back(std::move(*u));
      after = it;
    }
    held.live->read_dense(updates.back());  // the newest's dense weights serve
    std::uint64_t rows = 0, bytes = 0;
    for (const ModelUpdate& u : updates) rows += u.rows.size(), bytes += u.bytes;
    std::lock_guard lock(held.mutex);
    try {
      held.live->apply(updates);
    } catch (const std::exception& e) {
      held.broken = true;  // scoring answers 503 until the whole load
      spdlog::warn("ember-serve: {}: loading the newest checkpoint whole", e.what());
      return false;
    }
    held.deltas += updates.size();
    held.delta_rows += rows;
    held.delta_bytes += bytes;
    held.loaded_unix_s = unix_now();
    held.source = "deltas to iteration " + std::to_string(after) + " (" + updates.back().dense_file + ")";
    spdlog::info("ember-serve: serving iteration {}: {} delta(s), {} rows, {} bytes, applied in {:.3f} s", after, updates.size(), rows,
                 bytes, took.seconds());
    return true;
  }

  void load_whole() {
    const Stopwatch took;
    ExportOptions e;
    e.checkpoint = o_.checkpoints;
    e.dense = o_.dense;
    e.dataset = o_.dataset;
    e.stream_format = o_.stream_format;
    e.stream_multi_hot_sep = o_.stream_multi_hot_sep;
    auto v = std::make_shared<Served>();
    v->live = std::make_unique<LiveModel>(e);
    const std::shared_ptr<Served> held = current();
    if (held && !held->broken && v->live->iteration() <= held->live->iteration()) return;  // never back
    v->source = v->live->source();
    v->loaded_unix_s = unix_now();
    {
      std::lock_guard lock(mutex_);
      current_ = v;
    }
    ++whole_loads_;
    spdlog::info("ember-serve: serving iteration {} ({}), loaded whole in {:.3f} s", v->live->iteration(), v->source, took.seconds());
  }

  http::response<http::string_body> score(const http::request<http::string_body>& req, Served& v) {
    try {
      std::vector<float> p;
      std::int64_t iteration = 0;
      {
        std::lock_guard lock(v.mutex);
        if (v.broken) return reply(req, http::status::service_unavailable, "reloading the model\n", "text/plain");
        const ExportedModel& model = v.live->model();
        const data::SourceFormat format = o_.format.empty() ? model.source_format() : data::parse_source_format(o_.format);
        p = score_lines(model, req.body(), format);
        iteration = v.live->iteration();
      }
      std::string text;
      text.reserve(p.size() * 12);
      char buf[32];
      for (const float x : p) text.append(buf, static_cast<std::size_t>(std::snprintf(buf, sizeof buf, "%.9g\n", static_cast<double>(x))));
      auto res = reply(req, http::status::ok, std::move(text), "text/plain");
      res.set("X-Ember-Iteration", std::to_string(iteration));
      return res;
    } catch (const std::exception& e) {
      return reply(req, http::status::bad_request, std::string(e.what()) + "\n", "text/plain");
    }
  }

  static http::response<http::string_body> reply(const http::request<http::string_body>& req, http::status status, std::string body,
                                                 const char* type) {
    http::response<http::string_body> res{status, req.version()};
    res.set(http::field::server, "ember-serve");
    res.set(http::field::content_type, type);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    return res;
  }

  const ServeOptions& o_;
  std::mutex mutex_;
  std::shared_ptr<Served> current_;
  std::atomic<std::uint64_t> whole_loads_{0};
  std::string last_warning_;  // said once until another comes
};

// One connection's requests until it closes, errs or idles past the socket timeout; a
// bad peer loses its connection only.
void serve_connection(Server& server, tcp::socket socket) {
  boost::beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(server.max_body());
    boost::system::error_code ec;
    http::read(socket, buffer, parser, ec);
    if (ec == http::error::body_limit) {
      http::response<http::string_body> res{http::status::payload_too_large, 11};
      res.body() = "request body over --max-body-mb\n";
      res.prepare_payload();
      http::write(socket, res, ec);
      return;
    }
    if (ec) return;  // closed, timed out or not HTTP
    const http::response<http::string_body> res = server.handle(parser.get());
    http::write(socket, res, ec);
    if (ec || !res.keep_alive()) return;
  }
}

// The connections' threads: at most kMaxConnections at once (more are closed: the peer
// retries), finished ones joined as new ones come, all shut down and joined at the end.
class Connections {
 public:
  void start(Server& server, tcp::socket socket) {
    std::lock_guard lock(mutex_);
    reap();
    if (live_.size() >= kMaxConnections) return;
    auto c = std::make_unique<Live>();
    c->fd = socket.native_handle();
    Live* raw = c.get();
    c->thread = std::thread([&server, raw, s = std::move(socket)]() mutable {
      serve_connection(server, std::move(s));
      raw->done = true;
    });
    live_.push_back(std::move(c));
  }
  void close_all() {
    std::lock_guard lock(mutex_);
    for (auto& c : live_) {
      if (!c->done.load()) ::shutdown(c->fd, SHUT_RDWR);  // wakes its read
    }
    for (auto& c : live_) c->thread.join();
    live_.clear();
  }

 private:
  struct Live {
    std::thread thread;
    int fd = -1;
    std::atomic<bool> done{false};
  };
  void reap() {
    for (auto it = live_.begin(); it != live_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::mutex mutex_;
  std::vector<std::unique_ptr<Live>> live_;
};

}  // namespace

void serve_model(const ServeOptions& o, const std::atomic<bool>& stop) {
  Server server(o);
  boost::asio::io_context io;
  const std::size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos) throw ConfigError("--listen " + o.listen + ": expected HOST:PORT");
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(o.listen.substr(0, colon), ec);
  if (ec) throw ConfigError("--listen " + o.listen + ": " + ec.message());
  tcp::acceptor acceptor(io);
  const tcp::endpoint at(address, static_cast<std::uint16_t>(std::stoi(o.listen.substr(colon + 1))));
  acceptor.open(at.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(at, ec);
  if (ec) throw IoError("--listen " + o.listen + ": " + ec.message());
  acceptor.listen();
  const std::uint16_t port = acceptor.local_endpoint().port();
  spdlog::info("ember-serve: listening on {}:{}, following {}", at.address().to_string(), port, o.checkpoints.string());
  if (!o.port_file.empty()) write_file_atomic(o.port_file, std::to_string(port) + "\n");

  std::thread follower([&] { server.follow(stop); });
  Connections connections;
  while (!stop.load()) {
    pollfd p{acceptor.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    tcp::socket socket(io);
    acceptor.accept(socket, ec);
    if (ec) continue;
    const timeval tv{kSocketTimeoutS, 0};
    ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    connections.start(server, std::move(socket));
  }
  follower.join();
  connections.close_all();
}

}  // namespace ember::serve
