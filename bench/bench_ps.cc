// ember-bench ps: pull and push throughput of a PS shard over TCP loopback for several
// row sizes and client threads, small-pull latency, and raw loopback TCP moving the same
// messages (plain blocking sockets, no processing; a pull's reply read from a table of
// the same size at the same rows; a push, its ack, a commit and its ack) in the same run,
// the two alternating. Also the shard's store alone (no sockets) per row, next to memcpy.
#include "bench_ps.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <thread>
#include <unordered_set>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/common/error.h"
#include "ember/common/hash.h"
#include "ember/common/huge_pages.h"
#include "ember/common/process.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/ps_service.h"
#include "ember/transport/transport.h"

namespace ember::bench {

void add_ps_options(CLI::App& app, PsBenchOptions& o) {
  using O = PsBenchOptions;
  const std::vector<OptionDecl<O>> decls = {
      bench_flag("--seconds", &O::seconds, "seconds per run").checked(CLI::Range(0.001, 3600.0)),
      bench_flag("--repeats", &O::repeats, "runs per case, PS and raw alternating (medians reported)").checked(CLI::Range(1, 1000)),
      bench_flag("--rows", &O::rows_per_request, "rows per request"),
      bench_flag("--num-keys", &O::num_keys, "rows of the shard"),
      list_flag("--dims", &O::dims, "embedding dimensions"),
      list_flag("--threads", &O::threads, "client thread counts"),
      list_flag("--ops", &O::ops, "pull, push"),
      bench_flag("--connections", &O::connections, "connections per client thread to the shard"),
      bench_flag("--optimizer", &O::optimizer, "the shard's optimizer: sgd, adagrad, rowwise-adagrad, adam"),
      bench_flag("--keys", &O::keys,
                 "a request's keys: consecutive, or scattered (distinct random keys of the thread's range, as a worker's)")
          .checked(CLI::IsMember({"consecutive", "scattered"})),
      bench_flag("--apply-commits", &O::apply_commits,
                 "where the shard applies a commit: handler (each row on the thread that received it, after its next ack), applier "
                 "(--apply-threads threads of their own), or auto (as ember-ps: the applier for rows of 1 KB and up when the shard's "
                 "threads take at most half the cores)")
          .checked(CLI::IsMember({"auto", "handler", "applier"})),
      bench_flag("--serve", &O::serve,
                 "store: pushes and commits served by the shard; ack: acknowledged unread (the transport alone: what the shard's row "
                 "work costs on top of it; pulls are served either way)")
          .checked(CLI::IsMember({"store", "ack"})),
      bench_flag("--io-threads", &O::io_threads, "the shard's TCP I/O threads").checked(CLI::Range(1, 256)),
      bench_flag("--apply-threads", &O::apply_threads, "the shard's applier threads (0: as many as --io-threads)")
          .checked(CLI::Range(0u, 256u)),
      bench_flag("--socket-buffer-kib", &O::socket_buffer_kib, "TCP buffers of the PS path in KiB (0: kernel autotuning)")
          .checked(CLI::Range(0u, 1u << 21)),
      bench_flag("--server-cpus", &O::server_cpus,
                 "CPUs for the server side (the shard's threads, the raw server, the store-alone loop), e.g. 1 or 8-15; with "
                 "--client-cpus"),
      bench_flag("--client-cpus", &O::client_cpus, "CPUs for the client threads (PS and raw), e.g. 0 or 0-7; with --server-cpus"),
      bench_flag("--hashed-ids", &O::hashed_ids, "a shard of dynamic tables: each slot keeps its id (ember-ps on a hashed dataset)"),
      bench_flag("--reset-share", &O::reset_share,
                 "with --hashed-ids: the share of each push's rows first reset for a new id at its commit (rows made as ids keep coming)")
          .checked(CLI::Range(0.0, 1.0)),
  };
  add_options(app, decls, o, kBenchProgram);
}

namespace {

const std::string kToken = "bench";

bool io_all(int fd, void* buf, std::size_t n, bool write) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = write ? ::write(fd, p, n) : ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// A request's first key: each client thread its own range of the table, distinct keys
// per request (a row gets one gradient per iteration from one worker).
Key first_key(std::mt19937_64& rng, int t, int threads, std::uint64_t num_keys, std::uint32_t n) {
  const std::uint64_t range = num_keys / static_cast<std::uint64_t>(threads);
  return static_cast<Key>(t) * range + rng() % (range - n);
}

// With --keys scattered: sets of n distinct random keys of thread t's range, made before
// timing and used in turn (by the PS runs and the raw ones alike).
std::vector<std::vector<Key>> scattered_sets(int t, int threads, std::uint64_t num_keys, std::uint32_t n) {
  const std::uint64_t range = num_keys / static_cast<std::uint64_t>(threads);
  std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 101);
  std::vector<std::vector<Key>> sets(16);
  for (auto& set : sets) {
    std::unordered_set<Key> seen;
    while (set.size() < n) {
      const Key k = static_cast<Key>(t) * range + rng() % range;
      if (seen.insert(k).second) set.push_back(k);
    }
  }
  return sets;
}

// One message exchange of an op: `in` bytes to the server, `out` bytes back.
struct Exchange {
  std::size_t in, out;
};

// The largest request and reply of an op (the request at least its 8-byte offset): the
// buffers either end needs.
Exchange largest(const std::vector<Exchange>& op) {
  Exchange m{8, 0};
  for (const Exchange& e : op) m = {std::max(m.in, e.in), std::max(m.out, e.out)};
  return m;
}

// A plain-socket server: per connection, the exchanges of one op in turn, repeated. A
// reply longer than a header comes from `table` at the offset the request's first 8 bytes
// give, so the raw path reads the same (cold or warm) memory as the PS serving those rows;
// with `row_bytes` set (scattered keys), the request starts with the rows' keys and the
// reply gathers each row from its place.
class RawServer {
 public:
  RawServer(std::vector<Exchange> op, const std::vector<char>& table, std::size_t row_bytes = 0)
      : op_(std::move(op)), table_(table), row_bytes_(row_bytes) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) throw IoError("raw server: bind/listen");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] {
      while (true) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        workers_.emplace_back([this, c] {
          name_this_thread("raw-server");
          std::vector<char> ib(largest(op_).in);
          for (bool open = true; open;) {
            for (const Exchange& e : op_) {
              if (!io_all(c, ib.data(), e.in, false)) {
                open = false;
                break;
              }
              if (row_bytes_ > 0 && e.out > transport::kHeaderBytes) {
                if (!gather_reply(c, ib.data(), e.out)) {
                  open = false;
                  break;
                }
                continue;
              }
              std::uint64_t offset = 0;
              std::memcpy(&offset, ib.data(), 8);
              if (offset + e.out > table_.size()) offset = 0;
              if (!io_all(c, const_cast<char*>(table_.data() + offset), e.out, true)) {
                open = false;
                break;
              }
            }
          }
          ::close(c);
        });
      }
    });
  }
  ~RawServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accept_.join();
    for (auto& t : workers_) t.join();
  }
  std::uint16_t port() const { return port_; }

 private:
  // A header's worth of bytes, then the row of each key the request starts with, copied
  // into one buffer and written at once (a piece per 256 B row costs the kernel more than
  // the copy: the PS does the same for scattered rows).
  bool gather_reply(int c, const char* request, std::size_t out) {
    const std::size_t rows = (out - transport::kHeaderBytes) / row_bytes_;
    gathered_.resize(out);
    for (std::size_t i = 0; i < rows; ++i) {
      Key k = 0;
      std::memcpy(&k, request + 8 * i, 8);
      if ((k + 1) * row_bytes_ > table_.size()) k = 0;
      std::memcpy(gathered_.data() + transport::kHeaderBytes + i * row_bytes_, table_.data() + k * row_bytes_, row_bytes_);
    }
    return io_all(c, gathered_.data(), out, true);
  }

  std::vector<Exchange> op_;
  const std::vector<char>& table_;
  std::size_t row_bytes_ = 0;
  thread_local static std::vector<char> gathered_;  // per connection thread
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread accept_;
  std::vector<std::thread> workers_;
};

