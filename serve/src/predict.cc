// ember-predict: an export (export.h) scoring raw text through the dataset's vocabulary,
// or a prepared split.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/process.h"
#include "ember/data/hashed_ids.h"
#include "ember/data/line_parser.h"
#include "ember/data/text_input.h"
#include "ember/serve/export.h"
#include "ember/worker/embedding_path.h"
#include "ember/worker/metrics.h"
#include "ember/worker/model.h"

namespace ember::serve {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The first line of an error (LibTorch's carry a backtrace).
std::string first_line(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string s = c != nullptr ? c->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

// A file written through a temporary name beside it and renamed when complete.
class AtomicOutput {
 public:
  explicit AtomicOutput(fs::path path) : path_(std::move(path)) {
    if (path_.empty()) return;
    tmp_ = path_;
    tmp_ += ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(errno_message("open " + tmp_.string()));
  }
  ~AtomicOutput() {
    if (fd_ >= 0) {
      ::close(fd_);
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }
  void write(const std::string& text) {
    if (fd_ >= 0) write_all(fd_, text, tmp_);
  }
  void commit() {
    if (fd_ < 0) return;
    if (::fsync(fd_) != 0) throw IoError(errno_message("fsync " + tmp_.string()));
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    fs::rename(tmp_, path_, ec);
    if (ec) throw IoError("rename " + tmp_.string() + " to " + path_.string() + ": " + ec.message());
    fsync_dir(path_.has_parent_path() ? path_.parent_path() : fs::path("."));
  }

 private:
  fs::path path_, tmp_;
  int fd_ = -1;
};

// Scores batches of exactly `batch` samples (the last one smaller), whatever blocks the
// samples come in, and keeps the probabilities and labels.
class Scorer {
 public:
  Scorer(const ExportedModel& model, std::size_t batch, AtomicOutput& out)
      : model_(model), batch_(batch), out_(out), nd_(model.config().num_dense), nt_(model.config().num_tables), ids_(nt_) {}

  // Multi-hot samples: each (sample, table) bag's size, row-major, and their ids in that order.
  void add_bags(const std::uint8_t* labels, const float* dense, const std::uint32_t* sizes, const std::uint32_t* ids, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      labels_.push_back(labels[i]);
      dense_.insert(dense_.end(), dense + i * nd_, dense + (i + 1) * nd_);
      for (std::size_t t = 0; t < nt_; ++t) {
        bag_sizes_.push_back(*sizes);
        bag_ids_.insert(bag_ids_.end(), ids, ids + *sizes);
        ids += *sizes++;
      }
      if (labels_.size() == batch_) score();
    }
  }
  void add(const std::uint8_t* labels, const float* dense, const std::vector<const std::uint32_t*>& ids, std::size_t n) {
    std::size_t i = 0;
    while (i < n) {
      const std::size_t take = std::min(n - i, batch_ - labels_.size());
      labels_.insert(labels_.end(), labels + i, labels + i + take);
      dense_.insert(dense_.end(), dense + i * nd_, dense + (i + take) * nd_);
      for (std::size_t t = 0; t < nt_; ++t) ids_[t].insert(ids_[t].end(), ids[t] + i, ids[t] + i + take);
      i += take;
      if (labels_.size() == batch_) score();
    }
  }
  void finish() {
    if (!labels_.empty()) score();
  }
  const std::vector<float>& probs() const { return probs_; }
  const std::vector<std::uint8_t>& labels() const { return all_labels_; }

 private:
  void score() {
    std::vector<float> p;
    if (!bag_sizes_.empty()) {
      p = model_.predict_bags(dense_.data(), bag_sizes_, bag_ids_, labels_.size());
    } else {
      std::vector<const std::uint32_t*> cols(nt_);
      for (std::size_t t = 0; t < nt_; ++t) cols[t] = ids_[t].data();
      p = model_.predict(dense_.data(), cols, labels_.size());
    }
    std::string text;
    text.reserve(p.size() * 12);
    char buf[32];
    for (const float x : p) {
      const int len = std::snprintf(buf, sizeof buf, "%.9g\n", static_cast<double>(x));
      text.append(buf, static_cast<std::size_t>(len));
    }
    out_.write(text);
    probs_.insert(probs_.end(), p.begin(), p.end());
    all_labels_.insert(all_labels_.end(), labels_.begin(), labels_.end());
    labels_.clear();
    dense_.clear();
    for (auto& v : ids_) v.clear();
    bag_sizes_.clear();
    bag_ids_.clear();
  }

  const ExportedModel& model_;
  std::size_t batch_;
  AtomicOutput& out_;
  std::size_t nd_, nt_;
  std::vector<std::uint8_t> labels_;
  std::vector<float> dense_;
  std::vector<std::vector<std::uint32_t>> ids_;
  std::vector<std::uint32_t> bag_sizes_, bag_ids_;  // multi-hot
  std::vector<float> probs_;
  std::vector<std::uint8_t> all_labels_;
};

// Hashed ids: ids without a row (row 0) leave their bags, as in training.
void drop_rowless(data::EncodedRows& rows) {
  std::size_t read = 0, kept = 0;
  for (std::uint32_t& size : rows.bag_sizes) {
    std::uint32_t left = 0;
    for (std::uint32_t k = 0; k < size; ++k, ++read) {
      if (rows.bag_ids[read] != 0) rows.bag_ids[kept++] = rows.bag_ids[read], ++left;
    }
    size = left;
  }
  rows.bag_ids.resize(kept);
}

// Values to rows: through the vocabulary, or (hashed ids) through their ids.
data::KeyRows rows_of_model(const ExportedModel& model) {
  if (model.hashed_ids()) {
    return [&model](int t, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows) { model.rows_of_values(t, keys, n, rows); };
  }
  const data::Vocabulary& vocab = model.vocabulary();
  return [&vocab](int t, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows) { vocab.rows(t, keys, n, rows); };
}

// A parser of `format` from `first` (a file's first line), checked against the model;
// errors name `name`.
std::unique_ptr<data::LineParser> model_parser(const ExportedModel& model, data::SourceFormat format, const std::string& first,
                                               const std::string& name) {
  std::unique_ptr<data::LineParser> parser;
  try {
    parser = std::make_unique<data::LineParser>(format, first, model.multi_hot_sep());
  } catch (const DataError& e) {
    throw DataError(name + ":1: " + e.what());
  }
  if (parser->schema().num_tables() != static_cast<int>(model.config().num_tables) ||
      parser->schema().num_dense() != static_cast<int>(model.config().num_dense)) {
    throw ConfigError(name + ": format " + std::string(data::format_name(format)) + " has " +
                      std::to_string(parser->schema().num_tables()) + " tables, the model " + std::to_string(model.config().num_tables) +
                      " (--format?)");
  }
  return parser;
}

// Encoded rows into the scorer.
void add_rows(const ExportedModel& model, const data::LineParser& parser, data::EncodedRows& rows, Scorer& scorer) {
  if (parser.multi_hot() && model.hashed_ids()) drop_rowless(rows);
  if (parser.multi_hot()) {
    scorer.add_bags(rows.labels.data(), rows.dense.data(), rows.bag_sizes.data(), rows.bag_ids.data(), rows.size());
  } else {
    std::vector<const std::uint32_t*> ids;
    for (const auto& col : rows.ids) ids.push_back(col.data());
    scorer.add(rows.labels.data(), rows.dense.data(), ids, rows.size());
  }
}

// Every line of a text file through the vocabulary, as prep encodes it. Returns whether
// the file has labels.
bool score_text(const ExportedModel& model, const fs::path& file, data::SourceFormat format, Scorer& scorer) {
  const data::KeyRows rows_of = rows_of_model(model);
  const std::string name = file.string();
  data::TextInput input(file);
  const std::string first = data::read_first_line(file);
  if (first.empty()) throw DataError(name + ":1: empty file");
  const std::unique_ptr<data::LineParser> parser = model_parser(model, format, first, name);
  std::string_view block;
  std::uint64_t line_no = 1;
  bool first_block = true;
  data::EncodedRows rows;
  while (input.next(block)) {
    if (first_block && parser->header_consumed()) {
      const std::size_t nl = block.find('\n');
      block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
      line_no = 2;
    }
    first_block = false;
    data::encode_lines(*parser, rows_of, block, rows, 1);
    if (rows.bad_count > 0) throw DataError(name + ":" + std::to_string(line_no + rows.bad[0].first) + ": " + rows.bad[0].second);
    add_rows(model, *parser, rows, scorer);
    line_no += rows.lines;
    input.release_current();
  }
  return parser->has_label();
}

bool score_split(const ExportedModel& model, const fs::path& dir, const std::string& split_name, std::size_t batch, Scorer& scorer) {
  const data::Dataset ds = data::Dataset::open(dir);
  const auto& m = ds.manifest();
  m.require_fixed_tables(dir.string(), "ember-predict");
  if (m.tables.size() != model.table_rows().size()) {
    throw ConfigError("dataset " + dir.string() + " has " + std::to_string(m.tables.size()) + " tables, the model " +
                      std::to_string(model.table_rows().size()));
  }
  for (std::size_t t = 0; t < m.tables.size(); ++t) {
    if (m.tables[t].rows != model.table_rows()[t] || m.tables[t].name != model.table_names()[t]) {
      throw ConfigError("dataset " + dir.string() + ": table " + m.tables[t].name + " has " + std::to_string(m.tables[t].rows) +
                        " rows, the model's " + model.table_names()[t] + " " + std::to_string(model.table_rows()[t]) +
                        " (not the dataset it was trained on)");
    }
  }
  const data::SplitData& split = ds.split(data::parse_split(split_name));
  data::BatchOptions bo;
  bo.batch_size = batch;
  bo.drop_last = false;
  data::BatchReader reader(split, bo);
  data::Batch b;
  const std::size_t nd = model.config().num_dense, nt = model.config().num_tables;
  std::vector<std::uint8_t> labels;
  std::vector<float> dense;
  std::vector<std::vector<std::uint32_t>> ids(nt);
  std::vector<std::uint32_t> sizes, bag_ids;
  while (reader.next(b)) {
    const std::size_t n = b.size();
    if (m.multi_hot) {
      labels.resize(n);
      dense.resize(n * nd);
      sizes.clear();
      bag_ids.clear();
      for (std::size_t i = 0; i < n; ++i) {
        labels[i] = b.label(i);
        std::memcpy(&dense[i * nd], b.dense(i), nd * sizeof(float));
        for (std::size_t t = 0; t < nt; ++t) {
          sizes.push_back(b.bag_size(static_cast<int>(t), i));
          b.for_each_id(static_cast<int>(t), i, [&](std::uint64_t id) { bag_ids.push_back(static_cast<std::uint32_t>(id)); });
        }
      }
      scorer.add_bags(labels.data(), dense.data(), sizes.data(), bag_ids.data(), n);
      continue;
    }
    labels.resize(n);
    dense.resize(n * nd);
    for (auto& v : ids) v.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      labels[i] = b.label(i);
      std::memcpy(&dense[i * nd], b.dense(i), nd * sizeof(float));
      for (std::size_t t = 0; t < nt; ++t) ids[t][i] = static_cast<std::uint32_t>(b.id(static_cast<int>(t), i));
    }
    std::vector<const std::uint32_t*> cols;
    for (const auto& v : ids) cols.push_back(v.data());
    scorer.add(labels.data(), dense.data(), cols, n);
  }
  return m.has_labels;
}

}  // namespace

ExportedModel ExportedModel::load(const fs::path& dir) {
  ExportedModel m;
  m.dir_ = dir;
  const fs::path mf = dir / "manifest.json";
  if (!fs::exists(mf)) throw DataError(dir.string() + ": no manifest.json (not written by ember-export)");
  try {
    const json j = json::parse(read_file(mf));
    if (j.at("format").get<std::string>() != "ember-export") throw DataError(mf.string() + ": not an ember-export manifest");
    const auto version = j.at("format_version").get<std::uint32_t>();
    if (version != kExportFormatVersion) throw DataError(mf.string() + ": format_version " + std::to_string(version) + " is not supported");
    m.config_ = worker::parse_model_config(j.at("model").dump(), mf.string());
    m.format_ = data::parse_source_format(j.at("source_format").get<std::string>());
    m.iterations_ = j.at("iterations").get<std::int64_t>();
    if (j.contains("multi_hot_sep")) {
      const std::string sep = j.at("multi_hot_sep").get<std::string>();
      if (sep.size() != 1) throw DataError(mf.string() + ": multi_hot_sep must be one character");
      m.multi_hot_sep_ = sep[0];
    }
    std::vector<std::string> files;
    for (const auto& t : j.at("tables")) {
      m.table_names_.push_back(t.at("name").get<std::string>());
      m.table_rows_.push_back(t.at("rows").get<std::uint64_t>());
      files.push_back(t.at("file").get<std::string>());
    }
    if (m.table_names_.size() != m.config_.num_tables) throw DataError(mf.string() + ": tables do not match the model's");
    for (std::size_t t = 0; t < files.size(); ++t) {
      const fs::path f = dir / files[t];
      const std::string bytes = read_file(f);
      torch::Tensor table;
      try {
        table = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toTensor();
      } catch (const std::exception& e) {
        throw DataError(f.string() + ": not a saved tensor: " + first_line(e));
      }
      if (table.dim() != 2 || table.size(0) != static_cast<std::int64_t>(m.table_rows_[t]) ||
          table.size(1) != static_cast<std::int64_t>(m.config_.dim) || table.scalar_type() != torch::kFloat32) {
        throw DataError(f.string() + ": not a float32 tensor of " + std::to_string(m.table_rows_[t]) + " x " +
                        std::to_string(m.config_.dim));
      }
      m.tables_.push_back(table.contiguous());
    }
    if (j.value("ids", std::string("vocabulary")) == "hash") {
      std::vector<std::string> ids_files;
      for (const auto& t : j.at("tables")) ids_files.push_back(t.at("ids_file").get<std::string>());
      m.load_ids(ids_files);
    }
    if (!j.at("vocabulary").is_null()) {
      std::vector<std::uint64_t> rows = m.table_rows_;
      m.vocabulary_ =
          std::make_shared<data::Vocabulary>(data::Vocabulary::read(dir / j.at("vocabulary").at("file").get<std::string>(), rows));
    }
  } catch (const json::exception& e) {
    throw DataError(mf.string() + ": " + e.what());
  }
  const fs::path dense = dir / "dense.pt";
  try {
    m.dense_ = torch::jit::load(dense.string(), torch::kCPU);
  } catch (const std::exception& e) {
    throw DataError(dense.string() + ": not a TorchScript model: " + first_line(e));
  }
  m.dense_.eval();
  return m;
}

void ExportedModel::load_ids(const std::vector<std::string>& files) {
  for (std::size_t t = 0; t < files.size(); ++t) {
    const fs::path f = dir_ / files[t];
    const std::string bytes = read_file(f);
    torch::Tensor ids;
    try {
      ids = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toTensor().contiguous();
    } catch (const std::exception& e) {
      throw DataError(f.string() + ": not a saved tensor: " + first_line(e));
    }
    if (ids.dim() != 1 || ids.scalar_type() != torch::kInt64 || ids.size(0) + 1 != static_cast<std::int64_t>(table_rows_[t])) {
      throw DataError(f.string() + ": not the int64 ids of the table's " + std::to_string(table_rows_[t] - 1) + " rows");
    }
    U64Map<std::uint32_t>& map = id_rows_.emplace_back();
    const std::int64_t* id = ids.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < ids.size(0); ++i) map.try_emplace(static_cast<std::uint64_t>(id[i]), static_cast<std::uint32_t>(i + 1));
  }
}

