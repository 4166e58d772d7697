#include "ember/data/synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/dataset.h"
#include "ember/data/line_parser.h"
#include "ember/data/prep.h"
#include "ember/data/stats.h"
#include "ember/data/zipf.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

TEST(Zipf, EmpiricalFrequenciesMatchTheDistribution) {
  for (double s : {0.6, 1.0, 1.3}) {
    const std::uint64_t n = 1000;
    ZipfSampler z(n, s);
    SplitMix64 rng(11);
    std::vector<double> counts(n, 0);
    const int draws = 400000;
    for (int i = 0; i < draws; ++i) {
      std::uint64_t k = z(rng);
      ASSERT_LT(k, n);
      counts[k] += 1;
    }
    double norm = 0;
    for (std::uint64_t k = 1; k <= n; ++k) norm += std::pow(static_cast<double>(k), -s);
    for (std::uint64_t k = 0; k < 5; ++k) {
      double p = std::pow(static_cast<double>(k + 1), -s) / norm;
      EXPECT_NEAR(counts[k] / draws, p, 0.05 * p + 0.001) << "s=" << s << " rank " << k;
    }
  }
}

TEST(Zipf, ExpectedDistinctMatchesSimulationAndFitInverts) {
  const std::uint64_t n = 200000;
  const double s = 1.1, draws = 5000;
  ZipfSampler z(n, s);
  SplitMix64 rng(3);
  double total = 0;
  const int reps = 20;
  for (int r = 0; r < reps; ++r) {
    std::vector<std::uint64_t> v(static_cast<std::size_t>(draws));
    for (auto& x : v) x = z(rng);
    std::sort(v.begin(), v.end());
    total += static_cast<double>(std::unique(v.begin(), v.end()) - v.begin());
  }
  double expected = zipf_expected_distinct(n, s, draws);
  EXPECT_NEAR(total / reps, expected, 0.03 * expected);
  EXPECT_NEAR(fit_zipf_exponent(n, draws, expected), s, 0.01);
}

class Synthetic : public test::TempDirTest {
 protected:
  fs::path gen_and_prep(GenOptions g, const std::string& name) {
    g.output = dir_ / (name + ".txt");
    generate(g);
    PrepOptions p;
    p.format = g.like;
    p.inputs = {g.output};
    p.output = dir_ / name;
    prepare_dataset(p);
    return p.output;
  }
};

TEST_F(Synthetic, OutputDoesNotDependOnThreads) {
  GenOptions g;
  g.rows = 40000;
  g.scale = 0.01;
  g.threads = 1;
  g.output = dir_ / "a.tsv";
  generate(g);
  g.threads = 2;
  g.output = dir_ / "b.tsv";
  generate(g);
  EXPECT_EQ(read_file(dir_ / "a.tsv"), read_file(dir_ / "b.tsv"));
  g.seed = 2;
  g.output = dir_ / "c.tsv";
  generate(g);
  EXPECT_NE(read_file(dir_ / "a.tsv"), read_file(dir_ / "c.tsv"));
}

// --files: a stream's directory of files whose lines, in name order, are one file's
// (Avazu: each file with its header), each put in place whole.
TEST_F(Synthetic, FilesSplitOneGenerationInOrder) {
  for (SourceFormat like : {SourceFormat::kCriteoTsv, SourceFormat::kAvazu}) {
    GenOptions g;
    g.like = like;
    g.rows = 40000;  // chunks of 16,384 rows cut across the files
    g.scale = 0.01;
    g.output = dir_ / "one.txt";
    g.overwrite = true;
    generate(g);
    g.files = 3;
    g.output = dir_ / "parts";
    generate(g);
    std::string joined, header;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_ / "parts")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    const std::string ext = like == SourceFormat::kAvazu ? ".csv" : ".tsv";
    ASSERT_EQ(names, (std::vector<std::string>{"part-000000" + ext, "part-000001" + ext, "part-000002" + ext}));
    for (std::size_t k = 0; k < names.size(); ++k) {
      std::string text = read_file(dir_ / "parts" / names[k]);
      if (like == SourceFormat::kAvazu) {
        const std::size_t nl = text.find('\n') + 1;
        if (k == 0) header = text.substr(0, nl);
        EXPECT_EQ(text.substr(0, nl), header);
        if (k > 0) text.erase(0, nl);
      }
      EXPECT_EQ(std::count(text.begin(), text.end(), '\n') - (like == SourceFormat::kAvazu && k == 0 ? 1 : 0), k < 2 ? 13333 : 13334);
      joined += text;
    }
    EXPECT_EQ(joined, read_file(dir_ / "one.txt"));
    fs::remove_all(dir_ / "parts");
  }
}