thread_local std::vector<char> RawServer::gathered_;

// Ops per second of `threads` raw clients each doing the exchanges of `op` in turn, the
// replies read from `table` at the rows the first request names.
double raw_rate(const std::vector<Exchange>& op, int threads, double seconds, const std::vector<char>& table, std::uint64_t num_keys,
                std::uint32_t n, std::size_t row_bytes, bool scattered, const std::vector<int>& client_cpus) {
  RawServer server(op, table, scattered ? row_bytes : 0);
  std::atomic<std::uint64_t> total{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      name_this_thread("raw-client-" + std::to_string(t));
      if (!client_cpus.empty()) pin_this_thread(client_cpus);
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(server.port());
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      const Exchange most = largest(op);
      std::vector<char> ib(std::max<std::size_t>(most.in, 8ull * n), 1), ob(most.out);
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
      const auto sets = scattered ? scattered_sets(t, threads, num_keys, n) : std::vector<std::vector<Key>>{};
      std::uint64_t done = 0;
      Stopwatch sw;
      bool open = true;
      while (open && sw.seconds() < seconds) {
        for (std::size_t x = 0; x < op.size(); ++x) {
          if (scattered) {
            if (x == 0) std::memcpy(ib.data(), sets[done % sets.size()].data(), 8ull * n);  // the keys, as the PS request carries them
          } else {
            const std::uint64_t offset = x == 0 ? first_key(rng, t, threads, num_keys, n) * row_bytes : table.size();  // later: no rows
            std::memcpy(ib.data(), &offset, 8);
          }
          if (!io_all(fd, ib.data(), op[x].in, true) || !io_all(fd, ob.data(), op[x].out, false)) {
            open = false;
            break;
          }
        }
        done += open;
      }
      total += done;
      ::close(fd);
    });
  }
  for (auto& t : ts) t.join();
  return static_cast<double>(total) / seconds;
}