void ExportedModel::rows_of_values(int table, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows) const {
  const U64Map<std::uint32_t>& map = id_rows_[static_cast<std::size_t>(table)];
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t* r = map.find(data::hashed_id(static_cast<unsigned>(table), keys[i]));
    rows[i] = r != nullptr ? *r : 0;
  }
}

const data::Vocabulary& ExportedModel::vocabulary() const {
  if (!vocabulary_) {
    throw DataError(dir_.string() +
                    " has no vocabulary (its dataset was prepared by an older ember-data): it cannot map raw text to "
                    "rows; score a prepared split (--dataset DIR --split val), or prepare the data again, train and export");
  }
  return *vocabulary_;
}

std::vector<float> ExportedModel::predict(const float* dense, const std::vector<const std::uint32_t*>& ids, std::size_t n) const {
  torch::NoGradGuard no_grad;
  const auto rows = static_cast<std::int64_t>(n);
  const auto nt = static_cast<std::int64_t>(config_.num_tables);
  const auto dim = static_cast<std::int64_t>(config_.dim);
  auto x = torch::from_blob(const_cast<float*>(dense), {rows, static_cast<std::int64_t>(config_.num_dense)}, torch::kFloat32);
  auto emb = torch::empty({rows, nt, dim}, torch::kFloat32);
  for (std::int64_t t = 0; t < nt; ++t) {
    auto idx = torch::from_blob(const_cast<std::uint32_t*>(ids[static_cast<std::size_t>(t)]), {rows}, torch::kInt32).to(torch::kInt64);
    emb.select(1, t).copy_(tables_[static_cast<std::size_t>(t)].index_select(0, idx));
  }
  auto p = torch::sigmoid(dense_.forward({x, emb}).toTensor()).contiguous();
  return std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n);
}