TEST_F(Synthetic, NewIdsKeepComingAndFadeWithTheirWindow) {
  // Tables of one value at this scale: every other value of a table is a fresh id.
  GenOptions g;
  g.rows = 40000;
  g.scale = 1e-6;
  g.new_ids = 0.3;
  g.output = dir_ / "new.tsv";
  generate(g);
  const std::string text = read_file(g.output);
  LineParser parser(SourceFormat::kCriteoTsv, text.substr(0, text.find('\n')));
  std::map<std::uint64_t, std::set<std::uint64_t>> windows;  // C2's values -> windows holding them
  std::uint64_t row = 0;
  Record rec;
  std::string err;
  for (std::size_t at = 0; at < text.size(); ++row) {
    const std::size_t nl = text.find('\n', at);
    ASSERT_TRUE(parser.parse(std::string_view(text).substr(at, nl - at), rec, err)) << err;
    at = nl + 1;
    if (rec.keys[1] != kMissingKey) windows[rec.keys[1]].insert(row / 10000);
  }
  std::uint64_t in_one_window = 0;
  for (const auto& [value, w] : windows) {
    in_one_window += w.size() == 1;
  }
  // The table's one value is in every window; each window's fresh pool (1,500 values,
  // 3,000 draws) shows about 1,300 distinct ones, never again after its window.
  EXPECT_EQ(windows.size() - in_one_window, 1u);
  EXPECT_GT(in_one_window, 4u * 1200);
  EXPECT_LT(in_one_window, 4u * 1400);
  g.new_ids = 1.5;
  EXPECT_THROW(generate(g), ConfigError);
}

TEST_F(Synthetic, IidSkewMatchesItsExponent) {
  GenOptions g;
  g.rows = 100000;
  g.scale = 0.001;  // C3: 10131 values
  g.alpha = 1.2;
  g.iid = true;
  Dataset ds = Dataset::open(gen_and_prep(g, "iid"));
  const int t = 2;  // C3
  std::uint64_t n = std::llround(10131227 * 0.001);
  double norm = 0;
  for (std::uint64_t k = 1; k <= n; ++k) norm += std::pow(static_cast<double>(k), -1.2);
  const SplitData& s = ds.split(Split::kTrain);
  std::vector<double> count(ds.manifest().tables[t].rows, 0);
  double present = 0;
  for (std::uint64_t i = 0; i < s.rows(); ++i) {
    std::uint64_t r;
    std::uint64_t id = s.shard_of(i, r).id(t, r);
    count[id] += 1;
    present += id != kMissingRow;
  }
  // Ids are sorted by frequency: id 2 is rank 0, id 3 rank 1...
  for (int k = 0; k < 3; ++k) {
    double p = std::pow(k + 1.0, -1.2) / norm;
    EXPECT_NEAR(count[kFirstValueRow + k] / present, p, 0.06 * p) << "rank " << k;
  }
  // Missing share follows the calibrated rate of C3 (3.3%).
  EXPECT_NEAR(count[kMissingRow] / static_cast<double>(s.rows()), 0.033, 0.005);
}

TEST_F(Synthetic, EntitiesAndDriftGiveCorrelationAndTemporalLocality) {
  GenOptions g;
  g.rows = 60000;
  g.scale = 0.05;
  g.iid = true;
  Dataset iid = Dataset::open(gen_and_prep(g, "iid"));
  g.iid = false;
  g.drift = 50;  // fast drift and long sessions, so 60k rows show it clearly
  g.session = 0.3;
  Dataset local = Dataset::open(gen_and_prep(g, "local"));
  StatsOptions so;
  so.window = 1024;
  DatasetStats a = compute_stats(iid, so), b = compute_stats(local, so);
  // Big tables: windows of consecutive rows hold fewer distinct values than the same
  // counts in random order would (bursts); i.i.d. rows show no such effect.
  for (int t : {2, 3, 11, 15, 20}) {
    double ra = a.tables[t].window_distinct / a.tables[t].window_distinct_random;
    double rb = b.tables[t].window_distinct / b.tables[t].window_distinct_random;
    EXPECT_NEAR(ra, 1.0, 0.02) << a.tables[t].name;
    EXPECT_LT(rb, 0.9) << b.tables[t].name;
  }
  // Correlated features: in the entity model, C3 and C4 values co-occur far more
  // consistently. Measure how often the most common C4 value given a C3 value agrees.
  auto consistency = [](const Dataset& ds) {
    const SplitData& s = ds.split(Split::kTrain);
    std::map<std::uint64_t, std::map<std::uint64_t, int>> co;
    for (std::uint64_t i = 0; i < s.rows(); ++i) {
      std::uint64_t r;
      const Shard& sh = s.shard_of(i, r);
      ++co[sh.id(2, r)][sh.id(3, r)];
    }
    double top = 0, total = 0;
    for (auto& [c3, m] : co) {
      int best = 0, sum = 0;
      for (auto& [c4, n] : m) {
        best = std::max(best, n);
        sum += n;
      }
      if (sum >= 5) {
        top += best;
        total += sum;
      }
    }
    return top / total;
  };
  EXPECT_GT(consistency(local), consistency(iid) + 0.1);
}

