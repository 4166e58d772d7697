#include "ember/data/synthetic.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <thread>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/common/process.h"
#include "ember/data/zipf.h"

namespace ember::data {
namespace {

// Reference measurements of the real samples in shared/data/real, used for calibration.
// Criteo: train.tiny.csv (the first 1999 rows of Kaggle train.txt): per table, the
// mean share of distinct non-missing values in windows of 1024 consecutive rows, and
// the share of missing values.
constexpr int kCriteoWindow = 1024;
constexpr std::array<double, 26> kCriteoDistinct = {0.053, 0.188, 0.672, 0.565, 0.023, 0.006, 0.696, 0.027, 0.002,
                                                    0.529, 0.604, 0.646, 0.551, 0.015, 0.513, 0.618, 0.009, 0.356,
                                                    0.122, 0.003, 0.632, 0.005, 0.012, 0.421, 0.027, 0.319};
constexpr std::array<double, 26> kCriteoMissing = {0.0, 0.0, 0.033, 0.033, 0.0, 0.126, 0.0,   0.0,   0.0,   0.0, 0.0,   0.033, 0.0,
                                                   0.0, 0.0, 0.033, 0.0,   0.0, 0.483, 0.483, 0.033, 0.816, 0.0, 0.033, 0.483, 0.483};
// Dense I1..I13: missing share, mean and standard deviation of log(1+x).
constexpr std::array<double, 13> kDenseMissing = {0.445, 0.0, 0.225, 0.21, 0.047, 0.247, 0.047, 0.001, 0.047, 0.445, 0.047, 0.777, 0.21};
constexpr std::array<double, 13> kDenseMean = {0.82, 2.15, 2.21, 1.73, 7.25, 3.62, 1.53, 2.06, 3.63, 0.37, 0.84, 0.32, 1.92};
constexpr std::array<double, 13> kDenseSd = {1.01, 2.19, 1.29, 0.98, 2.83, 1.82, 1.34, 1.2, 1.69, 0.39, 0.71, 0.63, 1.08};
// Avazu: tr.rx.csv's 499 distinct rows (the first rows of train.csv), one window.
constexpr int kAvazuWindow = 499;
constexpr std::array<double, 21> kAvazuDistinct = {0.006, 0.004, 0.152, 0.136, 0.018, 0.102, 0.024, 0.014, 0.126, 0.946, 0.445,
                                                   0.008, 0.006, 0.17,  0.006, 0.006, 0.11,  0.008, 0.044, 0.096, 0.038};

const std::vector<std::uint64_t> kCriteoCard = {1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
                                                93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
                                                2173,  4,    7046547,  18,      15,  286181, 105,     142572};
const std::vector<std::uint64_t> kAvazuCard = {7, 7,    4737, 7745, 26,  8552, 559, 36,  2686408, 6729486, 8251, 5,
                                               4, 2626, 8,    9,    435, 4,    68,  172, 60,      24,      7};

// Tables of id-like cardinality (ads, users, devices) are the ones an entity fixes.
constexpr std::uint64_t kCoupledMinRows = 4000;
constexpr std::uint64_t kChunkRows = 16384;

// Bijective on 32 bits for a fixed table: distinct values print as distinct ids.
std::uint32_t permute32(std::uint32_t v, std::uint32_t table) {
  std::uint32_t x = v + table * 0x9e3779b9u + 0x5bd1e995u;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

void put_hex8(std::string& out, std::uint32_t x) {
  static const char* digits = "0123456789abcdef";
  char buf[8];
  for (int i = 7; i >= 0; --i) {
    buf[i] = digits[x & 15];
    x >>= 4;
  }
  out.append(buf, 8);
}

void put_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  int n = std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v));
  out.append(buf, static_cast<std::size_t>(n));
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Deterministic value in [-1, 1) from a key.
double signed_unit(std::uint64_t key) { return static_cast<double>(mix64(key) >> 11) * 0x1.0p-52 - 1.0; }

struct TableModel {
  std::uint64_t rows = 1;
  ZipfSampler zipf;
  double missing = 0;
  bool coupled = false;
  bool label_signal = false;
};

// Where generated lines go: one file, or (GenOptions::files > 1) a directory of files
// of rows / files lines each, every file written under a temporary name and renamed into
// place when whole, `every` seconds apart (a stream's source, data/stream.h).
class Output {
 public:
  Output(const GenOptions& o, std::string header) : o_(o), header_(std::move(header)) {
    std::error_code ec;
    // A stream's directory made ahead (for a job to wait on) may be there, empty.
    const bool empty_dir = o_.files > 1 && std::filesystem::is_directory(o_.output, ec) && std::filesystem::is_empty(o_.output, ec);
    if (std::filesystem::exists(o_.output, ec) && !o_.overwrite && !empty_dir) {
      throw ConfigError("output " + o_.output.string() + " already exists (use --force to replace it)");
    }
    if (o_.files == 0) throw ConfigError("--files must be at least 1");
    if (o_.every_seconds > 0 && o_.files <= 1) throw ConfigError("--every goes with --files K (K > 1): seconds between the files");
    if (o_.files > 1) {
      if (o_.rows < o_.files) throw ConfigError("--files " + std::to_string(o_.files) + " exceeds --rows " + std::to_string(o_.rows));
      std::filesystem::create_directories(o_.output, ec);
      if (ec) throw IoError("create " + o_.output.string() + ": " + ec.message());
    }
    open();
  }
  ~Output() { drop(); }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  // Whole lines, split across files where a file is full.
  void lines(std::string_view text) {
    while (!text.empty()) {
      if (left_ == 0) next_file();
      std::size_t end = 0;
      std::uint64_t n = 0;
      while (end < text.size() && n < left_) {
        end = text.find('\n', end);
        end = end == std::string_view::npos ? text.size() : end + 1;
        ++n;
      }
      write(text.substr(0, end));
      left_ -= n;
      text.remove_prefix(end);
    }
  }
  void finish() { close(); }
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::filesystem::path path() const {
    if (o_.files <= 1) return o_.output;
    char name[40];
    std::snprintf(name, sizeof name, "part-%06llu.%s", static_cast<unsigned long long>(index_),
                  o_.like == SourceFormat::kAvazu ? "csv" : "tsv");
    return o_.output / name;
  }
  bool gzip() const { return o_.files <= 1 && o_.output.extension() == ".gz"; }
  void open() {
    final_ = path();
    tmp_ = final_;
    tmp_ += ".tmp-" + std::to_string(::getpid());
    if (gzip()) {
      g_ = gzopen(tmp_.c_str(), "wb6");
      if (g_ == nullptr) throw IoError(errno_message("create " + tmp_.string()));
    } else {
      f_ = std::fopen(tmp_.c_str(), "wb");
      if (f_ == nullptr) throw IoError(errno_message("create " + tmp_.string()));
    }
    const std::uint64_t files = std::max<std::uint64_t>(1, o_.files);
    left_ = o_.rows / files + (index_ + 1 == files ? o_.rows % files : 0);
    if (!header_.empty()) write(header_);
  }
  void write(std::string_view s) {
    bool ok = g_ != nullptr ? gzwrite(g_, s.data(), static_cast<unsigned>(s.size())) == static_cast<int>(s.size())
                            : std::fwrite(s.data(), 1, s.size(), f_) == s.size();
    if (!ok) throw IoError(errno_message("write " + tmp_.string()));
    bytes_ += s.size();
  }
  // The file whole: synced and renamed into place.
  void close() {
    if (f_ == nullptr && g_ == nullptr) return;
    bool ok = g_ != nullptr ? gzclose(g_) == Z_OK : (std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0 && std::fclose(f_) == 0);
    f_ = nullptr;
    g_ = nullptr;
    std::error_code ec;
    if (!ok) {
      const std::string why = errno_message("write " + tmp_.string());
      std::filesystem::remove(tmp_, ec);
      throw IoError(why);
    }
    std::filesystem::rename(tmp_, final_, ec);
    if (ec) {
      const std::string why = "rename " + tmp_.string() + " -> " + final_.string() + ": " + ec.message();
      std::filesystem::remove(tmp_, ec);
      throw IoError(why);
    }
  }
  void next_file() {
    close();
    ++index_;
    if (o_.every_seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o_.every_seconds));
    open();
  }
  void drop() {
    if (f_) std::fclose(f_);
    if (g_) gzclose(g_);
    if (f_ != nullptr || g_ != nullptr) {
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
    f_ = nullptr;
    g_ = nullptr;
  }

  const GenOptions& o_;
  std::string header_;
  std::filesystem::path final_, tmp_;
  std::FILE* f_ = nullptr;
  gzFile g_ = nullptr;
  std::uint64_t index_ = 0, left_ = 0, bytes_ = 0;
};

class Generator {
 public:
  explicit Generator(const GenOptions& o) : o_(o), criteo_(o.like != SourceFormat::kAvazu) {
    if (o.rows == 0) throw ConfigError("--rows must be positive");
    if (!(o.scale > 0)) throw ConfigError("--scale must be positive");
    if (o.alpha < 0) throw ConfigError("--alpha must be >= 0 (0 = calibrated per table)");
    if (!(o.new_ids >= 0 && o.new_ids <= 1)) throw ConfigError("--new-ids must be in [0, 1]");
    if (o.coupling < 0 || o.coupling > 1 || o.session < 0 || o.session >= 1 || o.drift < 0) {
      throw ConfigError("--coupling in [0,1], --session in [0,1), --drift >= 0");
    }
    const auto& card = real_cardinalities(o.like);
    // Avazu's hour and weekday come from the hour field, not from draws.
    int raw_tables = criteo_ ? 26 : 21;
    entities_ = entity_count(o);
    auto alphas = calibrated_alphas(o);
    for (int t = 0; t < raw_tables; ++t) {
      TableModel m;
      m.rows = scaled_cardinality(card[static_cast<std::size_t>(t)], o.scale);
      double a = o.alpha > 0 ? o.alpha : alphas[static_cast<std::size_t>(t)];
      m.zipf = ZipfSampler(m.rows, a);
      m.missing = criteo_ ? kCriteoMissing[static_cast<std::size_t>(t)] : 0.0;
      m.coupled = !o.iid && card[static_cast<std::size_t>(t)] >= kCoupledMinRows;
      tables_.push_back(m);
      report_.cardinalities.push_back(m.rows);
      report_.alphas.push_back(a);
    }
    const std::vector<int> signal = criteo_ ? std::vector<int>{0, 1, 5, 7, 13, 16} : std::vector<int>{0, 1, 4, 7, 11, 12, 14, 15, 17};
    for (int t : signal) tables_[static_cast<std::size_t>(t)].label_signal = true;
    entity_zipf_ = ZipfSampler(entities_, o.entity_alpha);
    double ctr = o.ctr >= 0 ? o.ctr : (criteo_ ? 0.25 : 0.17);
    if (!(ctr > 0 && ctr < 1)) throw ConfigError("--ctr must be in (0, 1)");
    if (!o.multi_hot.empty() && o.multi_hot.size() != static_cast<std::size_t>(raw_tables)) {
      throw ConfigError("--multi-hot has " + std::to_string(o.multi_hot.size()) + " bag sizes; " + (criteo_ ? "criteo" : "avazu") +
                        " draws " + std::to_string(raw_tables) + " tables");
    }
    if (!o.multi_hot.empty() && (o.multi_hot_sep == '\t' || o.multi_hot_sep == ',' || o.multi_hot_sep == '"' || o.multi_hot_sep == '\n')) {
      throw ConfigError("--multi-hot-sep cannot be a tab, comma, quote or newline");
    }
    bias_ = fit_bias(ctr);
  }

