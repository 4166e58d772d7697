// ember-data: prepare, generate and inspect datasets.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/common/option_registry.h"
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

// The report of a prep with hashed ids: no vocabulary, the collisions instead.
int print_hashed_prep(const PrepOptions& o, const PrepReport& r) {
  const Manifest& m = r.manifest;
  const double secs = r.total_seconds();
  std::cout << fmt::format("wrote {}: {} train, {} val, {} test rows; {} dynamic tables (hashed 64-bit ids), {} dense\n", o.output.string(),
                           m.rows[0], m.rows[1], m.rows[2], m.tables.size(), m.dense_names.size());
  std::cout << fmt::format("hash collisions: {} ({} distinct values wider than 55 bits, the only ones that can collide)\n",
                           m.hash_collisions, m.wide_values);
  if (r.bad_lines > 0) std::cout << fmt::format("skipped {} bad line(s)\n", r.bad_lines);
  std::cout << fmt::format(
      "{:.1f} MB in {:.2f}s ({:.0f} MB/s): parse and hash {:.2f}s, collisions {:.2f}s, lay out {:.2f}s, sync {:.2f}s; "
      "peak RSS {:.0f} MB\n",
      static_cast<double>(r.input_bytes) / 1e6, secs, static_cast<double>(r.input_bytes) / 1e6 / secs, r.pass1_seconds, r.vocab_seconds,
      r.pass2_seconds, r.finish_seconds, static_cast<double>(peak_rss_bytes()) / 1e6);
  return 0;
}

int run_prep(PrepOptions& o, const std::string& format, const std::string& ids, bool quiet, bool json) {
  o.format = parse_source_format(format);
  if (ids != "vocabulary" && ids != "hash") throw ConfigError("--ids must be vocabulary or hash, not '" + ids + "'");
  o.hashed_ids = ids == "hash";
  Progress progress(!quiet);
  Stopwatch total;
  o.on_progress = [&](const PrepProgress& p) {
    progress.maybe("prep: pass {}/{} {:5.1f}% ({:.0f} of {:.0f} MB), {} rows, {:.0f}s", p.pass, o.hashed_ids ? 1 : 2,
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
    j["ids"] = m.hashed_ids ? "hash" : "vocabulary";
    if (m.hashed_ids) j["hash_collisions"] = m.hash_collisions, j["wide_values"] = m.wide_values;
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (m.hashed_ids) return print_hashed_prep(o, r);
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
                           shards, m.total_rows(), m.tables.size(),
                           m.hashed_ids   ? "hashed ids"
                           : m.vocabulary ? "vocabulary"
                                          : "no vocabulary (an older prep)",
                           sw.seconds());
  return 0;
}

// ember-data's command line: every subcommand's options (CLI11 writes into them).
struct Flags {
  std::string log_level = "info";
  PrepOptions po;
  std::string prep_format;
  std::string prep_ids = "vocabulary";
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

// The subcommands' flags, declared once each (common/option_registry.h).
using Decl = OptionDecl<Flags>;

template <class T>
Decl flag(const char* name, T Flags::*member, const char* help) {
  return field_option<Flags>(name, member, help, kDataProgram);
}
// A flag bound to a field of a part of Flags (a subcommand's options).
template <class T>
Decl prep_flag(const char* name, T PrepOptions::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kDataProgram, [](auto& f) -> auto& { return f.po; });
}
template <class T>
Decl gen_flag(const char* name, T GenOptions::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kDataProgram, [](auto& f) -> auto& { return f.go; });
}
template <class T>
Decl stats_flag(const char* name, T StatsOptions::*member, const char* help) {
  return member_option<Flags>(
      name, member, help, kDataProgram, [](auto& f) -> auto& { return f.so; });
}