// AUC of a predictor built from per-value click rates of a few tables on the first
// half, scored on the second half.
double holdout_auc(const Dataset& ds, std::vector<int> tables) {
  const SplitData& s = ds.split(Split::kTrain);
  std::uint64_t half = s.rows() / 2;
  std::vector<std::vector<double>> clicks(tables.size()), shows(tables.size());
  for (std::size_t j = 0; j < tables.size(); ++j) {
    clicks[j].assign(ds.manifest().tables[static_cast<std::size_t>(tables[j])].rows, 0);
    shows[j].assign(ds.manifest().tables[static_cast<std::size_t>(tables[j])].rows, 0);
  }
  for (std::uint64_t i = 0; i < half; ++i) {
    std::uint64_t r;
    const Shard& sh = s.shard_of(i, r);
    for (std::size_t j = 0; j < tables.size(); ++j) {
      std::uint64_t id = sh.id(tables[j], r);
      clicks[j][id] += sh.label(r);
      shows[j][id] += 1;
    }
  }
  std::vector<std::pair<double, int>> scored;
  for (std::uint64_t i = half; i < s.rows(); ++i) {
    std::uint64_t r;
    const Shard& sh = s.shard_of(i, r);
    double score = 0;
    for (std::size_t j = 0; j < tables.size(); ++j) {
      std::uint64_t id = sh.id(tables[j], r);
      double ctr = (clicks[j][id] + 1) / (shows[j][id] + 4);
      score += std::log(ctr / (1 - ctr));
    }
    scored.push_back({score, sh.label(r)});
  }
  std::sort(scored.begin(), scored.end());
  double pos = 0, neg = 0, rank_sum = 0;
  for (std::size_t i = 0; i < scored.size(); ++i) {
    if (scored[i].second) {
      pos += 1;
      rank_sum += static_cast<double>(i + 1);
    } else {
      neg += 1;
    }
  }
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

TEST_F(Synthetic, LabelsAreLearnableAndClickRateIsOnTarget) {
  GenOptions g;
  g.rows = 100000;
  g.scale = 0.01;
  Dataset ds = Dataset::open(gen_and_prep(g, "criteo"));
  DatasetStats st = compute_stats(ds, {});
  EXPECT_NEAR(st.positive_rate, 0.25, 0.03);
  EXPECT_GT(holdout_auc(ds, {0, 1, 5, 7, 13, 16}), 0.65);

  g.like = SourceFormat::kAvazu;
  Dataset av = Dataset::open(gen_and_prep(g, "avazu"));
  EXPECT_EQ(av.num_tables(), 23);
  EXPECT_NEAR(compute_stats(av, {}).positive_rate, 0.17, 0.03);
  EXPECT_GT(holdout_auc(av, {0, 1, 4, 7, 11}), 0.6);
  // Ten days of hours: every hour of the day and every weekday occurs.
  EXPECT_EQ(av.manifest().tables[21].values_seen, 24u);
  EXPECT_EQ(av.manifest().tables[22].values_seen, 7u);
}

TEST_F(Synthetic, CalibratedDefaultsTrackTheRealKaggleSample) {
  fs::path real = test::real_sample("train.tiny.csv");
  if (real.empty()) GTEST_SKIP() << "../shared/data/real/train.tiny.csv not present";
  PrepOptions p;
  p.format = SourceFormat::kCriteoCsv;
  p.inputs = {real};
  p.output = dir_ / "real";
  prepare_dataset(p);
  GenOptions g;
  g.rows = 2048 * 8;
  Dataset syn = Dataset::open(gen_and_prep(g, "syn"));
  StatsOptions so;
  so.window = 1024;
  DatasetStats a = compute_stats(Dataset::open(p.output), so), b = compute_stats(syn, so);
  double log_err = 0;
  for (std::size_t t = 0; t < 26; ++t) {
    log_err += std::abs(std::log((b.tables[t].window_distinct + 1e-3) / (a.tables[t].window_distinct + 1e-3)));
    EXPECT_NEAR(b.tables[t].missing_share, a.tables[t].missing_share, 0.05) << a.tables[t].name;
  }
  EXPECT_LT(log_err / 26, 0.3) << "mean |log ratio| of distinct values per 1024-row window";
}

}  // namespace
}  // namespace ember::data