std::vector<float> ExportedModel::predict_bags(const float* dense, const std::vector<std::uint32_t>& sizes,
                                               const std::vector<std::uint32_t>& ids, std::size_t n) const {
  torch::NoGradGuard no_grad;
  const auto rows = static_cast<std::int64_t>(n);
  const auto nt = static_cast<std::size_t>(config_.num_tables);
  const auto dim = static_cast<std::int64_t>(config_.dim);
  auto x = torch::from_blob(const_cast<float*>(dense), {rows, static_cast<std::int64_t>(config_.num_dense)}, torch::kFloat32);
  // Every bag's rows, key position by key position as training holds them, then pooled
  // by the worker's own code: the same additions in the same order.
  std::vector<std::uint32_t> offsets(sizes.size() + 1, 0);
  for (std::size_t b = 0; b < sizes.size(); ++b) offsets[b + 1] = offsets[b] + sizes[b];
  auto flat = torch::empty({static_cast<std::int64_t>(ids.size()), dim}, torch::kFloat32);
  float* out = flat.data_ptr<float>();
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    const float* table = tables_[b % nt].data_ptr<float>();
    const std::uint64_t table_rows = table_rows_[b % nt];
    for (std::uint32_t k = offsets[b]; k < offsets[b + 1]; ++k) {
      if (ids[k] >= table_rows) {
        throw DataError("row " + std::to_string(ids[k]) + " of table " + table_names_[b % nt] + " is beyond its " +
                        std::to_string(table_rows) + " rows");
      }
      std::memcpy(out + static_cast<std::size_t>(k) * dim, table + static_cast<std::size_t>(ids[k]) * dim, dim * sizeof(float));
    }
  }
  const auto emb = worker::pool_bags(flat, offsets, config_.pooling).view({rows, static_cast<std::int64_t>(nt), dim});
  auto p = torch::sigmoid(dense_.forward({x, emb}).toTensor()).contiguous();
  return std::vector<float>(p.data_ptr<float>(), p.data_ptr<float>() + n);
}