// `prep`'s input files, given after its flags.
Decl inputs_argument() {
  Decl d;
  d.flag = "inputs";
  d.help = "input files (plain or gzip), concatenated in order";
  d.programs = kDataProgram;
  d.add = [name = d.flag, help = d.help](CLI::App& app, Flags& f) { return app.add_option(name, f.prep_inputs, help); };
  d.text = [](const Flags& f) {
    std::string s;
    for (const std::string& i : f.prep_inputs) s += (s.empty() ? "" : " ") + i;
    return s;
  };
  d.value = d.text;
  return d;
}

// Registers `decls` on the subcommand, the flags named in `required` required.
CLI::App* add_subcommand(CLI::App& app, const char* name, const char* what, const std::vector<Decl>& decls, Flags& f,
                         std::initializer_list<const char*> required) {
  CLI::App* sub = app.add_subcommand(name, what);
  add_options(*sub, decls, f, kDataProgram);
  for (const char* r : required) sub->get_option(r)->required();
  return sub;
}

// `prep`: text files to a binary dataset.
CLI::App* add_prep(CLI::App& app, Flags& f) {
  const std::vector<Decl> decls = {
      flag("--format", &Flags::prep_format, "criteo (Kaggle/1TB TSV), criteo-csv (competition or DeepCTR CSV), avazu"),
      prep_flag("--output,-o", &PrepOptions::output, "dataset directory to create").default_hidden(),
      flag("--ids", &Flags::prep_ids,
           "vocabulary (a counting pass numbers each table's values) or hash (one pass: 64-bit ids, dynamic tables)"),
      prep_flag("--min-count", &PrepOptions::min_count, "values seen fewer times share one OOV row per table"),
      prep_flag("--val-fraction", &PrepOptions::val_fraction, "share of rows for validation (after train, in file order)"),
      prep_flag("--test-fraction", &PrepOptions::test_fraction, "share of rows for test (last, in file order)"),
      prep_flag("--skip-bad", &PrepOptions::skip_bad, "skip up to N malformed lines instead of failing"),
      flag("--multi-hot-sep", &Flags::prep_bag_sep, "multi-hot input: each categorical field is a bag of values split by this character"),
      prep_flag("--shuffle", &PrepOptions::shuffle, "shuffle rows (by --seed) before splitting"),
      prep_flag("--seed", &PrepOptions::seed, "seed for --shuffle"),
      prep_flag("--shard-rows", &PrepOptions::shard_rows, "rows per shard file (power of two)"),
      prep_flag("--threads", &PrepOptions::threads, "threads (0 = all cores)"),
      prep_flag("--force", &PrepOptions::overwrite, "replace an existing output directory"),
      flag("--quiet,-q", &Flags::prep_quiet, "no progress lines"),
      flag("--json", &Flags::prep_json, "print the report as one JSON object"),
      inputs_argument(),
  };
  return add_subcommand(app, "prep", "convert text files to Ember's binary dataset (two streaming passes; one with --ids hash)", decls, f,
                        {"--format", "--output", "inputs"});
}

