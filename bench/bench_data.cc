// ember-bench data: ember-data prep end to end against a plain read of the same file,
// peak RSS against the vocabulary's own size, and batch reader samples/s.
#include "bench_data.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/common/error.h"
#include "ember/common/process.h"
#include "ember/data/dataset.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"

namespace ember::bench {
namespace fs = std::filesystem;

void add_data_options(CLI::App& app, DataBenchOptions& o) {
  using O = DataBenchOptions;
  const std::vector<OptionDecl<O>> decls = {
      bench_flag("--size-mb", &O::size_mb, "size of the generated Criteo-like file"),
      bench_flag("--scale", &O::scale, "table cardinalities relative to Criteo Kaggle"),
      bench_flag("--dir", &O::dir, "work directory (kept); default: a temporary one, removed after"),
      bench_flag("--repeats", &O::repeats, "repeats for medians"),
      bench_flag("--batch", &O::batch, "global batch size for the reader"),
      bench_flag("--threads", &O::threads, "prep threads (0 = all cores)"),
  };
  add_options(app, decls, o, kBenchProgram);
}

namespace {

// Plain read of the whole file (read(2) into a 1 MiB buffer, counting lines so the
// bytes are touched): the floor any text pipeline pays.
double plain_read_seconds(const fs::path& path, std::uint64_t& lines) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError(errno_message("open " + path.string()));
  std::vector<char> buf(1u << 20);
  Stopwatch sw;
  lines = 0;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      ::close(fd);
      throw IoError(errno_message("read " + path.string()));
    }
    if (n == 0) break;
    const char* p = buf.data();
    const char* end = p + n;
    while ((p = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)))) != nullptr) {
      ++lines;
      ++p;
    }
  }
  double s = sw.seconds();
  ::close(fd);
  return s;
}

// Resets VmHWM so the peak measured is prep's alone (Linux >= 4.0).
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// Reads every sample's label and every table's id, as the scheduler will.
double reader_seconds(const data::SplitData& split, data::BatchOptions bo, std::uint64_t& samples, std::uint64_t& sink) {
  data::BatchReader reader(split, bo);
  data::Batch b;
  Stopwatch sw;
  samples = 0;
  while (reader.next(b)) {
    for (std::size_t i = 0; i < b.size(); ++i) sink += b.label(i);
    samples += b.size();
  }
  return sw.seconds();
}

// The figures of a run, measured in turn and printed together at the end.
struct DataFigures {
  double file_mb = 0;
  double read_mb_s = 0;
  data::PrepReport pr;
  std::uint64_t rss_before = 0;
  double peak_rss_mb = 0, prep_mb_s = 0, vocab_mb = 0;
  // --ids hash on the same file, alternated with the vocabulary's runs: medians.
  double hash_mb_s = 0, hash_peak_rss_mb = 0;
  std::uint64_t hash_collisions = 0;
  double reader_samples_s = 0, reader_label_only_s = 0, reader_shuffled_s = 0;
  std::uint64_t sink = 0;
};

// Generates the Criteo-like input file in dir: its path.
fs::path generate_input(const DataBenchOptions& o, const fs::path& dir, const Output& out, DataFigures& f) {
  // ~240 bytes per Criteo-like line.
  data::GenOptions g;
  g.like = data::SourceFormat::kCriteoTsv;
  g.rows = static_cast<std::uint64_t>(o.size_mb * 1e6 / 240.0);
  g.scale = o.scale;
  g.seed = 7;
  g.output = dir / "criteo.tsv";
  g.overwrite = true;
  out.text(fmt::format("generating {} Criteo-like rows (scale {}) in {} ...\n", g.rows, o.scale, dir.string()));
  Stopwatch gsw;
  data::GenReport gr = data::generate(g);
  f.file_mb = static_cast<double>(gr.bytes) / 1e6;
  out.text(fmt::format("  {:.0f} MB in {:.1f}s\n", f.file_mb, gsw.seconds()));
  return g.output;
}

