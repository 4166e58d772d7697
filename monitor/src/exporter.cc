#include "ember/monitor/exporter.h"

#include <cmath>
#include <mutex>

#include "ember/common/error.h"

#ifdef EMBER_HAVE_PROMETHEUS
#include <prometheus/check_names.h>
#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio.hpp>
#include <map>
#include <thread>
#endif

namespace ember::monitor {

std::vector<double> Exporter::exponential_buckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i) b.push_back(start * std::pow(factor, i));
  return b;
}

#ifdef EMBER_HAVE_PROMETHEUS

bool available() { return true; }

namespace {

// Groups a scrape's samples into one family per name, in the order names first appear.
class FamilySink : public Sink {
 public:
  void counter(const std::string& name, const std::string& help, const Labels& labels, double value) override {
    if (auto* m = add(name, help, prometheus::MetricType::Counter, labels)) m->counter.value = value;
  }
  void gauge(const std::string& name, const std::string& help, const Labels& labels, double value) override {
    if (auto* m = add(name, help, prometheus::MetricType::Gauge, labels)) m->gauge.value = value;
  }
  std::vector<prometheus::MetricFamily> take() { return std::move(families_); }

 private:
  prometheus::ClientMetric* add(const std::string& name, const std::string& help, prometheus::MetricType type, const Labels& labels) {
    auto [it, fresh] = index_.try_emplace(name, families_.size());
    if (fresh) {
      // A bad name is the program's mistake; skipping it keeps the endpoint valid.
      if (!prometheus::CheckMetricName(name)) {
        spdlog::error("metrics: '{}' is not a valid metric name (skipped)", name);
        index_.erase(it);
        return nullptr;
      }
      families_.push_back({name, help, type, {}});
    }
    auto& family = families_[it->second];
    if (family.type != type) return nullptr;
    auto& m = family.metric.emplace_back();
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    return &m;
  }
  std::vector<prometheus::MetricFamily> families_;
  std::map<std::string, std::size_t> index_;
};

class ScrapeCollectable : public prometheus::Collectable {
 public:
  void add(std::function<void(Sink&)> fill) {
    std::lock_guard<std::mutex> lock(mutex_);
    fills_.push_back(std::move(fill));
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    FamilySink sink;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& fill : fills_) {
      try {
        fill(sink);
      } catch (const std::exception& e) {  // one source failing leaves the others served
        spdlog::error("metrics: a scrape failed: {}", e.what());
      }
    }
    return sink.take();
  }

 private:
  mutable std::mutex mutex_;  // fills_ grows while being served; also serializes scrapes
  std::vector<std::function<void(Sink&)>> fills_;
};

// GET /metrics over HTTP/1.1, one connection at a time, on its own thread. Not civetweb
// (prometheus-cpp's Exposer): its threads get a fixed 100 KB stack, and a worker's
// libraries (LibTorch, glog, OpenBLAS) hold more static TLS than that, so they could not
// start (pthread_create: EINVAL).
class MetricsServer {
 public:
  MetricsServer(const std::string& address, std::uint16_t port, std::function<std::string()> body)
      : acceptor_(io_), body_(std::move(body)) {
    namespace ip = boost::asio::ip;
    const ip::tcp::endpoint at(ip::make_address(address), port);
    acceptor_.open(at.protocol());
    acceptor_.set_option(ip::tcp::acceptor::reuse_address(true));
    acceptor_.bind(at);
    acceptor_.listen();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~MetricsServer() {
    io_.stop();
    thread_.join();
  }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, boost::asio::ip::tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec) serve(socket);
      accept();
    });
  }
  // One request, answered and closed; a client silent for 2 s is dropped.
  void serve(boost::asio::ip::tcp::socket& socket) {
    try {
      const timeval limit{2, 0};
      ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
      ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      boost::asio::streambuf request(16 << 10);
      boost::asio::read_until(socket, request, "\r\n\r\n");
      std::istream in(&request);
      std::string method, target;
      in >> method >> target;
      const bool metrics = method == "GET" && (target == "/metrics" || target.rfind("/metrics?", 0) == 0);
      const std::string body = metrics ? body_() : "not found: try /metrics\n";
      const std::string head =
          std::string(metrics ? "HTTP/1.1 200 OK" : "HTTP/1.1 404 Not Found") +
          "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nConnection: close\r\n\r\n";
      boost::asio::write(socket, std::array{boost::asio::buffer(head), boost::asio::buffer(body)});
      socket.shutdown(boost::asio::ip::tcp::socket::shutdown_both);
    } catch (const std::exception& e) {  // a bad client: dropped, the others served
      spdlog::debug("metrics: a request failed: {}", e.what());
    }
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> body_;
  std::thread thread_;
};

}  // namespace

struct Exporter::Impl {
  std::string address;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<ScrapeCollectable> scrape = std::make_shared<ScrapeCollectable>();
  std::unique_ptr<MetricsServer> server;  // last: its thread stops before the rest goes

  std::string scrape_text() const {
    std::vector<prometheus::MetricFamily> families = registry->Collect();
    std::vector<prometheus::MetricFamily> more = scrape->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    return prometheus::TextSerializer().Serialize(families);
  }
};

Exporter::Exporter(const std::string& address, std::uint16_t port, const std::string& flag) : impl_(std::make_unique<Impl>()) {
  impl_->address = address;
  const std::string bind = (address.find(':') != std::string::npos ? "[" + address + "]" : address) + ":" + std::to_string(port);
  try {
    impl_->server = std::make_unique<MetricsServer>(address, port, [impl = impl_.get()] { return impl->scrape_text(); });
  } catch (const std::exception& e) {
    throw ConfigError(flag + " " + std::to_string(port) + ": cannot serve metrics on " + bind + " (the port in use?): " + e.what());
  }
}

Exporter::~Exporter() = default;

std::uint16_t Exporter::port() const { return impl_->server->port(); }

std::string Exporter::url() const {
  const std::string host = impl_->address.find(':') != std::string::npos ? "[" + impl_->address + "]" : impl_->address;
  return "http://" + host + ":" + std::to_string(port()) + "/metrics";
}

void Exporter::on_scrape(std::function<void(Sink&)> fill) { impl_->scrape->add(std::move(fill)); }

Histogram Exporter::histogram(const std::string& name, const std::string& help, const std::vector<double>& buckets, const Labels& labels) {
  auto& family = prometheus::BuildHistogram().Name(name).Help(help).Register(*impl_->registry);
  std::map<std::string, std::string> l(labels.begin(), labels.end());
  return Histogram(&family.Add(l, buckets));
}

void Histogram::observe(double value) { static_cast<prometheus::Histogram*>(impl_)->Observe(value); }

#else  // no prometheus-cpp

bool available() { return false; }

struct Exporter::Impl {};

Exporter::Exporter(const std::string&, std::uint16_t port, const std::string& flag) {
  throw ConfigError(flag + " " + std::to_string(port) +
                    ": this build has no Prometheus support (install prometheus-cpp-dev: scripts/install_deps.sh, then rebuild)");
}
Exporter::~Exporter() = default;
std::uint16_t Exporter::port() const { return 0; }
std::string Exporter::url() const { return {}; }
void Exporter::on_scrape(std::function<void(Sink&)>) {}
Histogram Exporter::histogram(const std::string&, const std::string&, const std::vector<double>&, const Labels&) {
  return Histogram(nullptr);
}
void Histogram::observe(double) {}

#endif

}  // namespace ember::monitor