std::vector<float> score_lines(const ExportedModel& model, std::string_view text, data::SourceFormat format) {
  const std::size_t nl = text.find('\n');
  const std::string first(text.substr(0, nl == std::string_view::npos ? text.size() : nl));
  if (first.empty()) throw DataError("request:1: no line to score");
  const std::unique_ptr<data::LineParser> parser = model_parser(model, format, first, "request");
  std::uint64_t line_no = 1;
  if (parser->header_consumed()) {
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    line_no = 2;
  }
  AtomicOutput none({});
  Scorer scorer(model, 4096, none);
  data::EncodedRows rows;
  data::encode_lines(*parser, rows_of_model(model), text, rows, 1);
  if (rows.bad_count > 0) throw DataError("request:" + std::to_string(line_no + rows.bad[0].first) + ": " + rows.bad[0].second);
  add_rows(model, *parser, rows, scorer);
  scorer.finish();
  return scorer.probs();
}

PredictReport predict(const PredictOptions& o) {
  if (o.model.empty()) throw ConfigError("--export is required");
  if (o.input.empty() == o.dataset.empty()) throw ConfigError("give a text file to score, or --dataset DIR (with --split)");
  if (o.batch == 0) throw ConfigError("--batch must be at least 1");
  Stopwatch clock;
  const ExportedModel model = ExportedModel::load(o.model);
  AtomicOutput out(o.output);
  Scorer scorer(model, o.batch, out);
  PredictReport r;
  if (!o.input.empty()) {
    const data::SourceFormat format = o.format.empty() ? model.source_format() : data::parse_source_format(o.format);
    r.labeled = score_text(model, o.input, format, scorer);
  } else {
    r.labeled = score_split(model, o.dataset, o.split, o.batch, scorer);
  }
  scorer.finish();
  out.commit();
  r.samples = scorer.probs().size();
  if (r.labeled && r.samples > 0) {
    r.auc = worker::auc(scorer.probs(), scorer.labels());
    r.logloss = worker::logloss(scorer.probs(), scorer.labels());
  }
  r.seconds = clock.seconds();
  return r;
}

}  // namespace ember::serve
