// `ember-data gen`: synthetic Criteo-like or Avazu-like data in the real text formats.
//
// Model (per row r, time tau = r / rows):
//  - Each table t has C_t = max(1, round(card_t * scale)) values with bounded Zipf
//    popularity of exponent alpha_t. Rankings drift with time: every 10,000 rows the
//    entity ranking shifts by `drift` positions and each table's by the same share of
//    its size, so the head changes (popularity drift).
//  - Latent entities (an ad, a user) fix the values of several tables at once: a row
//    picks an entity (Zipf over `entities`, drifting the same way, so an entity's rows
//    come in a burst around its peak), and each table with at least 4000 real values takes
//    the entity's own value with probability `coupling`, otherwise an independent
//    draw. With probability `session` a row reuses the previous row's entity.
//  - The label is Bernoulli(sigmoid(bias + entity effect + value effects of a few
//    tables + dense effect)), so models can learn (AUC well above 0.5).
//  - `iid` turns entities, sessions and drift off: independent per-table Zipf draws.
//  - `new_ids` R: with probability R a value is one of the current window's fresh ones.
// Defaults are calibrated against the real samples (docs/data.md "Calibration").
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ember/data/schema.h"

namespace ember::data {

enum class MultiHotDist {
  kUniform,  // the extra values of a bag: uniform over the table (MLPerf's default)
  kZipf,     // drawn like the row's value: the table's skewed popularity
};
MultiHotDist parse_multi_hot_dist(const std::string& name);  // uniform, zipf; ConfigError

// MLPerf Training DLRM-DCNv2's bag sizes of Criteo's 26 tables (214 ids a sample).
const std::vector<std::uint32_t>& mlperf_bag_sizes();
// `--multi-hot`: "mlperf", one size for every table, or one size per drawn table (26
// Criteo, 21 Avazu), comma-separated. ConfigError naming what is wrong.
std::vector<std::uint32_t> parse_bag_sizes(const std::string& text, SourceFormat like);

struct GenOptions {
  SourceFormat like = SourceFormat::kCriteoTsv;  // kCriteoTsv or kAvazu
  std::uint64_t rows = 100000;
  double scale = 1.0;  // multiplies every table's real cardinality
  double alpha = 0.0;  // > 0: one Zipf exponent for every table; 0: calibrated per table
  std::uint64_t seed = 1;
  bool iid = false;
  std::uint64_t entities = 0;  // 0: 1e6 x scale (at least 16)
  double entity_alpha = 1.05;
  double coupling = 0.7;  // calibrated: docs/data.md "Calibration"
  double session = 0.02;
  double drift = 1.0;  // ranking positions shifted per 10,000 rows
  // Ids that keep coming: a share of the values each window of 10,000 rows draws comes
  // from that window's own fresh values (past the table's, each drawn about twice in
  // the window, never again): distinct ids grow with the rows, as in production data.
  double new_ids = 0;
  double ctr = -1;  // target click rate; < 0: 0.25 Criteo, 0.17 Avazu
  // Multi-hot: a bag of this many values per drawn table (empty: one value, or none when
  // missing). A bag's first value is the row's usual draw (entity, label signal); the
  // others come from `multi_hot_dist`. Values are joined by `multi_hot_sep`.
  std::vector<std::uint32_t> multi_hot;
  MultiHotDist multi_hot_dist = MultiHotDist::kUniform;
  char multi_hot_sep = '|';
  int threads = 0;               // 0 = all cores; output is identical for any count
  std::filesystem::path output;  // ".gz" suffix: gzip-compressed
  // > 1: `output` is a directory of this many plain files (part-000000.tsv, ...) of
  // rows / files rows each, in order, each renamed into place when whole, `every_seconds`
  // apart: a stream's directory (data/stream.h).
  std::uint64_t files = 1;
  double every_seconds = 0;
  bool overwrite = false;
  std::function<void(std::uint64_t rows_done)> on_progress;
};

// Real cardinalities (Criteo Kaggle C1..C26; Avazu C1..C21 then hour, weekday).
const std::vector<std::uint64_t>& real_cardinalities(SourceFormat like);

// Values the generator draws for a table of real cardinality `card` at `scale` (>= 1).
std::uint64_t scaled_cardinality(std::uint64_t card, double scale);

// Rows of each table of generated data's full key space: the values the generator can
// emit (Avazu's hour and weekday are not scaled) plus the reserved missing and OOV rows.
// A short generated file holds only part of each table; simulators size caches by this.
std::vector<std::uint64_t> synthetic_table_rows(SourceFormat like, double scale);

// The per-table exponents used when GenOptions::alpha is 0, fitted so that windows of
// consecutive rows hold as many distinct values as in the real samples, given the
// options' entities, coupling and sessions.
std::vector<double> calibrated_alphas(const GenOptions& options);
std::uint64_t entity_count(const GenOptions& options);

struct GenReport {
  std::uint64_t rows = 0;
  std::uint64_t bytes = 0;
  std::uint64_t positives = 0;
  std::vector<std::uint64_t> cardinalities;
  std::vector<double> alphas;
};

// Writes the file atomically (temp + rename). Throws ConfigError / IoError.
GenReport generate(const GenOptions& options);

}  // namespace ember::data