// A row's update and nothing else: plain SGD on rows of `table` (dim floats each) at
// `keys`, with gradients[i * dim]. No claim, no list, no state: what any PS that updates
// a pushed row in memory pays at least. Rows are fetched ahead as the store's apply
// fetches them (the same distance): without that, scattered rows cost this loop more
// than the whole store, and the "ideal" read below the measured ratio.
void plain_sgd(float* __restrict table, std::span<const Key> keys, const float* __restrict grads, std::uint32_t dim) {
  const std::size_t row_bytes = dim * sizeof(float), ahead = ps::ShardStore::rows_to_fetch_ahead(row_bytes);
  auto prefetch = [&](Key k) {
    const char* p = reinterpret_cast<const char*>(table + k * dim);
    for (std::size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o, 1);
  };
  for (std::size_t i = 0; i < std::min(ahead, keys.size()); ++i) prefetch(keys[i]);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i + ahead < keys.size()) prefetch(keys[i + ahead]);
    float* __restrict w = table + keys[i] * dim;
    const float* __restrict g = grads + i * dim;
    for (std::uint32_t j = 0; j < dim; ++j) w[j] -= 0.01f * g[j];
  }
}

// Rejects --rows, --ops and --threads a run cannot use.
void check_ps_options(const PsBenchOptions& o) {
  const std::uint32_t n = o.rows_per_request;
  if (n == 0 || n * 2ull > o.num_keys) throw ConfigError("--rows must be positive and at most half of --num-keys");
  if (o.reset_share > 0 && !o.hashed_ids) throw ConfigError("--reset-share goes with --hashed-ids");
  for (const std::string& op : o.ops) {
    if (op != "pull" && op != "push") throw ConfigError("--ops: unknown op '" + op + "' (pull, push)");
  }
  for (int t : o.threads) {
    if (t < 1 || n * static_cast<std::uint64_t>(t) * 2 > o.num_keys)
      throw ConfigError("--threads: each thread needs 2 x --rows keys of its own");
  }
}

// The run's settings line and the table's header.
void print_ps_header(const Output& out, const PsBenchOptions& o, std::uint32_t apply_threads) {
  out.text(
      fmt::format("medians of {} runs of {} s each, PS and raw alternating; {} rows per request, {} keys; optimizer {}; shard: {} I/O "
                  "thread(s), {} applier thread(s), commits applied: {}; {} connection(s) per client thread{}\n",
                  o.repeats, o.seconds, o.rows_per_request, o.keys, o.optimizer, o.io_threads, apply_threads, o.apply_commits,
                  o.connections, o.serve == "ack" ? "; pushes and commits acknowledged unread (--serve ack: the transport alone)" : ""));
  out.text(fmt::format("{:<6}{:>5}{:>8}{:>14}{:>10}{:>12}{:>9}{:>15}{:>18}{:>10}{:>8}\n", "op", "dim", "threads", "rows/s", "GB/s",
                       "raw GB/s", "ratio", "ratio range", "CPU ns/row PS|raw", "ceiling", "ideal"));
}

