#include "ember/data/stats.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/data/hashed_ids.h"
#include "ember/data/line_parser.h"
#include "ember/data/schema.h"

namespace ember::data {
namespace {

// Sum of the k largest counts (partially reorders `counts`).
std::uint64_t top_sum(std::vector<std::uint32_t>& counts, std::uint64_t k) {
  k = std::min<std::uint64_t>(k, counts.size());
  if (k == 0) return 0;
  std::nth_element(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(k - 1), counts.end(), std::greater<>());
  std::uint64_t s = 0;
  for (std::uint64_t i = 0; i < k; ++i) s += counts[i];
  return s;
}

// A table's ids as dense rows: themselves for a vocabulary's tables; for hashed ids (a
// dynamic table, no row count), numbered as first met, the missing value's id as
// kMissingRow, so the statistics below read both alike.
class DenseRows {
 public:
  DenseRows(const Manifest& m, int t)
      : hashed_(m.hashed_ids),
        missing_(hashed_id(static_cast<unsigned>(t), kMissingKey)),
        rows_(hashed_ ? kFirstValueRow : m.tables[static_cast<std::size_t>(t)].rows) {}
  // The row of `id`; a hashed id not met before gets the next one.
  std::uint64_t row(std::uint64_t id) {
    if (!hashed_) return id;
    if (id == missing_) return kMissingRow;
    const auto [row, added] = index_.try_emplace(id, rows_);
    if (added) ++rows_;
    return *row;
  }
  std::uint64_t row(std::uint64_t id) const {
    if (!hashed_) return id;
    if (id == missing_) return kMissingRow;
    return *index_.find(id);
  }
  std::uint64_t rows() const { return rows_; }

