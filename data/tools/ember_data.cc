// ember-data: prepare, generate and inspect datasets.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/process.h"
#include "ember/data/dataset.h"
#include "ember/data/prep.h"
#include "ember/data/stats.h"
#include "ember/data/synthetic.h"
#include "ember/data/vocabulary.h"

namespace {

using namespace ember;
using namespace ember::data;

// Prints a progress line at most every `interval` seconds.
class Progress {
 public:
  explicit Progress(bool enabled, double interval = 2.0) : enabled_(enabled), interval_(interval) {}
  template <typename... Args>
  void maybe(fmt::format_string<Args...> f, Args&&... args) {
    if (!enabled_ || last_.seconds() < interval_) return;
    last_.reset();
    std::fputs((fmt::format(f, std::forward<Args>(args)...) + "\n").c_str(), stderr);
  }

 private:
  bool enabled_;
  double interval_;
  Stopwatch last_;
};

int run_prep(PrepOptions& o, const std::string& format, bool quiet, bool json) {
  o.format = parse_source_format(format);
  Progress progress(!quiet);
  Stopwatch total;
  o.on_progress = [&](const PrepProgress& p) {
    progress.maybe("prep: pass {}/2 {:5.1f}% ({:.0f} of {:.0f} MB), {} rows, {:.0f}s", p.pass,
                   p.bytes_total ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 0.0,
                   static_cast<double>(p.bytes_done) / 1e6, static_cast<double>(p.bytes_total) / 1e6, p.rows, total.seconds());
  };
  PrepReport r = prepare_dataset(o);
  const Manifest& m = r.manifest;
  double secs = r.total_seconds();
  for (const auto& b : r.bad_examples) std::fprintf(stderr, "skipped %s: %s\n", b.where.c_str(), b.what.c_str());
  if (json) {
    nlohmann::ordered_json j = {{"output", o.output.string()},
                                {"rows", {{"train", m.rows[0]}, {"val", m.rows[1]}, {"test", m.rows[2]}}},
                                {"bad_lines", r.bad_lines},
                                {"input_bytes", r.input_bytes},
                                {"seconds", secs},
                                {"mb_s", static_cast<double>(r.input_bytes) / 1e6 / secs},
                                {"pass1_s", r.pass1_seconds},
                                {"vocab_s", r.vocab_seconds},
                                {"pass2_s", r.pass2_seconds},
                                {"finish_s", r.finish_seconds},
                                {"vocab_mb", static_cast<double>(r.vocab_bytes) / 1e6},
                                {"vocab_file_mb", m.vocabulary ? static_cast<double>(m.vocabulary->bytes) / 1e6 : 0.0},
                                {"peak_rss_mb", static_cast<double>(peak_rss_bytes()) / 1e6}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format("wrote {}: {} train, {} val, {} test rows; {} tables ({} embedding rows), {} dense; vocabulary {:.1f} MB\n",
                           o.output.string(), m.rows[0], m.rows[1], m.rows[2], m.tables.size(), m.total_table_rows(), m.dense_names.size(),
                           m.vocabulary ? static_cast<double>(m.vocabulary->bytes) / 1e6 : 0.0);
  if (r.bad_lines > 0) std::cout << fmt::format("skipped {} bad line(s)\n", r.bad_lines);
  std::cout << fmt::format(
      "{:.1f} MB in {:.2f}s ({:.0f} MB/s): count {:.2f}s, vocabulary {:.2f}s, encode {:.2f}s, "
      "sync {:.2f}s; vocabulary {:.0f} MB, peak RSS {:.0f} MB\n",
      static_cast<double>(r.input_bytes) / 1e6, secs, static_cast<double>(r.input_bytes) / 1e6 / secs, r.pass1_seconds, r.vocab_seconds,
      r.pass2_seconds, r.finish_seconds, static_cast<double>(r.vocab_bytes) / 1e6, static_cast<double>(peak_rss_bytes()) / 1e6);
  return 0;
}

// A separator flag's one character; 0 when the flag was not given.
char one_char(const char* flag, const std::string& value, bool given) {
  if (!given) return 0;
  if (value.size() != 1) throw ConfigError(std::string(flag) + " must be one character, not '" + value + "'");
  return value[0];
}

int run_gen(GenOptions& o, const std::string& like, bool quiet) {
  o.like = parse_source_format(like);
  if (o.like == SourceFormat::kCriteoCsv) throw ConfigError("--like must be criteo or avazu");
  Progress progress(!quiet);
  Stopwatch sw;
  o.on_progress = [&](std::uint64_t done) {
    progress.maybe("gen: {} of {} rows ({:.0f}%)", done, o.rows, 100.0 * static_cast<double>(done) / static_cast<double>(o.rows));
  };
  GenReport r = generate(o);
  if (!quiet) {
    std::cout << fmt::format("wrote {}: {} rows, {:.1f} MB, click rate {:.3f}, {:.1f}s\n", o.output.string(), r.rows,
                             static_cast<double>(r.bytes) / 1e6, static_cast<double>(r.positives) / static_cast<double>(r.rows),
                             sw.seconds());
  }
  return 0;
}

int run_stats(const std::string& dir, const StatsOptions& so, bool json, bool verify) {
  Dataset ds = Dataset::open(dir, {verify});
  DatasetStats s = compute_stats(ds, so);
  std::cout << (json ? stats_json(s) + "\n" : stats_table(s));
  return 0;
}

int run_verify(const std::string& dir) {
  Stopwatch sw;
  Dataset ds = Dataset::open(dir, {true});
  const Manifest& m = ds.manifest();
  if (m.vocabulary) Vocabulary::of_dataset(dir, m);  // checksum and tables
  std::size_t shards = m.shards[0].size() + m.shards[1].size() + m.shards[2].size();
  std::cout << fmt::format("{}: ok ({} format, {} shards, {} rows, {} tables, {}; checksums verified in {:.2f}s)\n", dir, m.source_format,
                           shards, m.total_rows(), m.tables.size(), m.vocabulary ? "vocabulary" : "no vocabulary (an older prep)",
                           sw.seconds());
  return 0;
}

// ember-data's command line: every subcommand's options (CLI11 writes into them).
struct Flags {
  std::string log_level = "info";
  PrepOptions po;
  std::string prep_format;
  std::vector<std::string> prep_inputs;
  bool prep_quiet = false, prep_json = false;
  std::string prep_bag_sep;
  GenOptions go;
  std::string gen_like = "criteo";
  bool gen_quiet = false;
  std::string gen_bags, gen_bag_dist = "uniform", gen_bag_sep = "|";
  StatsOptions so;
  std::string stats_dir, stats_split = "train";
  bool stats_json_out = false, stats_no_verify = false;
  std::string verify_dir;
};

// `prep`: text files to a binary dataset.
CLI::App* add_prep(CLI::App& app, Flags& f) {
  PrepOptions& po = f.po;
  auto* prep = app.add_subcommand("prep", "convert text files to Ember's binary dataset (two streaming passes)");
  prep->add_option("--format", f.prep_format, "criteo (Kaggle/1TB TSV), criteo-csv (competition or DeepCTR CSV), avazu")->required();
  prep->add_option("--output,-o", po.output, "dataset directory to create")->required();
  prep->add_option("--min-count", po.min_count, "values seen fewer times share one OOV row per table")->capture_default_str();
  prep->add_option("--val-fraction", po.val_fraction, "share of rows for validation (after train, in file order)")->capture_default_str();
  prep->add_option("--test-fraction", po.test_fraction, "share of rows for test (last, in file order)")->capture_default_str();
  prep->add_option("--skip-bad", po.skip_bad, "skip up to N malformed lines instead of failing")->capture_default_str();
  prep->add_option("--multi-hot-sep", f.prep_bag_sep, "multi-hot input: each categorical field is a bag of values split by this character");
  prep->add_flag("--shuffle", po.shuffle, "shuffle rows (by --seed) before splitting");
  prep->add_option("--seed", po.seed, "seed for --shuffle")->capture_default_str();
  prep->add_option("--shard-rows", po.shard_rows, "rows per shard file (power of two)")->capture_default_str();
  prep->add_option("--threads", po.threads, "threads (0 = all cores)")->capture_default_str();
  prep->add_flag("--force", po.overwrite, "replace an existing output directory");
  prep->add_flag("--quiet,-q", f.prep_quiet, "no progress lines");
  prep->add_flag("--json", f.prep_json, "print the report as one JSON object");
  prep->add_option("inputs", f.prep_inputs, "input files (plain or gzip), concatenated in order")->required();
  return prep;
}

// `gen`: synthetic data in a real dataset's text format.
CLI::App* add_gen(CLI::App& app, Flags& f) {
  GenOptions& go = f.go;
  auto* gen = app.add_subcommand("gen", "write synthetic Criteo-like or Avazu-like data in the real text format");
  gen->add_option("--like", f.gen_like, "criteo or avazu")->capture_default_str();
  gen->add_option("--rows", go.rows, "rows to write")->required();
  gen->add_option("--scale", go.scale, "multiplier of the real table cardinalities")->capture_default_str();
  gen->add_option("--alpha", go.alpha, "one Zipf exponent for all tables (0 = calibrated per table)")->capture_default_str();
  gen->add_option("--seed", go.seed, "random seed")->capture_default_str();
  gen->add_flag("--iid", go.iid, "independent per-table draws: no entities, sessions or drift");
  gen->add_option("--entities", go.entities, "latent entities (0 = 1e6 x scale)")->capture_default_str();
  gen->add_option("--entity-alpha", go.entity_alpha, "Zipf exponent of entity popularity")->capture_default_str();
  gen->add_option("--coupling", go.coupling, "probability a table takes the entity's value")->capture_default_str();
  gen->add_option("--session", go.session, "probability a row reuses the previous row's entity")->capture_default_str();
  gen->add_option("--drift", go.drift, "popularity ranking positions shifted per 10,000 rows")->capture_default_str();
  gen->add_option("--ctr", go.ctr, "target click rate (default 0.25 Criteo, 0.17 Avazu)");
  gen->add_option("--threads", go.threads, "threads (0 = all cores; output does not depend on it)")->capture_default_str();
  gen->add_option("--multi-hot", f.gen_bags, "bags of values: 'mlperf' (MLPerf DLRM-DCNv2's 26 sizes), one size, or one per table");
  gen->add_option("--multi-hot-dist", f.gen_bag_dist, "a bag's extra values: uniform over the table, or zipf (its popularity)")
      ->capture_default_str();
  gen->add_option("--multi-hot-sep", f.gen_bag_sep, "separator of a bag's values")->capture_default_str();
  gen->add_option("--output,-o", go.output, "output file (.gz: gzip)")->required();
  gen->add_flag("--force", go.overwrite, "replace an existing output file");
  gen->add_flag("--quiet,-q", f.gen_quiet, "no progress or summary");
  return gen;
}

// `stats`: a dataset's skew and DoI.
CLI::App* add_stats(CLI::App& app, Flags& f) {
  StatsOptions& so = f.so;
  auto* stats = app.add_subcommand("stats", "per-table skew and Herald's degree of infrequency (DoI)");
  stats->add_option("dir", f.stats_dir, "dataset directory")->required();
  stats->add_option("--split", f.stats_split, "train, val or test")->capture_default_str();
  stats->add_option("--workers", so.workers, "workers, for DoI")->capture_default_str();
  stats->add_option("--cache-ratio", so.cache_ratio, "cache share of each table's rows, for DoI")->capture_default_str();
  stats->add_option("--window", so.window, "also report distinct values per window of N consecutive rows")->capture_default_str();
  stats->add_flag("--json", f.stats_json_out, "one JSON object");
  stats->add_flag("--no-verify", f.stats_no_verify, "skip payload checksums");
  return stats;
}

// `verify`: a dataset's manifest, headers and checksums.
CLI::App* add_verify(CLI::App& app, Flags& f) {
  auto* verify = app.add_subcommand("verify", "check a dataset's manifest, headers and checksums");
  verify->add_option("dir", f.verify_dir, "dataset directory")->required();
  return verify;
}

// Runs the subcommand given, its flags turned into its options.
int run_subcommand(Flags& f, const CLI::App& prep, const CLI::App& gen, const CLI::App& stats) {
  setup_logging(f.log_level);
  if (prep) {
    for (auto& i : f.prep_inputs) f.po.inputs.emplace_back(i);
    f.po.multi_hot_sep = one_char("--multi-hot-sep", f.prep_bag_sep, prep.get_option("--multi-hot-sep")->count() > 0);
    return run_prep(f.po, f.prep_format, f.prep_quiet || f.prep_json, f.prep_json);
  }
  if (gen) {
    if (!f.gen_bags.empty()) {
      f.go.multi_hot = parse_bag_sizes(f.gen_bags, parse_source_format(f.gen_like));
      f.go.multi_hot_dist = parse_multi_hot_dist(f.gen_bag_dist);
      f.go.multi_hot_sep = one_char("--multi-hot-sep", f.gen_bag_sep, true);
    }
    return run_gen(f.go, f.gen_like, f.gen_quiet);
  }
  if (stats) {
    f.so.split = parse_split(f.stats_split);
    return run_stats(f.stats_dir, f.so, f.stats_json_out, !f.stats_no_verify);
  }
  return run_verify(f.verify_dir);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-data: prepare Criteo/Avazu files, generate synthetic data, inspect datasets"};
  app.require_subcommand(1);
  Flags f;
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  const CLI::App* prep = add_prep(app, f);
  const CLI::App* gen = add_gen(app, f);
  const CLI::App* stats = add_stats(app, f);
  add_verify(app, f);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return guarded_main("ember-data", [&] { return run_subcommand(f, *prep, *gen, *stats); });
}