// The store-alone loop's requests: n keys, consecutive from a random first one or a
// set of scattered ones, and the CPU time per row its last measure took.
struct RowLoop {
  std::uint32_t n;
  std::uint64_t num_keys;
  double seconds;  // per measure
  std::mt19937_64 rng{99};
  std::vector<Key> keys = std::vector<Key>(n);
  // Also with scattered rows, as a worker's are (consecutive keys let the hardware
  // prefetcher hide every miss): sets of distinct random keys made before timing.
  std::vector<std::vector<Key>> scattered_keys = scattered_sets(0, 1, num_keys, n);
  double cpu_ns = 0;

  // Wall time per row, and CPU time per row of the whole process.
  template <typename Step>
  double ns_per_row(Step&& step, bool scatter) {
    std::uint64_t rows = 0;
    const double c0 = process_cpu_seconds();
    Stopwatch sw;
    for (std::size_t r = 0; sw.seconds() < seconds; ++r) {
      if (scatter) {
        keys = scattered_keys[r % scattered_keys.size()];
      } else {
        const Key base = first_key(rng, 0, 1, num_keys, n);
        for (std::uint32_t i = 0; i < n; ++i) keys[i] = base + i;
      }
      step();
      rows += n;
    }
    const double wall = sw.seconds();
    cpu_ns = (process_cpu_seconds() - c0) * 1e9 / static_cast<double>(rows);
    return wall * 1e9 / static_cast<double>(rows);
  }
};

// What the store alone costs per row (ns), measured before a dim's cases and printed
// after them.
struct StoreAlone {
  double push_ns = 0, consecutive_cpu_ns = 0, push_scattered_ns = 0, scattered_cpu_ns = 0;
  double pull_ns = 0, pull_scattered_ns = 0, copy_ns = 0;
  double store_push_cpu_ns = 0;                           // the store's own CPU per row pushed and committed
  double update_cpu_ns = 0, update_scattered_cpu_ns = 0;  // a row's update alone (plain_sgd)
};

// A dim's shard, as its cases use it.
struct Shard {
  std::uint32_t dim;
  const transport::Transport& data_plane;
  std::uint16_t port;
  const std::vector<char>& table;  // the raw baseline's replies come from a table of the same size
  const StoreAlone& alone;
  const std::string& applied_by;
};

// A case's medians over the repeats, and its ceilings (0: none).
struct CaseResult {
  double rps, gb, raw_gb, ratio, lo, hi, cpu, rcpu, ceiling, ideal;
};

// A run's settings, as every dim and case of it uses them.
struct PsBench {
  const PsBenchOptions& o;
  const Output& out;
  std::uint32_t n;  // rows per request
  ps::OptimizerKind optimizer;
  bool scattered;
  std::vector<int> client_cpus;
  bool pinned;
  std::uint32_t apply_threads;
  bool ack_only;