  GenReport run() {
    const int threads = o_.threads > 0 ? o_.threads : static_cast<int>(std::max(1u, usable_cpus()));
    Output out(o_, criteo_ ? std::string() : standard_header(SourceFormat::kAvazu) + "\n");
    const std::uint64_t chunks = (o_.rows + kChunkRows - 1) / kChunkRows;
    const std::uint64_t group = static_cast<std::uint64_t>(threads) * 2;
    std::vector<std::string> bufs(group);
    std::vector<std::uint64_t> pos(group);
    tbb::task_arena arena(threads);
    for (std::uint64_t c0 = 0; c0 < chunks; c0 += group) {
      std::uint64_t n = std::min(group, chunks - c0);
      arena.execute([&] { tbb::parallel_for(std::uint64_t{0}, n, [&](std::uint64_t i) { pos[i] = make_chunk(c0 + i, bufs[i]); }); });
      for (std::uint64_t i = 0; i < n; ++i) {
        out.lines(bufs[i]);
        report_.positives += pos[i];
      }
      if (o_.on_progress) o_.on_progress(std::min(o_.rows, (c0 + n) * kChunkRows));
    }
    out.finish();
    report_.bytes = out.bytes();
    report_.rows = o_.rows;
    return report_;
  }

 private:
  static constexpr double kEntityEffect = 0.9;
  static constexpr std::uint64_t kNewIdWindow = 10000;
  // Fresh values per table and window: each drawn about twice in its window.
  std::uint64_t new_id_pool() const {
    return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(o_.new_ids * kNewIdWindow / 2)));
  }
  static constexpr double kValueEffect = 0.8;

  // The label's bias that lands the click rate at `ctr`: the mean of sigmoid(b + x)
  // over Monte Carlo draws of the row's other logit terms, solved for b by bisection.
  double fit_bias(double ctr) const {
    SplitMix64 rng(mix64(o_.seed ^ 0xb1a5));
    std::vector<double> x(20000);
    std::vector<std::int64_t> value(tables_.size());
    std::uint64_t entity = 0;
    for (double& xi : x) xi = draw_row(rng, rng.below(o_.rows), false, entity, value);
    double lo = -20, hi = 20;
    for (int i = 0; i < 60; ++i) {
      double b = 0.5 * (lo + hi), mean = 0;
      for (double xi : x) mean += sigmoid(b + xi);
      (mean / static_cast<double>(x.size()) < ctr ? lo : hi) = b;
    }
    return 0.5 * (lo + hi);
  }

  // Draws row r's entity (reusing `entity` if `reuse_entity`) and table values (-1 =
  // missing); returns the label logit without the bias.
  double draw_row(SplitMix64& rng, std::uint64_t r, bool reuse_entity, std::uint64_t& entity, std::vector<std::int64_t>& value) const {
    // Rankings shift with time (row number), not with the file's length.
    const std::uint64_t shift = o_.iid ? 0 : static_cast<std::uint64_t>(static_cast<double>(r) * o_.drift * 1e-4);
    if (!o_.iid && !reuse_entity) {
      entity = (entity_zipf_(rng) + shift) % entities_;
    }
    double logit = o_.iid ? 0.0 : kEntityEffect * signed_unit(o_.seed ^ (entity * 0x100000001b3ULL) ^ 0xe17e);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const TableModel& m = tables_[t];
      if (m.missing > 0 && rng.uniform() < m.missing) {
        value[t] = -1;
        continue;
      }
      std::uint64_t v;
      if (o_.new_ids > 0 && rng.uniform() < o_.new_ids) {
        // A value of this window's fresh pool: past the table's values, never drawn
        // before this window nor after it.
        const std::uint64_t pool = new_id_pool();
        v = m.rows + (r / kNewIdWindow) * pool + rng.below(pool);
      } else if (m.coupled && rng.uniform() < o_.coupling) {
        // The entity's own value for this table (its site, its user's device...):
        // one draw from the table's distribution, fixed per (entity, table).
        SplitMix64 er(mix64(o_.seed ^ (entity * 0x9e3779b97f4a7c15ULL) ^ (static_cast<std::uint64_t>(t) << 56)));
        v = m.zipf(er);
      } else {
        // Same relative speed as the entity ranking: small tables stay nearly still.
        std::uint64_t table_shift = o_.iid ? 0
                                           : static_cast<std::uint64_t>(static_cast<double>(r) * o_.drift * 1e-4 *
                                                                        static_cast<double>(m.rows) / static_cast<double>(entities_));
        v = (m.zipf(rng) + table_shift) % m.rows;
      }
      value[t] = static_cast<std::int64_t>(v);
      if (m.label_signal) logit += kValueEffect * signed_unit((static_cast<std::uint64_t>(t) << 48) ^ v ^ o_.seed);
    }
    return logit;
  }

  // Writes table t's bag of row r: the row's own value first (a fresh draw when it was
  // missing: bags keep their size, as MLPerf's), then the extra values.
  template <typename Put>
  void put_bag(SplitMix64& rng, std::uint64_t r, int t, std::int64_t v, Put&& put, std::string& out) const {
    const TableModel& m = tables_[static_cast<std::size_t>(t)];
    const std::uint32_t size = o_.multi_hot[static_cast<std::size_t>(t)];
    for (std::uint32_t k = 0; k < size; ++k) {
      if (k > 0) out.push_back(o_.multi_hot_sep);
      std::uint64_t x;
      if (k == 0 && v >= 0) {
        x = static_cast<std::uint64_t>(v);
      } else if (o_.multi_hot_dist == MultiHotDist::kUniform) {
        x = rng.below(m.rows);
      } else {
        const std::uint64_t shift = o_.iid ? 0
                                           : static_cast<std::uint64_t>(static_cast<double>(r) * o_.drift * 1e-4 *
                                                                        static_cast<double>(m.rows) / static_cast<double>(entities_));
        x = (m.zipf(rng) + shift) % m.rows;
      }
      put(x);
    }
  }

  // Generates rows [c*kChunkRows, ...) into `out`; returns the number of clicks.
  std::uint64_t make_chunk(std::uint64_t c, std::string& out) const {
    out.clear();
    SplitMix64 rng(mix64(o_.seed * 0x2545f4914f6cdd1dULL + c + 1));
    const std::uint64_t begin = c * kChunkRows, end = std::min(o_.rows, begin + kChunkRows);
    const int nt = static_cast<int>(tables_.size());
    std::vector<std::int64_t> value(static_cast<std::size_t>(nt));
    std::uint64_t entity = 0, clicks = 0;
    for (std::uint64_t r = begin; r < end; ++r) {
      const double tau = static_cast<double>(r) / static_cast<double>(o_.rows);
      bool reuse = r != begin && rng.uniform() < o_.session;
      double signal = draw_row(rng, r, reuse, entity, value);
      double logit = bias_ + signal;
      std::uint8_t label = rng.uniform() < sigmoid(logit) ? 1 : 0;
      clicks += label;
      if (criteo_) {
        out.push_back(static_cast<char>('0' + label));
        for (int j = 0; j < 13; ++j) {
          out.push_back('\t');
          if (rng.uniform() < kDenseMissing[static_cast<std::size_t>(j)]) continue;
          if (j == 1 && rng.uniform() < 0.03) {
            out.append("-1");
            continue;
          }
          double lx = kDenseMean[static_cast<std::size_t>(j)] + 0.15 * signal + kDenseSd[static_cast<std::size_t>(j)] * rng.normal();
          put_uint(out, static_cast<std::uint64_t>(std::floor(std::expm1(std::max(0.0, lx)))));
        }
        for (int t = 0; t < nt; ++t) {
          out.push_back('\t');
          std::int64_t v = value[static_cast<std::size_t>(t)];
          auto put = [&](std::uint64_t x) { put_hex8(out, permute32(static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(t))); };
          if (!o_.multi_hot.empty()) {
            put_bag(rng, r, t, v, put, out);
          } else if (v >= 0) {
            put(static_cast<std::uint64_t>(v));
          }
        }
        out.push_back('\n');
      } else {
        put_uint(out, rng.next());
        out.push_back(',');
        out.push_back(static_cast<char>('0' + label));
        // Ten days of hours from 2014-10-21 00:00, as in Avazu's train.csv.
        std::uint64_t h = std::min<std::uint64_t>(239, static_cast<std::uint64_t>(tau * 240));
        char hour[16];
        std::snprintf(hour, sizeof hour, ",1410%02d%02d", static_cast<int>(21 + h / 24), static_cast<int>(h % 24));
        out.append(hour);
        static constexpr std::array<std::int64_t, 21> kBase = {1000, 0, -1,    -1,  -1, -1,   -1, -1, -1,     -1, -1,
                                                               0,    0, 15000, 300, 30, 1700, 0,  30, 100000, 10};
        for (int t = 0; t < nt; ++t) {
          out.push_back(',');
          std::int64_t v = value[static_cast<std::size_t>(t)];
          std::int64_t base = kBase[static_cast<std::size_t>(t)];
          auto put = [&](std::uint64_t x) {
            if (base < 0) {
              put_hex8(out, permute32(static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(t)));
            } else if (t == 19 && x == 0) {
              out.append("-1");  // C20's most common value in the real data
            } else {
              put_uint(out, static_cast<std::uint64_t>(base) + x);
            }
          };
          if (!o_.multi_hot.empty()) {
            put_bag(rng, r, t, v, put, out);
          } else {
            put(static_cast<std::uint64_t>(v));
          }
        }
        out.push_back('\n');
      }
    }
    return clicks;
  }

  const GenOptions& o_;
  bool criteo_;
  std::vector<TableModel> tables_;
  std::uint64_t entities_ = 16;
  ZipfSampler entity_zipf_;
  double bias_ = 0;
  GenReport report_;
};

}  // namespace