// One ember-data prep of the input into dir/dataset (vocabulary) or dir/hashed: its
// report and peak RSS.
data::PrepReport prep_once(const DataBenchOptions& o, const fs::path& input, const fs::path& dir, bool hashed, double& peak_rss_mb) {
  data::PrepOptions p;
  p.format = data::SourceFormat::kCriteoTsv;
  p.inputs = {input};
  p.output = dir / (hashed ? "hashed" : "dataset");
  p.overwrite = true;
  p.threads = o.threads;
  p.hashed_ids = hashed;
  reset_peak_rss();
  data::PrepReport r = data::prepare_dataset(p);
  peak_rss_mb = static_cast<double>(peak_rss_bytes()) / 1e6;
  return r;
}

// ember-data prep with a vocabulary and with hashed ids, alternated `repeats` times:
// the vocabulary dataset's path.
fs::path measure_prep(const DataBenchOptions& o, const fs::path& input, const fs::path& dir, DataFigures& f) {
  std::vector<double> vocab_s, hash_s, vocab_rss, hash_rss;
  f.rss_before = current_rss_bytes();
  for (int i = 0; i < o.repeats; ++i) {
    double rss = 0;
    f.pr = prep_once(o, input, dir, false, rss);
    vocab_s.push_back(f.pr.total_seconds());
    vocab_rss.push_back(rss);
    const data::PrepReport h = prep_once(o, input, dir, true, rss);
    hash_s.push_back(h.total_seconds());
    hash_rss.push_back(rss);
    f.hash_collisions = h.manifest.hash_collisions;
  }
  f.peak_rss_mb = median(vocab_rss);
  f.prep_mb_s = f.file_mb / median(vocab_s);
  f.hash_mb_s = f.file_mb / median(hash_s);
  f.hash_peak_rss_mb = median(hash_rss);
  f.vocab_mb = static_cast<double>(f.pr.vocab_bytes) / 1e6;
  return dir / "dataset";
}

// Batch reader samples/s over the prepared training split: labels only, then every id.
void measure_reader(const DataBenchOptions& o, const fs::path& dataset, DataFigures& f) {
  data::Dataset ds = data::Dataset::open(dataset, {false});
  const auto& train = ds.split(data::Split::kTrain);
  std::vector<double> seq, shuf, all_ids;
  std::uint64_t samples = 0;
  for (int i = 0; i < o.repeats; ++i) {
    seq.push_back(reader_seconds(train, {o.batch, false, 0, true}, samples, f.sink));
  }
  // Every id of every table too (what a scheduler reads per sample), in dataset order
  // and shuffled.
  const int nt = ds.num_tables();
  auto all_ids_seconds = [&](bool shuffle) {
    data::BatchReader reader(train, {o.batch, shuffle, 1, true});
    data::Batch b;
    Stopwatch sw;
    while (reader.next(b)) {
      for (int t = 0; t < nt; ++t) {
        for (std::size_t s = 0; s < b.size(); ++s) b.for_each_id(t, s, [&](std::uint64_t id) { f.sink += id; });
      }
    }
    return sw.seconds();
  };
  for (int i = 0; i < o.repeats; ++i) all_ids.push_back(all_ids_seconds(false));
  for (int i = 0; i < o.repeats; ++i) shuf.push_back(all_ids_seconds(true));
  f.reader_samples_s = static_cast<double>(samples) / median(all_ids);
  f.reader_label_only_s = static_cast<double>(samples) / median(seq);
  f.reader_shuffled_s = static_cast<double>(samples) / median(shuf);
}

