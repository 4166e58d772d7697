// A Prometheus endpoint for a daemon (`--metrics-port`): http://ADDRESS:PORT/metrics in
// Prometheus's text format, served by prometheus-cpp on its own threads. Most values are
// read when Prometheus scrapes (the daemons keep their counters anyway, as atomics or a
// snapshot taken once per iteration), so the hot paths gain no work; histograms are
// observed as events happen.
//
// prometheus-cpp is optional at build time (Debian's prometheus-cpp-dev): without it,
// available() is false and constructing an Exporter throws ConfigError saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ember::monitor {

// Whether this build can serve metrics.
bool available();

using Labels = std::vector<std::pair<std::string, std::string>>;

// Receives a scrape's values. Samples of one name may come with different labels; a name
// is one kind (counter or gauge) with one help text.
class Sink {
 public:
  virtual ~Sink() = default;
  // Monotonic totals: NAME_total, in base units (seconds, bytes).
  virtual void counter(const std::string& name, const std::string& help, const Labels& labels, double value) = 0;
  virtual void gauge(const std::string& name, const std::string& help, const Labels& labels, double value) = 0;
};

// An observed distribution (prometheus-cpp's Histogram); safe from any thread.
class Histogram {
 public:
  void observe(double value);

 private:
  friend class Exporter;
  explicit Histogram(void* impl) : impl_(impl) {}
  void* impl_;  // a prometheus::Histogram the Exporter's registry owns
};

class Exporter {
 public:
  // Serves on address:port (port 0: a free one, see port()). ConfigError naming
  // `flag` when the address cannot be bound (the port in use) or the build has no
  // prometheus-cpp.
  Exporter(const std::string& address, std::uint16_t port, const std::string& flag = "--metrics-port");
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  std::uint16_t port() const;
  // http://ADDRESS:PORT/metrics (with 0.0.0.0 as given: what was bound).
  std::string url() const;

  // `fill` runs on an HTTP thread at every scrape, after any registered before it: it
  // must only read what is safe to read concurrently (atomics, a locked snapshot).
  void on_scrape(std::function<void(Sink&)> fill);
  // A histogram with these bucket upper bounds (seconds, bytes: base units); once per
  // name and labels.
  Histogram histogram(const std::string& name, const std::string& help, const std::vector<double>& buckets, const Labels& labels = {});

  // Bucket bounds start, start*factor, ... (count of them).
  static std::vector<double> exponential_buckets(double start, double factor, int count);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::monitor