  // Every case of one dim on a shard of its own, then the store alone and small pulls.
  void run_dim(std::uint32_t dim) const {
    ps::StoreConfig sc;
    sc.num_keys = o.num_keys;
    sc.dim = dim;
    sc.optimizer.kind = optimizer;
    sc.apply_threads = apply_threads;
    sc.hashed_ids = o.hashed_ids;
    ps::PsService service(sc);
    const ps::CommitApplyChoice choice = ps::choose_commit_apply(o.apply_commits, service.store().row_floats() * 4,
                                                                 static_cast<std::uint32_t>(o.io_threads), apply_threads, usable_cpus());
    const bool applier = choice.where == ps::CommitApply::kApplier;
    const std::string applied_by = applier ? "applier" : "handler";
    service.apply_commits_on(choice.where);
    if (o.apply_commits == "auto") out.text(fmt::format("dim {}: commits applied by the {} ({})\n", dim, applied_by, choice.why));
    // Loopback TCP, the shard's side and the clients' alike.
    transport::TransportOptions to;
    to.token = kToken;
    to.io_threads = o.io_threads;
    to.socket_buffer_bytes = o.socket_buffer_kib << 10;
    const transport::Transport data_plane(std::move(to));
    const auto server = data_plane.make_server(transport::ServerHandler(
        [&](const transport::Message& r, transport::OutMessage& m, transport::Scratch& s) {
          if (ack_only && (r.header.type == transport::MessageType::kPushGrad || r.header.type == transport::MessageType::kCommit)) {
            m.header.type = transport::MessageType::kAck;  // the payload read in, never looked at
            return;
          }
          service.handle(r, m, s);
        },
        [&] { service.after_reply(); }));
    {
      // Initialize every row first: the timed runs measure serving, not first touches.
      std::vector<float> tmp(dim);
      for (Key k = 0; k < o.num_keys; ++k) service.store().pull({&k, 1}, tmp.data());
    }
    // The raw baseline's replies come from a table of the same size.
    std::vector<char> table(o.num_keys * dim * 4ull, 1);
    const StoreAlone alone = store_alone(service.store(), dim, applier);
    const Shard shard{dim, data_plane, server->port(), table, alone, applied_by};
    for (const std::string& op : o.ops) {
      for (int threads : o.threads) print_case(shard, op, threads, measure_case(shard, op, threads));
    }
    print_store_alone(dim, applied_by, alone);
    if (dim == 16) small_pull_latency(server->port(), dim);
  }

  // The store alone, no sockets, one thread: what serving a row costs in the PS itself,
  // next to a plain copy of the same bytes (the floor a loopback byte costs). Measured
  // first, so that the push cases can show what it leaves them (their ceiling, below);
  // printed after them.
  StoreAlone store_alone(ps::ShardStore& store, std::uint32_t dim, bool applier) const {
    RowLoop loop{n, o.num_keys, o.seconds / 4};
    std::vector<std::uint32_t> trainers(n, 1);
    std::vector<float> grads(static_cast<std::size_t>(n) * dim, 0.001f), dst(grads.size());
    std::uint64_t it = 1u << 30;  // apart from the client runs' iterations
    // Gradients kept where they are until applied, as the PS keeps a TCP request's (the
    // buffer outlives every apply here: the owner owns nothing).
    const std::shared_ptr<const void> lent(std::shared_ptr<const void>{}, grads.data());
    auto push = [&] {
      store.push_grad(it, loop.keys, trainers, grads.data(), lent);
      if (applier) {
        store.commit();  // handed to the applier, waited for
      } else {
        store.commit_deferred();  // as the PS applies a commit: on the thread that received the rows
        store.apply_deferred_here();
      }
      ++it;
    };
    auto pull = [&] { store.pull(loop.keys, dst.data()); };
    StoreAlone a;
    a.push_ns = loop.ns_per_row(push, false);
    a.consecutive_cpu_ns = loop.cpu_ns;
    a.push_scattered_ns = loop.ns_per_row(push, true);
    a.scattered_cpu_ns = loop.cpu_ns;
    a.store_push_cpu_ns = scattered ? a.scattered_cpu_ns : a.consecutive_cpu_ns;  // with the cases' keys
    a.pull_ns = loop.ns_per_row(pull, false);
    a.pull_scattered_ns = loop.ns_per_row(pull, true);
    a.copy_ns = loop.ns_per_row([&] { std::memcpy(dst.data(), grads.data(), grads.size() * sizeof(float)); }, false);
    {
      // The update alone, on a table of the store's size (huge pages, as the store's).
      const std::size_t bytes = o.num_keys * dim * sizeof(float);
      std::unique_ptr<float, std::function<void(float*)>> plain(static_cast<float*>(huge_alloc(bytes)),
                                                                [bytes](float* p) { huge_free(p, bytes); });
      std::fill_n(plain.get(), o.num_keys * dim, 1.0f);
      auto update = [&] { plain_sgd(plain.get(), loop.keys, grads.data(), dim); };
      loop.ns_per_row(update, false);
      a.update_cpu_ns = loop.cpu_ns;
      loop.ns_per_row(update, true);
      a.update_scattered_cpu_ns = loop.cpu_ns;
    }
    return a;
  }