// The figures as a table, or as one JSON row.
void print_data_figures(const Output& out, const DataFigures& f) {
  const data::PrepReport& pr = f.pr;
  out.text(fmt::format(
      "\n{:<36}{:>14}\n"
      "{:<36}{:>14.0f}\n{:<36}{:>14.0f}\n{:<36}{:>14.2f}\n"
      "{:<36}{:>14.2f}\n{:<36}{:>14.2f}\n{:<36}{:>14.2f}\n{:<36}{:>14.2f}\n"
      "{:<36}{:>14.0f}\n{:<36}{:>14.0f}\n{:<36}{:>14.2f}\n"
      "{:<36}{:>14.2f}\n{:<36}{:>14.2f}\n{:<36}{:>14.2f}\n"
      "{:<36}{:>14.0f}\n{:<36}{:>14.2f}\n{:<36}{:>14.0f}\n{:<36}{:>14}\n",
      "figure", "value", "input MB", f.file_mb, "plain read MB/s (median)", f.read_mb_s, "prep MB/s end to end (both passes)", f.prep_mb_s,
      "prep / plain read", f.prep_mb_s / f.read_mb_s, "  count pass s", pr.pass1_seconds, "  vocabulary s", pr.vocab_seconds,
      "  encode pass s", pr.pass2_seconds + pr.finish_seconds, "vocabulary hash tables MB", f.vocab_mb, "peak RSS MB (prep)", f.peak_rss_mb,
      "peak RSS / vocabulary", f.peak_rss_mb / f.vocab_mb, "reader M samples/s (26 ids + label)", f.reader_samples_s / 1e6,
      "reader M samples/s (shuffled)", f.reader_shuffled_s / 1e6, "reader M samples/s (labels only)", f.reader_label_only_s / 1e6,
      "prep --ids hash MB/s (one pass)", f.hash_mb_s, "  hash / vocabulary", f.hash_mb_s / f.prep_mb_s, "  peak RSS MB (prep --ids hash)",
      f.hash_peak_rss_mb, "  hash collisions", f.hash_collisions));
  out.text(
      fmt::format("targets: prep >= 100 MB/s, reader >= 5 M samples/s, --ids hash >= 3x the vocabulary's MB/s; rows {}, embedding rows {}, "
                  "RSS before prep {:.0f} MB\n",
                  pr.manifest.rows[0], pr.manifest.total_table_rows(), static_cast<double>(f.rss_before) / 1e6));
  out.row({{"bench", "data"},
           {"input_mb", f.file_mb},
           {"rows", pr.manifest.rows[0]},
           {"embedding_rows", pr.manifest.total_table_rows()},
           {"read_mb_s", f.read_mb_s},
           {"prep_mb_s", f.prep_mb_s},
           {"prep_vs_read", f.prep_mb_s / f.read_mb_s},
           {"hash_prep_mb_s", f.hash_mb_s},
           {"hash_vs_vocabulary", f.hash_mb_s / f.prep_mb_s},
           {"hash_peak_rss_mb", f.hash_peak_rss_mb},
           {"hash_collisions", f.hash_collisions},
           {"pass1_s", pr.pass1_seconds},
           {"vocab_s", pr.vocab_seconds},
           {"pass2_s", pr.pass2_seconds + pr.finish_seconds},
           {"vocab_mb", f.vocab_mb},
           {"peak_rss_mb", f.peak_rss_mb},
           {"reader_samples_s", f.reader_samples_s},
           {"reader_shuffled_samples_s", f.reader_shuffled_s},
           {"reader_label_only_samples_s", f.reader_label_only_s},
           {"sink", f.sink % 2}});
}

}  // namespace

int run_data_bench(const DataBenchOptions& o, bool json) {
  Output out{json};
  bool temp = o.dir.empty();
  fs::path dir = temp ? fs::temp_directory_path() / fmt::format("ember-bench-data-{}", ::getpid()) : fs::path(o.dir);
  fs::create_directories(dir);
  struct Cleanup {
    fs::path d;
    bool on;
    ~Cleanup() {
      std::error_code ec;
      if (on) fs::remove_all(d, ec);
    }
  } cleanup{dir, temp};

  DataFigures f;
  const fs::path input = generate_input(o, dir, out, f);

  std::vector<double> reads;
  std::uint64_t lines = 0;
  for (int i = 0; i < o.repeats; ++i) reads.push_back(plain_read_seconds(input, lines));
  f.read_mb_s = f.file_mb / median(reads);

  const fs::path dataset = measure_prep(o, input, dir, f);
  measure_reader(o, dataset, f);
  print_data_figures(out, f);
  return 0;
}

}  // namespace ember::bench