MultiHotDist parse_multi_hot_dist(const std::string& name) {
  if (name == "uniform") return MultiHotDist::kUniform;
  if (name == "zipf") return MultiHotDist::kZipf;
  throw ConfigError("--multi-hot-dist must be uniform or zipf, not '" + name + "'");
}

const std::vector<std::uint32_t>& mlperf_bag_sizes() {
  static const std::vector<std::uint32_t> sizes = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
  return sizes;
}

std::vector<std::uint32_t> parse_bag_sizes(const std::string& text, SourceFormat like) {
  const std::size_t tables = like == SourceFormat::kAvazu ? 21 : 26;
  if (text == "mlperf") {
    if (like == SourceFormat::kAvazu) throw ConfigError("--multi-hot mlperf is Criteo's 26 tables; give avazu 21 sizes");
    return mlperf_bag_sizes();
  }
  std::vector<std::uint32_t> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v > 65535) {
      throw ConfigError("--multi-hot: '" + item + "' is not a bag size (0 to 65535)");
    }
    out.push_back(v);
    if (end == text.size()) break;
    begin = end + 1;
  }
  if (out.size() == 1) out.assign(tables, out[0]);
  if (out.size() != tables) {
    throw ConfigError("--multi-hot has " + std::to_string(out.size()) + " sizes; give one, or " + std::to_string(tables) +
                      " (one per table)");
  }
  return out;
}

