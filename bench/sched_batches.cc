#include "sched_batches.h"

#include <fmt/format.h>
#include <unistd.h>

#include "ember/common/error.h"
#include "ember/data/prep.h"
#include "ember/data/synthetic.h"

namespace ember::bench {
namespace fs = std::filesystem;

TempDir::TempDir(const std::string& name) : path_(fs::temp_directory_path() / fmt::format("{}-{}", name, ::getpid())) {
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

data::Dataset criteo_like(const fs::path& dir, std::uint64_t rows, double scale, const Output& out) {
  return criteo_like(dir, "ds", rows, scale, "", "uniform", out);
}

namespace {

fs::path generate_criteo_like(const fs::path& dir, const std::string& name, std::uint64_t rows, double scale, const std::string& bags,
                              const std::string& dist, const Output& out) {
  data::GenOptions g;
  g.rows = rows;
  g.scale = scale;
  g.output = dir / (name + ".tsv");
  if (!bags.empty()) {
    g.multi_hot = data::parse_bag_sizes(bags, data::SourceFormat::kCriteoTsv);
    g.multi_hot_dist = data::parse_multi_hot_dist(dist);
  }
  out.text(fmt::format("generating {} Criteo-like rows (scale {}{}) ...\n", g.rows, scale,
                       bags.empty() ? "" : fmt::format(", bags {}, {} extra ids", bags, dist)));
  data::generate(g);
  return g.output;
}

}  // namespace

data::Dataset criteo_like_hashed(const fs::path& dir, const std::string& name, std::uint64_t rows, double scale, const Output& out) {
  data::PrepOptions p;
  p.inputs = {generate_criteo_like(dir, name, rows, scale, "", "uniform", out)};
  p.output = dir / name;
  p.hashed_ids = true;
  data::prepare_dataset(p);
  fs::remove(p.inputs[0]);
  return data::Dataset::open(p.output, {false});
}

data::Dataset criteo_like(const fs::path& dir, const std::string& name, std::uint64_t rows, double scale, const std::string& bags,
                          const std::string& dist, const Output& out) {
  data::PrepOptions p;
  p.inputs = {generate_criteo_like(dir, name, rows, scale, bags, dist, out)};
  p.output = dir / name;
  if (!bags.empty()) p.multi_hot_sep = '|';  // GenOptions' default separator
  data::prepare_dataset(p);
  fs::remove(p.inputs[0]);
  return data::Dataset::open(p.output, {false});
}

std::vector<scheduler::GlobalBatch> global_batches(const data::Dataset& ds, std::uint64_t samples, std::uint64_t count,
                                                   const std::vector<std::uint64_t>& table_offsets) {
  std::vector<scheduler::GlobalBatch> gb(count);
  data::BatchReader reader(ds.split(data::Split::kTrain), {static_cast<std::size_t>(samples), false, 0, true});
  data::Batch b;
  for (auto& x : gb) {
    if (!reader.next(b)) throw Error("dataset shorter than expected");
    scheduler::to_global_batch(b, table_offsets, x);
  }
  return gb;
}

}  // namespace ember::bench