  // The store-alone line, or its JSON row.
  void print_store_alone(std::uint32_t dim, const std::string& applied_by, const StoreAlone& a) const {
    out.text(
        fmt::format("store alone, dim {}: push + commit {:.1f} ns/row ({:.1f} of CPU; {:.1f} scattered, {:.1f} of CPU), pull {:.1f} "
                    "ns/row ({:.1f} scattered), memcpy of a row {:.1f} ns; a row's update alone (plain SGD, a table of "
                    "the same size) {:.1f} ns of CPU ({:.1f} scattered)\n",
                    dim, a.push_ns, a.consecutive_cpu_ns, a.push_scattered_ns, a.scattered_cpu_ns, a.pull_ns, a.pull_scattered_ns,
                    a.copy_ns, a.update_cpu_ns, a.update_scattered_cpu_ns));
    out.row({{"bench", "ps"},
             {"op", "store"},
             {"dim", dim},
             {"push_commit_ns_per_row", a.push_ns},
             {"push_commit_cpu_ns_per_row", a.consecutive_cpu_ns},
             {"push_commit_scattered_ns_per_row", a.push_scattered_ns},
             {"push_commit_scattered_cpu_ns_per_row", a.scattered_cpu_ns},
             {"pull_ns_per_row", a.pull_ns},
             {"pull_scattered_ns_per_row", a.pull_scattered_ns},
             {"memcpy_ns_per_row", a.copy_ns},
             {"update_alone_cpu_ns_per_row", a.update_cpu_ns},
             {"update_alone_scattered_cpu_ns_per_row", a.update_scattered_cpu_ns},
             {"optimizer", o.optimizer},
             {"apply_commits", applied_by}});
  }

  // Rows one PsClient thread (t of `threads`) moves in --seconds, on its own range of keys.
  std::uint64_t client_rows(const Shard& shard, const std::string& op, int threads, int t) const {
    name_this_thread("ps-client-" + std::to_string(t));
    if (!client_cpus.empty()) pin_this_thread(client_cpus);
    ps::PsClient c({{"127.0.0.1", shard.port}}, shard.dim, 0, shard.data_plane.make_connector(), o.connections);
    std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
    const auto sets = scattered ? scattered_sets(t, threads, o.num_keys, n) : std::vector<std::vector<Key>>{};
    std::vector<Key> keys(n);
    std::vector<std::uint32_t> trainers(n, 1);
    std::vector<float> buf(static_cast<std::size_t>(n) * shard.dim, 0.001f);
    std::uint64_t done = 0, iteration = 0;
    const auto resets = static_cast<std::size_t>(o.reset_share * n);
    std::vector<Key> reset_slots(resets);
    std::vector<std::uint64_t> new_ids(resets);
    Stopwatch sw;
    while (sw.seconds() < o.seconds) {
      if (scattered) {
        keys = sets[(done / n) % sets.size()];
      } else {
        Key base = first_key(rng, t, threads, o.num_keys, n);
        for (std::uint32_t i = 0; i < n; ++i) keys[i] = base + i;
      }
      if (op == "pull") {
        c.pull(keys, buf, false, 0, ps::PsClient::Dedup::kNo);  // distinct, as a worker's misses
      } else {
        // The resets go out with the push, acknowledged before the commit (as a worker's
        // before its barrier); their slots are rows of this thread's range that the push
        // does not hold (the n after its keys, wrapped: a made row has no update pending).
        ps::PsFuture reset;
        if (resets > 0) {
          const std::uint64_t range = o.num_keys / static_cast<std::uint64_t>(threads), first = static_cast<std::uint64_t>(t) * range;
          for (std::size_t i = 0; i < resets; ++i) reset_slots[i] = first + (keys[i] - first + n) % range;
          for (std::size_t i = 0; i < resets; ++i) new_ids[i] = mix64(keys[i] ^ (iteration << 32) ^ static_cast<std::uint64_t>(t));
          reset = c.start_reset_rows(iteration, reset_slots, new_ids);
        }
        c.push_grad(iteration, keys, trainers, buf);  // then committed: each row applied once
        if (reset.valid()) reset.wait();
        c.commit(iteration++);
      }
      done += n;
    }
    return done;
  }

