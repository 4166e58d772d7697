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
#include "ember/serve/export.h"

namespace ember::serve {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

namespace {

constexpr int kMaxConnections = 64;
constexpr int kSocketTimeoutS = 30;

// One loaded version.
struct Version {
  std::int64_t iteration = -1;
  std::string source;
  double loaded_unix_s = 0;
  std::unique_ptr<ExportedModel> model;
  std::mutex scoring;  // the TorchScript module scores one request at a time
};

// The newest iteration with a checkpoint manifest under `root` (a launcher's dir: its
// ps/); -1 when none.
std::int64_t newest_checkpoint(const fs::path& root) {
  const fs::path ps = fs::is_directory(root / "ps") ? root / "ps" : root;
  std::int64_t best = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ps, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("iter-", 0) != 0 || !fs::exists(e.path() / "manifest.json", ec)) continue;
    try {
      best = std::max<std::int64_t>(best, std::stoll(name.substr(5)));
    } catch (const std::exception&) {
    }
  }
  return best;
}

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

class Server {
 public:
  explicit Server(const ServeOptions& o) : o_(o) {
    if (o_.checkpoints.empty()) throw ConfigError("--checkpoints is required (the job's --checkpoint-dir)");
    if (o_.dataset.empty() == o_.stream_format.empty())
      throw ConfigError("give --dataset (the model's prepared dataset) or --stream-format (a model trained on a stream)");
    work_ = o_.work_dir.empty() ? fs::temp_directory_path() / ("ember-serve-" + std::to_string(::getpid())) : o_.work_dir;
    fs::create_directories(work_);
  }
  ~Server() {
    if (o_.work_dir.empty()) {
      std::error_code ec;
      fs::remove_all(work_, ec);
    }
  }

  // Loads a newer version when the job has checkpointed one; errors (a checkpoint whose
  // dense state is not there yet) are logged and retried at the next poll.
  void follow(const std::atomic<bool>& stop) {
    while (!stop.load()) {
      try {
        if (newest_checkpoint(o_.checkpoints) > current_iteration()) load_newest();
      } catch (const std::exception& e) {
        if (e.what() != last_warning_) spdlog::warn("ember-serve: {} (retrying every {} ms)", e.what(), o_.poll_ms);
        last_warning_ = e.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(o_.poll_ms));
    }
  }

  std::shared_ptr<Version> current() {
    std::lock_guard lock(mutex_);
    return current_;
  }

  http::response<http::string_body> handle(const http::request<http::string_body>& req) {
    const std::string target(req.target());
    if (target == "/healthz") return reply(req, http::status::ok, "ok\n", "text/plain");
    const std::shared_ptr<Version> v = current();
    if (target == "/version" && req.method() == http::verb::get) {
      if (!v) return reply(req, http::status::service_unavailable, "{\"error\": \"no version loaded yet\"}\n", "application/json");
      const nlohmann::json j = {{"iteration", v->iteration}, {"loaded_unix_s", v->loaded_unix_s}, {"source", v->source}};
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
  std::int64_t current_iteration() {
    const std::shared_ptr<Version> v = current();
    return v ? v->iteration : -1;
  }

  void load_newest() {
    ExportOptions e;
    e.checkpoint = o_.checkpoints;
    e.dense = o_.dense;
    e.dataset = o_.dataset;
    e.stream_format = o_.stream_format;
    e.output = work_ / ("next-" + std::to_string(loads_++));
    e.overwrite = true;
    const ExportReport r = export_model(e);
    auto v = std::make_shared<Version>();
    v->iteration = r.iterations;
    v->source = r.source;
    if (v->iteration <= current_iteration()) {  // never back
      fs::remove_all(e.output);
      return;
    }
    v->model = std::make_unique<ExportedModel>(ExportedModel::load(e.output));
    v->loaded_unix_s = unix_now();
    std::shared_ptr<Version> old;
    {
      std::lock_guard lock(mutex_);
      old = std::exchange(current_, v);
    }
    spdlog::info("ember-serve: serving iteration {} ({})", v->iteration, v->source);
    if (old) old_exports_.push_back(old_output_);
    old_output_ = e.output;
    // The export before the one now served: its model is loaded in memory, the files go.
    while (old_exports_.size() > 1) {
      std::error_code ec;
      fs::remove_all(old_exports_.front(), ec);
      old_exports_.erase(old_exports_.begin());
    }
  }

  http::response<http::string_body> score(const http::request<http::string_body>& req, Version& v) {
    try {
      const data::SourceFormat format = o_.format.empty() ? v.model->source_format() : data::parse_source_format(o_.format);
      std::vector<float> p;
      {
        std::lock_guard lock(v.scoring);
        p = score_lines(*v.model, req.body(), format);
      }
      std::string text;
      text.reserve(p.size() * 12);
      char buf[32];
      for (const float x : p) text.append(buf, static_cast<std::size_t>(std::snprintf(buf, sizeof buf, "%.9g\n", static_cast<double>(x))));
      auto res = reply(req, http::status::ok, std::move(text), "text/plain");
      res.set("X-Ember-Iteration", std::to_string(v.iteration));
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
  fs::path work_;
  std::mutex mutex_;
  std::shared_ptr<Version> current_;
  std::uint64_t loads_ = 0;
  fs::path old_output_;
  std::vector<fs::path> old_exports_;
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