const std::vector<std::uint64_t>& real_cardinalities(SourceFormat like) { return like == SourceFormat::kAvazu ? kAvazuCard : kCriteoCard; }

std::uint64_t scaled_cardinality(std::uint64_t card, double scale) {
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(static_cast<double>(card) * scale)));
}

std::vector<std::uint64_t> synthetic_table_rows(SourceFormat like, double scale) {
  const auto& card = real_cardinalities(like);
  const std::size_t drawn = like == SourceFormat::kAvazu ? 21 : card.size();  // hour, weekday come from the clock
  std::vector<std::uint64_t> rows;
  for (std::size_t t = 0; t < card.size(); ++t) rows.push_back((t < drawn ? scaled_cardinality(card[t], scale) : card[t]) + kFirstValueRow);
  return rows;
}

std::uint64_t entity_count(const GenOptions& o) {
  if (o.entities > 0) return o.entities;
  return std::max<std::uint64_t>(16, static_cast<std::uint64_t>(1e6 * o.scale));
}

std::vector<double> calibrated_alphas(const GenOptions& o) {
  bool criteo = o.like != SourceFormat::kAvazu;
  const auto& card = real_cardinalities(o.like);
  const double session = o.iid ? 0.0 : o.session;
  const double coupling = o.iid ? 0.0 : o.coupling;
  // The shapes are fitted at full (real) cardinality and kept at any --scale.
  const auto entities = static_cast<std::uint64_t>(std::max(16.0, static_cast<double>(entity_count(o)) / o.scale));
  int n = criteo ? 26 : 21;
  std::vector<double> out;
  for (int t = 0; t < n; ++t) {
    const std::size_t ti = static_cast<std::size_t>(t);
    double window = criteo ? kCriteoWindow : kAvazuWindow;
    double present = criteo ? 1.0 - kCriteoMissing[ti] : 1.0;
    double target = (criteo ? kCriteoDistinct[ti] : kAvazuDistinct[ti]) * window;
    double c = card[ti] >= kCoupledMinRows ? coupling : 0.0;
    // A coupled draw repeats its entity's fixed draw: a window holds as many fresh draws
    // from the table as distinct entities among its coupled rows (rows that reuse their
    // predecessor's entity add none), plus its independent draws.
    double entity_draws = window * present * c * (1.0 - session);
    double fresh = window * present * (1.0 - c) + (c > 0 ? zipf_expected_distinct(entities, o.entity_alpha, entity_draws) : 0.0);
    out.push_back(fit_zipf_exponent(card[ti], std::max(1.0, fresh), std::max(1.0, target)));
  }
  return out;
}

GenReport generate(const GenOptions& options) { return Generator(options).run(); }

}  // namespace ember::data