// `gen`: synthetic data in a real dataset's text format.
CLI::App* add_gen(CLI::App& app, Flags& f) {
  const std::vector<Decl> decls = {
      flag("--like", &Flags::gen_like, "criteo or avazu"),
      gen_flag("--rows", &GenOptions::rows, "rows to write").default_hidden(),
      gen_flag("--scale", &GenOptions::scale, "multiplier of the real table cardinalities"),
      gen_flag("--alpha", &GenOptions::alpha, "one Zipf exponent for all tables (0 = calibrated per table)"),
      gen_flag("--seed", &GenOptions::seed, "random seed"),
      gen_flag("--iid", &GenOptions::iid, "independent per-table draws: no entities, sessions or drift"),
      gen_flag("--entities", &GenOptions::entities, "latent entities (0 = 1e6 x scale)"),
      gen_flag("--entity-alpha", &GenOptions::entity_alpha, "Zipf exponent of entity popularity"),
      gen_flag("--coupling", &GenOptions::coupling, "probability a table takes the entity's value"),
      gen_flag("--session", &GenOptions::session, "probability a row reuses the previous row's entity"),
      gen_flag("--drift", &GenOptions::drift, "popularity ranking positions shifted per 10,000 rows"),
      gen_flag("--new-ids", &GenOptions::new_ids, "share of values drawn from ids new in each 10,000 rows (seen there only, about twice)"),
      gen_flag("--ctr", &GenOptions::ctr, "target click rate (default 0.25 Criteo, 0.17 Avazu)").default_hidden(),
      gen_flag("--threads", &GenOptions::threads, "threads (0 = all cores; output does not depend on it)"),
      flag("--multi-hot", &Flags::gen_bags, "bags of values: 'mlperf' (MLPerf DLRM-DCNv2's 26 sizes), one size, or one per table"),
      flag("--multi-hot-dist", &Flags::gen_bag_dist, "a bag's extra values: uniform over the table, or zipf (its popularity)"),
      flag("--multi-hot-sep", &Flags::gen_bag_sep, "separator of a bag's values"),
      gen_flag("--output,-o", &GenOptions::output, "output file (.gz: gzip), or with --files a directory").default_hidden(),
      gen_flag("--files", &GenOptions::files,
               "write the rows as this many files part-000000.tsv, ... into the --output directory, each renamed into place when "
               "whole (a stream's directory, ember-worker --stream)"),
      gen_flag("--every", &GenOptions::every_seconds, "with --files: seconds between one file and the next (a stream that keeps coming)"),
      gen_flag("--force", &GenOptions::overwrite, "replace an existing output file"),
      flag("--quiet,-q", &Flags::gen_quiet, "no progress or summary"),
  };
  return add_subcommand(app, "gen", "write synthetic Criteo-like or Avazu-like data in the real text format", decls, f,
                        {"--rows", "--output"});
}

// `stats`: a dataset's skew and DoI.
CLI::App* add_stats(CLI::App& app, Flags& f) {
  const std::vector<Decl> decls = {
      flag("dir", &Flags::stats_dir, "dataset directory"),
      flag("--split", &Flags::stats_split, "train, val or test"),
      stats_flag("--workers", &StatsOptions::workers, "workers, for DoI"),
      stats_flag("--cache-ratio", &StatsOptions::cache_ratio, "cache share of each table's rows, for DoI"),
      stats_flag("--window", &StatsOptions::window, "also report distinct values per window of N consecutive rows"),
      flag("--json", &Flags::stats_json_out, "one JSON object"),
      flag("--no-verify", &Flags::stats_no_verify, "skip payload checksums"),
  };
  return add_subcommand(app, "stats", "per-table skew and Herald's degree of infrequency (DoI)", decls, f, {"dir"});
}

// `verify`: a dataset's manifest, headers and checksums.
CLI::App* add_verify(CLI::App& app, Flags& f) {
  const std::vector<Decl> decls = {flag("dir", &Flags::verify_dir, "dataset directory")};
  return add_subcommand(app, "verify", "check a dataset's manifest, headers and checksums", decls, f, {"dir"});
}

// Runs the subcommand given, its flags turned into its options.
int run_subcommand(Flags& f, const CLI::App& prep, const CLI::App& gen, const CLI::App& stats) {
  setup_logging(f.log_level);
  if (prep) {
    for (auto& i : f.prep_inputs) f.po.inputs.emplace_back(i);
    f.po.multi_hot_sep = one_char("--multi-hot-sep", f.prep_bag_sep, prep.get_option("--multi-hot-sep")->count() > 0);
    return run_prep(f.po, f.prep_format, f.prep_ids, f.prep_quiet || f.prep_json, f.prep_json);
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
  add_options(app, {flag("--log-level", &Flags::log_level, "trace, debug, info, warn, error, off")}, f, kDataProgram);
  const CLI::App* prep = add_prep(app, f);
  const CLI::App* gen = add_gen(app, f);
  const CLI::App* stats = add_stats(app, f);
  add_verify(app, f);

  if (const int status = parse_command_line(app, argc, argv, "ember-data"); status >= 0) return status;
  return guarded_main("ember-data", [&] { return run_subcommand(f, *prep, *gen, *stats); });
}