  // Rows per second of `threads` PsClients, each on its own range of keys.
  double ps_rate(const Shard& shard, const std::string& op, int threads) const {
    std::atomic<std::uint64_t> rows{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { rows += client_rows(shard, op, threads, t); });
    for (auto& th : ts) th.join();
    return static_cast<double>(rows) / o.seconds;
  }

  // One case (op, threads): PS and raw runs alternating, their medians and ceilings.
  CaseResult measure_case(const Shard& shard, const std::string& op, int threads) const {
    const std::uint32_t dim = shard.dim;
    const double bytes_per_row = 4.0 * dim;
    // Raw: the same messages on plain sockets. A pull is a request (keys) and its reply
    // (rows); a push is the push (keys, trainer counts, gradients) and its ack, then the
    // commit and its ack.
    const std::size_t H = transport::kHeaderBytes;
    const std::vector<Exchange> raw_op = op == "pull" ? std::vector<Exchange>{{H + 8ull * n, H + 4ull * n * dim}}
                                                      : std::vector<Exchange>{{H + 16ull * n + 4ull * n * dim, H}, {H, H}};
    // Alternate PS and raw runs, so that both see the same spells of a noisy host, and
    // report medians (the ratio: the median of each PS run over the raw run beside it).
    // Also the CPU time (client, server and kernel: one process) per row moved, which
    // bounds throughput once the cores are busy and varies less than the rate does.
    std::vector<double> ps_rows, raw_gbs, ratios, ps_cpu, raw_cpu;
    for (int r = 0; r < o.repeats; ++r) {
      const double c0 = process_cpu_seconds();
      ps_rows.push_back(ps_rate(shard, op, threads));
      const double c1 = process_cpu_seconds();
      const double raw_rows = raw_rate(raw_op, threads, o.seconds, shard.table, o.num_keys, n, dim * 4ull, scattered, client_cpus) * n;
      const double c2 = process_cpu_seconds();
      raw_gbs.push_back(raw_rows * bytes_per_row / 1e9);
      ratios.push_back(ps_rows.back() * bytes_per_row / 1e9 / raw_gbs.back());
      ps_cpu.push_back((c1 - c0) * 1e9 / std::max(1.0, ps_rows.back() * o.seconds));
      raw_cpu.push_back((c2 - c1) * 1e9 / std::max(1.0, raw_rows * o.seconds));
    }
    const double rps = median(ps_rows), gb = rps * bytes_per_row / 1e9, raw_gb = median(raw_gbs), ratio = median(ratios);
    const double cpu = median(ps_cpu), rcpu = median(raw_cpu);
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    // With a client thread per core or more, clients and server keep every core busy and
    // throughput follows CPU per row; a PS then pays at least raw's CPU plus its store's
    // own work per pushed row (claim, the optimizer's pass): raw / (raw + store)
    // bounds its ratio.
    // Pinned, the clients' CPU is not the server's: no such bound.
    const bool cores_busy = static_cast<unsigned>(threads) >= std::max(1u, usable_cpus()) && !ack_only && !pinned;
    const double ceiling = op == "push" && cores_busy ? rcpu / (rcpu + shard.alone.store_push_cpu_ns) : 0;
    // The same with a row's update alone in place of the store's work: the best any PS
    // that updates rows in memory could do on this host.
    const double floor_ns = scattered ? shard.alone.update_scattered_cpu_ns : shard.alone.update_cpu_ns;
    const double ideal = op == "push" && cores_busy ? rcpu / (rcpu + floor_ns) : 0;
    return {rps, gb, raw_gb, ratio, *lo, *hi, cpu, rcpu, ceiling, ideal};
  }

