// `ember-data gen`: synthetic Criteo-like or Avazu-like data in the real text formats.
//
// Model (per row r, time tau = r / rows):
//  - Each table t has C_t = max(1, round(card_t * scale)) values with bounded Zipf
//    popularity of exponent alpha_t. Rankings drift: over the file a table's ranking
//    rotates by `drift` x C_t, so the head changes over time (popularity drift).
//  - Latent entities (an ad, a user) fix the values of several tables at once: a row
//    picks an entity (Zipf over `entities`, drifting the same way), and each table with
//    more than 64 values takes the entity's value with probability `coupling`,
//    otherwise an independent draw. With probability `session` a row reuses the
//    previous row's entity (bursts of the same ad/user).
//  - The label is Bernoulli(sigmoid(bias + entity effect + value effects of a few
//    tables + dense effect)), so models can learn (AUC well above 0.5).
//  - `iid` turns entities, sessions and drift off: independent per-table Zipf draws.
// Defaults are calibrated against the real samples (see README "Synthetic data").
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ember/data/schema.h"

namespace ember::data {

struct GenOptions {
  SourceFormat like = SourceFormat::kCriteoTsv;  // kCriteoTsv or kAvazu
  std::uint64_t rows = 100000;
  double scale = 1.0;          // multiplies every table's real cardinality
  double alpha = 0.0;          // > 0: one Zipf exponent for every table; 0: calibrated per table
  std::uint64_t seed = 1;
  bool iid = false;
  std::uint64_t entities = 0;  // 0: rows / 16 (at least 16)
  double entity_alpha = 1.05;
  double coupling = 0.5;
  double session = 0.3;
  double drift = 0.2;
  double ctr = -1;             // target click rate; < 0: 0.25 Criteo, 0.17 Avazu
  int threads = 0;             // 0 = all cores; output is identical for any count
  std::filesystem::path output;  // ".gz" suffix: gzip-compressed
  bool overwrite = false;
  std::function<void(std::uint64_t rows_done)> on_progress;
};

// Real cardinalities (Criteo Kaggle C1..C26; Avazu C1..C21 then hour, weekday).
const std::vector<std::uint64_t>& real_cardinalities(SourceFormat like);

// The per-table exponents used when GenOptions::alpha is 0, fitted so that windows of
// consecutive rows hold as many distinct values as in the real samples.
std::vector<double> calibrated_alphas(SourceFormat like, double session, double coupling);

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