 private:
  bool hashed_;
  std::uint64_t missing_;
  std::uint64_t rows_;
  U64Map<std::uint64_t> index_;
};

// row_counts' work, the ids made rows by `dense` (which learns the hashed ones).
std::vector<std::uint32_t> count_rows(const Dataset& ds, Split which, int t, bool once_per_sample, DenseRows& dense) {
  const SplitData& split = ds.split(which);
  const TableInfo& info = ds.manifest().tables[static_cast<std::size_t>(t)];
  std::vector<std::uint32_t> counts(dense.rows(), 0);
  for (int s = 0; s < split.num_shards(); ++s) {
    const Shard& sh = split.shard(s);
    std::vector<std::uint64_t> bag;
    for (std::uint64_t r = 0; r < sh.rows(); ++r) {
      bag.clear();
      sh.for_each_id(t, r, [&](std::uint64_t id) {
        if (!ds.manifest().hashed_ids && id >= info.rows) {
          throw DataError(ds.dir().string() + ": table " + info.name + " has id " + std::to_string(id) + " beyond its " +
                          std::to_string(info.rows) + " rows");
        }
        bag.push_back(dense.row(id));
      });
      if (once_per_sample && bag.size() > 1) {
        std::sort(bag.begin(), bag.end());
        bag.erase(std::unique(bag.begin(), bag.end()), bag.end());
      }
      if (counts.size() < dense.rows()) counts.resize(dense.rows(), 0);
      for (std::uint64_t id : bag) {
        if (counts[id] != UINT32_MAX) ++counts[id];
      }
    }
  }
  return counts;
}

}  // namespace

std::vector<std::uint32_t> row_counts(const Dataset& ds, Split which, int t, bool once_per_sample) {
  DenseRows dense(ds.manifest(), t);
  return count_rows(ds, which, t, once_per_sample, dense);
}

namespace {

// The distinct rows of table t per window of `window` samples, in the split's order and
// as expected of random samples (hypergeometric), into ts.window_distinct(_random).
void window_stats(const SplitData& split, int t, std::uint64_t window, const std::vector<std::uint32_t>& counts, const DenseRows& dense,
                  TableStats& ts) {
  std::vector<std::uint32_t> stamp(counts.size(), 0);
  std::uint64_t windows = 0, window_distinct = 0, sample = 0, in_window = 0;
  for (int s = 0; s < split.num_shards(); ++s) {
    const Shard& sh = split.shard(s);
    for (std::uint64_t r = 0; r < sh.rows(); ++r, ++sample) {
      std::uint32_t w = static_cast<std::uint32_t>(sample / window) + 1;
      sh.for_each_id(t, r, [&](std::uint64_t raw) {
        const std::uint64_t id = dense.row(raw);
        if (id != kMissingRow && stamp[id] != w) {
          stamp[id] = w;
          ++in_window;
        }
      });
      if ((sample + 1) % window == 0) {
        ++windows;
        window_distinct += in_window;
        in_window = 0;
      }
    }
  }
  if (windows == 0) return;
  ts.window_distinct = static_cast<double>(window_distinct) / static_cast<double>(windows * window);
  // Hypergeometric: P(a value with c of N occurrences is absent from w random rows).
  const double n = static_cast<double>(split.rows()), w = static_cast<double>(window);
  const double base = std::lgamma(n - w + 1) - std::lgamma(n + 1);
  double expected = 0;
  for (std::uint64_t id = kFirstValueRow - 1; id < counts.size(); ++id) {
    if (counts[id] == 0) continue;
    double c = counts[id];
    double absent = n - c < w ? 0.0 : std::exp(std::lgamma(n - c + 1) - std::lgamma(n - c - w + 1) + base);
    expected += 1.0 - absent;
  }
  ts.window_distinct_random = expected / w;
}

}  // namespace

DatasetStats compute_stats(const Dataset& ds, const StatsOptions& o) {
  if (o.workers < 1) throw ConfigError("--workers must be at least 1");
  if (!(o.cache_ratio > 0 && o.cache_ratio <= 1)) throw ConfigError("--cache-ratio must be in (0, 1]");
  const SplitData& split = ds.split(o.split);
  DatasetStats out;
  out.split = kSplitNames[static_cast<int>(o.split)];
  out.samples = split.rows();
  out.workers = o.workers;
  out.cache_ratio = o.cache_ratio;
  out.window = o.window;
  out.multi_hot = ds.manifest().multi_hot;
  if (split.rows() == 0) throw ConfigError("split " + out.split + " is empty");
  std::uint64_t pos = 0;
  for (int s = 0; s < split.num_shards(); ++s) {
    const Shard& sh = split.shard(s);
    for (std::uint64_t r = 0; r < sh.rows(); ++r) pos += sh.label(r);
  }
  out.positive_rate = static_cast<double>(pos) / static_cast<double>(split.rows());
  const double per_worker = static_cast<double>(split.rows()) / o.workers;
  const int nt = ds.num_tables();
  out.tables.resize(static_cast<std::size_t>(nt));
  // Histogram of counts among each table's cached rows, for the overall DoI.
  std::vector<std::map<std::uint32_t, std::uint64_t>> cached_hist(static_cast<std::size_t>(nt));
  tbb::parallel_for(0, nt, [&](int t) {
    const TableInfo& info = ds.manifest().tables[static_cast<std::size_t>(t)];
    TableStats& ts = out.tables[static_cast<std::size_t>(t)];
    ts.name = info.name;
    ts.mean_bag = info.mean_bag;
    ts.max_bag = info.max_bag;
    DenseRows dense(ds.manifest(), t);
    std::vector<std::uint32_t> counts = count_rows(ds, o.split, t, false, dense);
    // Hashed ids: the table's rows are the ids the split holds (and the reserved ones).
    ts.rows = ds.manifest().hashed_ids ? counts.size() : info.rows;
    if (o.window > 0) window_stats(split, t, o.window, counts, dense, ts);
    // Shares of the table's accesses (one per sample when one-hot, a bag's ids when not).
    double total = 0;
    for (std::uint32_t c : counts) total += c;
    total = std::max(total, 1.0);
    ts.missing_share = static_cast<double>(counts[kMissingRow]) / total;
    ts.distinct = static_cast<std::uint64_t>(std::count_if(counts.begin(), counts.end(), [](std::uint32_t c) { return c > 0; }));
    ts.top1_share =
        static_cast<double>(top_sum(counts, static_cast<std::uint64_t>(std::ceil(0.01 * static_cast<double>(ts.rows))))) / total;
    ts.top10_share =
        static_cast<double>(top_sum(counts, static_cast<std::uint64_t>(std::ceil(0.10 * static_cast<double>(ts.rows))))) / total;
    ts.cached_rows = static_cast<std::uint64_t>(std::ceil(o.cache_ratio * static_cast<double>(ts.rows)));
    // The cached rows are the most popular ones (what an LRU cache converges to).
    std::nth_element(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(ts.cached_rows - 1), counts.end(), std::greater<>());
    std::uint64_t rare = 0;
    auto& hist = cached_hist[static_cast<std::size_t>(t)];
    for (std::uint64_t i = 0; i < ts.cached_rows; ++i) {
      if (static_cast<double>(counts[i]) < per_worker) ++rare;
      ++hist[counts[i]];
    }
    ts.doi = static_cast<double>(rare) / static_cast<double>(ts.cached_rows);
  });
  std::uint64_t cached = 0, rare = 0;
  for (auto& h : cached_hist) {
    for (auto& [count, n] : h) {
      cached += n;
      if (static_cast<double>(count) < per_worker) rare += n;
    }
  }
  out.doi = cached > 0 ? static_cast<double>(rare) / static_cast<double>(cached) : 0.0;
  return out;
}

std::string stats_json(const DatasetStats& s) {
  nlohmann::ordered_json j;
  j["split"] = s.split;
  j["samples"] = s.samples;
  j["positive_rate"] = s.positive_rate;
  j["workers"] = s.workers;
  j["cache_ratio"] = s.cache_ratio;
  j["doi"] = s.doi;
  if (s.window > 0) j["window"] = s.window;
  auto& arr = j["tables"] = nlohmann::ordered_json::array();
  for (const auto& t : s.tables) {
    nlohmann::ordered_json tj = {{"name", t.name},
                                 {"rows", t.rows},
                                 {"distinct", t.distinct},
                                 {"top1_share", t.top1_share},
                                 {"top10_share", t.top10_share},
                                 {"cached_rows", t.cached_rows},
                                 {"doi", t.doi},
                                 {"missing_share", t.missing_share}};
    if (s.multi_hot) {
      tj["mean_bag"] = t.mean_bag;
      tj["max_bag"] = t.max_bag;
    }
    if (s.window > 0) {
      tj["window_distinct"] = t.window_distinct;
      tj["window_distinct_random"] = t.window_distinct_random;
    }
    arr.push_back(tj);
  }
  return j.dump();
}

std::string stats_table(const DatasetStats& s) {
  std::string out = fmt::format("split {}: {} samples, positive rate {:.3f}; DoI for {} workers, cache ratio {:g}\n", s.split, s.samples,
                                s.positive_rate, s.workers, s.cache_ratio);
  out += fmt::format("{:<18}{:>11}{:>11}{:>8}{:>8}{:>8}{:>8}", "table", "rows", "distinct", "top1%", "top10%", "miss", "DoI");
  if (s.multi_hot) out += fmt::format("{:>8}{:>6}", "bag", "max");
  if (s.window > 0) out += fmt::format("{:>10}{:>10}{:>9}", fmt::format("dist/{}", s.window), "random", "ratio");
  out += "\n";
  for (const auto& t : s.tables) {
    out += fmt::format("{:<18}{:>11}{:>11}{:>8.3f}{:>8.3f}{:>8.3f}{:>8.3f}", t.name, t.rows, t.distinct, t.top1_share, t.top10_share,
                       t.missing_share, t.doi);
    if (s.multi_hot) out += fmt::format("{:>8.2f}{:>6}", t.mean_bag, t.max_bag);
    if (s.window > 0) {
      out += fmt::format("{:>10.3f}{:>10.3f}{:>9.3f}", t.window_distinct, t.window_distinct_random,
                         t.window_distinct_random > 0 ? t.window_distinct / t.window_distinct_random : 1.0);
    }
    out += "\n";
  }
  out += fmt::format("overall DoI (all cached rows): {:.4f}\n", s.doi);
  return out;
}

}  // namespace ember::data