  // A case's line of the table, or its JSON row.
  void print_case(const Shard& shard, const std::string& op, int threads, const CaseResult& c) const {
    out.text(fmt::format("{:<6}{:>5}{:>8}{:>14.0f}{:>10.3f}{:>12.3f}{:>9.2f}{:>15}{:>18}{:>10}{:>8}\n", op, shard.dim, threads, c.rps, c.gb,
                         c.raw_gb, c.ratio, fmt::format("{:.2f}-{:.2f}", c.lo, c.hi), fmt::format("{:.0f}|{:.0f}", c.cpu, c.rcpu),
                         c.ceiling > 0 ? fmt::format("{:.2f}", c.ceiling) : "-", c.ideal > 0 ? fmt::format("{:.2f}", c.ideal) : "-"));
    out.row({{"bench", "ps"},
             {"op", op},
             {"dim", shard.dim},
             {"threads", threads},
             {"repeats", o.repeats},
             {"rows_s", c.rps},
             {"gb_s", c.gb},
             {"raw_gb_s", c.raw_gb},
             {"ratio", c.ratio},
             {"ratio_min", c.lo},
             {"ratio_max", c.hi},
             {"cpu_ns_per_row", c.cpu},
             {"raw_cpu_ns_per_row", c.rcpu},
             {"ceiling", c.ceiling > 0 ? nlohmann::json(c.ceiling) : nlohmann::json()},
             {"ideal_ceiling", c.ideal > 0 ? nlohmann::json(c.ideal) : nlohmann::json()},
             {"optimizer", o.optimizer},
             {"keys", o.keys},
             {"serve", o.serve},
             {"apply_commits", shard.applied_by},
             {"apply_commits_asked", o.apply_commits},
             {"io_threads", o.io_threads},
             {"apply_threads", apply_threads},
             {"connections", o.connections},
             {"server_cpus", o.server_cpus},
             {"client_cpus", o.client_cpus}});
  }

  // Latency of small pulls (16 rows), one client.
  void small_pull_latency(std::uint16_t port, std::uint32_t dim) const {
    ps::PsClient c({{"127.0.0.1", port}}, kToken, dim, 0);
    std::vector<Key> keys(16);
    std::vector<float> buf;
    std::vector<double> us;
    for (int i = 0; i < 2000; ++i) {
      for (std::uint32_t j = 0; j < 16; ++j) keys[j] = (static_cast<Key>(i) * 16 + j) % o.num_keys;
      Stopwatch sw;
      c.pull(keys, buf);
      us.push_back(sw.seconds() * 1e6);
    }
    std::sort(us.begin(), us.end());
    double p50 = us[us.size() / 2], p99 = us[us.size() * 99 / 100];
    out.text(fmt::format("small pulls (16 rows of dim 16): p50 {:.1f} us, p99 {:.1f} us\n", p50, p99));
    out.row({{"bench", "ps"}, {"op", "pull_latency"}, {"dim", dim}, {"rows", 16}, {"p50_us", p50}, {"p99_us", p99}});
  }
};

}  // namespace

int run_ps_bench(const PsBenchOptions& o, bool json) {
  check_ps_options(o);
  const ps::OptimizerKind optimizer = ps::parse_optimizer(o.optimizer);  // ConfigError names the choices
  const bool scattered = o.keys == "scattered";
  if (o.server_cpus.empty() != o.client_cpus.empty()) throw ConfigError("--server-cpus and --client-cpus go together");
  const std::vector<int> client_cpus = o.client_cpus.empty() ? std::vector<int>{} : parse_cpu_list(o.client_cpus, "--client-cpus");
  if (!client_cpus.empty()) pin_this_thread(client_cpus);  // tried here first: the client threads' own pinning cannot fail
  // Set on the thread that starts every server thread (the shard's, the raw server's):
  // they inherit it.
  if (!o.server_cpus.empty()) pin_this_thread(parse_cpu_list(o.server_cpus, "--server-cpus"));
  const bool pinned = !client_cpus.empty();
  Output out{json};
  const std::uint32_t apply_threads = ps::applier_threads(o.apply_threads, static_cast<std::uint32_t>(o.io_threads));
  print_ps_header(out, o, apply_threads);
  const PsBench bench{o, out, o.rows_per_request, optimizer, scattered, client_cpus, pinned, apply_threads, o.serve == "ack"};
  for (std::uint32_t dim : o.dims) bench.run_dim(dim);
  out.text(
      "target: >= 0.70 of raw throughput for rows of 256 B and up (dim >= 64)\n"
      "ceiling (pushes, a client thread per core or more): raw's CPU per row / (raw's + the store alone's CPU per row\n"
      "pushed and committed): the best ratio a PS doing that work could reach on this host; ideal: the same with a row's\n"
      "update alone (plain SGD, no bookkeeping) for the store's work: the best any PS updating rows in memory could reach\n");
  return 0;
}

}  // namespace ember::bench
