// ember-export: a whole PS checkpoint with the workers' dense state of its iteration, or
// the final model of --dump-dir, written as a directory PyTorch loads (export.h).
#include "ember/serve/export.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/hashed_ids.h"
#include "ember/data/stream.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/shard_store.h"
#include "ember/worker/dense_state.h"
#include "model_source.h"

namespace ember::serve {

using worker::DenseState;

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// A parameter's name as a TorchScript attribute ("bottom.0.weight" -> "bottom_0_weight").
std::string attribute_name(std::string name) {
  for (char& ch : name) {
    if (ch == '.') ch = '_';
  }
  return name;
}

// Lines computing `out` from `in` through the Linear layers of an nn::Sequential built by
// model.cc's mlp() under `prefix` (Linear i at index 2i, a ReLU after each but the
// last, and after the last with `relu_last`).
std::string mlp_code(const std::string& prefix, const std::string& in, const std::string& out, std::size_t layers, bool relu_last) {
  std::string s, cur = in;
  for (std::size_t i = 0; i < layers; ++i) {
    const std::string p = "self." + prefix + "_" + std::to_string(2 * i) + "_";
    s += "    " + out + " = torch.linear(" + cur + ", " + p + "weight, " + p + "bias)\n";
    if (i + 1 < layers || relu_last) s += "    " + out + " = torch.relu(" + out + ")\n";
    cur = out;
  }
  if (layers == 0) s += "    " + out + " = " + in + "\n";
  return s;
}

// TorchScript of CtrModel::forward for each kind (model.cc), the same ops in the same order.
std::string forward_code(const ModelConfig& c) {
  std::string s = "def forward(self, dense, emb):\n";
  const std::string flat = "    x = torch.cat([dense, torch.flatten(emb, 1)], 1)\n";
  if (c.kind == "wide-deep") {
    s += flat;
    s += "    w = torch.linear(x, self.wide_weight, self.wide_bias)\n";
    s += mlp_code("deep", "x", "h", c.deep.size() + 1, false);
    s += "    return torch.squeeze(w + h, 1)\n";
  } else if (c.kind == "deepfm") {
    s += flat;
    s += "    s = torch.sum(emb, 1)\n";
    s += "    fm = 0.5 * torch.sum(s * s - torch.sum(emb * emb, 1), 1, True)\n";
    s += "    l = torch.linear(x, self.linear_weight, self.linear_bias)\n";
    s += mlp_code("deep", "x", "h", c.deep.size() + 1, false);
    s += "    return torch.squeeze(l + fm + h, 1)\n";
  } else if (c.kind == "dcn") {
    s += flat;
    s += "    c = x\n";
    for (int l = 0; l < c.cross_layers; ++l) {
      const std::string n = std::to_string(l);
      s += "    c = x * torch.matmul(c, self.cross_w" + n + ") + self.cross_b" + n + " + c\n";
    }
    s += mlp_code("deep", "x", "h", c.deep.size(), true);
    s += "    o = torch.linear(torch.cat([c, h], 1), self.out_weight, self.out_bias)\n";
    s += "    return torch.squeeze(o, 1)\n";
  } else if (c.kind == "dcnv2") {
    if (c.num_dense > 0) {
      s += mlp_code("bottom", "dense", "b", c.bottom.size() + 1, true);
      s += "    x = torch.cat([b, torch.flatten(emb, 1)], 1)\n";
    } else {
      s += "    x = torch.flatten(emb, 1)\n";
    }
    s += "    c = x\n";
    for (int l = 0; l < c.cross_layers; ++l) {
      const std::string v = "self.cross_v" + std::to_string(l) + "_", w = "self.cross_w" + std::to_string(l) + "_";
      s += "    c = x * torch.linear(torch.linear(c, " + v + "weight), " + w + "weight, " + w + "bias) + c\n";
    }
    s += mlp_code("top", "c", "h", c.top.size() + 1, false);
    s += "    return torch.squeeze(h, 1)\n";
  } else if (c.kind == "dlrm") {
    if (c.num_dense > 0) {
      s += mlp_code("bottom", "dense", "b", c.bottom.size() + 1, true);
      s += "    z = torch.cat([torch.unsqueeze(b, 1), emb], 1)\n";
    } else {
      s += "    z = emb\n";
    }
    s += "    dots = torch.bmm(z, torch.transpose(z, 1, 2))\n";
    s += "    pairs = dots[:, self.li, self.lj]\n";
    s += c.num_dense > 0 ? "    t = torch.cat([b, pairs], 1)\n" : "    t = pairs\n";
    s += mlp_code("top", "t", "h", c.top.size() + 1, false);
    s += "    return torch.squeeze(h, 1)\n";
  } else {
    throw ConfigError("model '" + c.kind + "' cannot be exported");
  }
  return s;
}

const char* kProbabilityCode =
    "def probability(self, dense, emb):\n"
    "    return torch.sigmoid(self.forward(dense, emb))\n";

json read_json(const fs::path& file) {
  try {
    return json::parse(read_file(file));
  } catch (const json::exception& e) {
    throw DataError(file.string() + ": " + e.what());
  }
}

Source from_dump(const fs::path& dir) {
  Source s;
  const fs::path meta_file = dir / "model.json";
  if (!fs::exists(meta_file)) throw DataError(dir.string() + ": no model.json (not an ember-worker --dump-dir)");
  const json meta = read_json(meta_file);
  if (!meta.contains("model_config")) {
    throw DataError(meta_file.string() + ": written by an older ember-worker, without the model's layers; dump the model again");
  }
  s.config = worker::parse_model_config(meta.at("model_config").dump(), meta_file.string());
  std::uint64_t num_keys = 0;
  try {
    num_keys = meta.at("num_keys").get<std::uint64_t>();
    s.iterations = meta.at("iterations").get<std::int64_t>();
    if (meta.at("dim").get<std::uint32_t>() != s.config.dim) throw DataError(meta_file.string() + ": dim differs from the model's");
  } catch (const json::exception& e) {
    throw DataError(meta_file.string() + ": " + e.what());
  }
  const std::string dense = read_file(dir / "dense.bin");
  if (dense.size() % 4 != 0) throw DataError((dir / "dense.bin").string() + ": not float32 values");
  std::vector<float> values(dense.size() / 4);
  std::memcpy(values.data(), dense.data(), dense.size());
  s.model = worker::make_model(s.config);
  try {
    worker::load_flat_params(*s.model, values);
  } catch (const DataError& e) {
    throw DataError((dir / "dense.bin").string() + ": " + e.what());
  }
  auto rows = std::make_shared<std::string>(read_file(dir / "rows.bin"));
  const std::uint64_t dim = s.config.dim;
  if (rows->size() != num_keys * dim * 4) {
    throw DataError((dir / "rows.bin").string() + ": " + std::to_string(rows->size()) + " bytes, not " + std::to_string(num_keys) +
                    " rows of dim " + std::to_string(dim) + " (truncated?)");
  }
  s.num_keys = s.rows_stored = num_keys;
  if (meta.contains("slot_ids")) {
    const fs::path f = dir / meta.at("slot_ids").get<std::string>();
    const std::string ids = read_file(f);
    if (ids.size() != num_keys * 8)
      throw DataError(f.string() + ": " + std::to_string(ids.size()) + " bytes, not " + std::to_string(num_keys) + " ids");
    s.slot_ids.resize(num_keys);
    std::memcpy(s.slot_ids.data(), ids.data(), ids.size());
  }
  s.row = [rows = rows.get(), dim](std::uint64_t key) { return reinterpret_cast<const float*>(rows->data()) + key * dim; };
  s.keep = rows;
  s.what = "the final model in " + dir.string() + " (" + std::to_string(s.iterations) + " iterations)";
  s.origin = {{"kind", "dump"}, {"path", dir.string()}};
  return s;
}

}  // namespace

fs::path dense_file_of(const fs::path& dense, std::int64_t iteration) {
  if (fs::is_regular_file(dense)) return dense;
  if (!fs::is_directory(dense)) throw ConfigError("--dense " + dense.string() + ": no such file or directory");
  const std::string probe = worker::dense_checkpoint_file("", 0, static_cast<std::uint64_t>(iteration)).filename().string();
  const std::string suffix = probe.substr(probe.find("-iter-"));  // -iter-NNNNNNNNN.pt
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dense)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("worker-", 0) == 0 && n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(e.path());
  }
  if (found.empty()) {
    throw DataError(dense.string() + " holds no worker's dense state of iteration " + std::to_string(iteration) + " (worker-R" + suffix +
                    "): the workers' part of that checkpoint is missing");
  }
  std::sort(found.begin(), found.end());  // the replicas are identical: worker 0's, else the lowest
  return found.front();
}

CheckpointPaths checkpoint_paths(const fs::path& checkpoint, fs::path dense) {
  fs::path ps_root = checkpoint;
  if (fs::is_directory(checkpoint / "ps")) {
    // A launcher's --checkpoint-dir: the shards' part in ps/, the workers' in dense/.
    ps_root = checkpoint / "ps";
    if (dense.empty()) dense = checkpoint / "dense";
  }
  if (dense.empty()) {
    throw ConfigError("--dense: where the workers wrote their dense state (ember-worker --checkpoint-dir) is needed with --checkpoint " +
                      checkpoint.string());
  }
  return {ps_root, dense};
}

Source from_checkpoint(const fs::path& checkpoint, const fs::path& dense_dir) {
  Source s;
  const auto [ps_root, dense] = checkpoint_paths(checkpoint, dense_dir);
  const ps::RestorePlan plan = ps::plan_restore(ps_root);
  for (const auto& why : plan.skipped) spdlog::warn("passed over {}", why);
  const auto info = ps::ShardStore::checkpoint_info(plan.files.front());
  if (info.iteration < 0) throw DataError(plan.dir.string() + ": a checkpoint of no iteration (before any commit, or an old format)");
  const fs::path dense_file = dense_file_of(dense, info.iteration);
  DenseState st = worker::read_dense_state(dense_file);
  try {
    const auto it = st.meta.at("iteration").get<std::int64_t>();
    const auto keys = st.meta.at("num_keys").get<std::uint64_t>();
    const auto dim = st.meta.at("dim").get<std::uint32_t>();
    if (it != info.iteration || keys != info.num_keys || dim != info.dim || st.model.dim != info.dim) {
      throw DataError(dense_file.string() + " (iteration " + std::to_string(it) + ", " + std::to_string(keys) + " rows of dim " +
                      std::to_string(dim) + ") does not belong to " + plan.dir.string() + " (iteration " + std::to_string(info.iteration) +
                      ", " + std::to_string(info.num_keys) + " rows of dim " + std::to_string(info.dim) + ")");
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(dense_file.string() + ": " + e.what());
  }
  s.config = st.model;
  s.model = st.weights;
  s.dense_dir = dense;
  // Each shard's rows into a store of its own, in the job's layout (ember-serve applies
  // the shards' deltas by slot): the ps module's own loading, and its first-touch
  // initialization for the rows no checkpoint holds (never trained or read: they hold
  // their initial values from the PS's seed).
  ps::ShardStore::check_checkpoint_set(plan.files);
  ps::StoreConfig sc;
  sc.num_keys = info.num_keys;
  sc.dim = info.dim;
  sc.shards = info.shards;
  sc.seed = st.ps_seed;
  sc.optimizer.kind = info.optimizer;
  sc.hashed_ids = info.hashed_ids;  // the shards' files name each slot's id
  auto stores = std::make_shared<std::vector<ps::ShardStore>>();
  stores->reserve(info.shards);
  for (std::uint32_t shard = 0; shard < info.shards; ++shard) {
    sc.shard = shard;
    stores->emplace_back(sc);
  }
  s.shard_sums.assign(info.shards, 0);
  for (const fs::path& f : plan.files) {
    const std::uint32_t shard = ps::ShardStore::checkpoint_info(f).shard;
    s.shard_sums[shard] = ps::checkpoint_checksum(f);
    ps::ShardStore& store = (*stores)[shard];
    s.iterations = store.load({f}, true);
    s.rows_stored += store.initialized_rows();
  }
  if (sc.hashed_ids) {
    s.slot_ids.resize(info.num_keys);
    for (std::uint64_t key = 0; key < info.num_keys; ++key) s.slot_ids[key] = (*stores)[ps::owner_shard(key, info.shards)].slot_id(key);
  }
  s.num_keys = info.num_keys;
  s.shards = info.shards;
  s.row = [stores = stores.get()](std::uint64_t key) {
    return (*stores)[ps::owner_shard(key, static_cast<std::uint32_t>(stores->size()))].row(key);
  };
  s.keep = stores;
  s.what = "checkpoint " + plan.dir.string() + " (iteration " + std::to_string(s.iterations) + ") with " + dense_file.string();
  s.origin = {{"kind", "checkpoint"}, {"path", plan.dir.string()}, {"dense", dense_file.string()}};
  return s;
}

namespace {

void write_bytes(const fs::path& file, const std::vector<char>& bytes, std::uint64_t& total) {
  write_file_atomic(file, std::string_view(bytes.data(), bytes.size()));
  total += bytes.size();
}

// The export's manifest.json: the model, the files and how to read them, and where it
// came from (`vocab_bytes`: the vocabulary file's size, when the dataset has one).
json export_manifest(const Source& s, const ExportReport& r, const data::Manifest& dm, json tables, std::size_t vocab_bytes,
                     const std::string& dataset) {
  const ModelConfig& c = s.config;
  json m;
  m["format"] = "ember-export";
  m["format_version"] = kExportFormatVersion;
  m["model"] = json::parse(worker::model_config_json(c));
  m["dim"] = c.dim;
  m["dense_model"] = {{"file", "dense.pt"},
                      {"forward", "forward(dense [B, num_dense] float32, emb [B, num_tables, dim] float32) -> logits [B]"},
                      {"probability", "probability(dense, emb) -> sigmoid(forward(dense, emb))"},
                      {"emb", "emb[:, t] = tables[t][row of the sample's value of table t]"}};
  m["tables"] = tables;
  m["dense_names"] = dm.dense_names;
  m["dense_transform"] = "log1p(max(x, 0)); missing = 0";
  m["source_format"] = dm.source_format;
  if (dm.multi_hot) m["multi_hot_sep"] = std::string(1, dm.multi_hot_sep);
  if (dm.hashed_ids) {
    // Raw values are looked up as prep --ids hash writes them (data/hashed_ids.h).
    m["ids"] = "hash";
    m["reserved_rows"] = {{"no_row", 0}};
  } else {
    m["reserved_rows"] = {{"missing", data::kMissingRow}, {"oov", data::kOovRow}};
  }
  m["min_count"] = dm.min_count;
  if (dm.vocabulary) {
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(dm.vocabulary->checksum));
    m["vocabulary"] = {{"file", data::kVocabularyFile},
                       {"bytes", vocab_bytes},
                       {"checksum", sum},
                       {"keys", "criteo: the hexadecimal value as an integer; avazu: XXH3-64 of the field's bytes"}};
  } else {
    m["vocabulary"] = nullptr;
  }
  m["iterations"] = s.iterations;
  m["rows_initial"] = r.rows - std::min(r.rows, r.rows_stored);
  m["source"] = s.origin;
  m["dataset"] = dataset;
  return m;
}

}  // namespace

// Dynamic tables: each table's ids that have rows, ascending, in NAME.ids.pt (int64), and
// their rows in NAME.pt after a zero row 0: an id without a row gets the zero vector, as
// in training. Returns the manifest's tables.
std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> ids_by_table(const Source& s, std::size_t tables) {
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> by_table(tables);
  for (std::uint64_t slot = 0; slot < s.slot_ids.size(); ++slot) {
    const std::uint64_t id = s.slot_ids[slot];
    if (id == kNoId) continue;
    const unsigned t = data::hashed_id_table(id);
    if (t >= by_table.size()) {
      throw DataError(s.what + ": slot " + std::to_string(slot) + " holds an id of table " + std::to_string(t) + ", beyond the dataset's " +
                      std::to_string(tables));
    }
    by_table[t].emplace_back(id, slot);
  }
  for (auto& live : by_table) std::sort(live.begin(), live.end());
  return by_table;
}

json write_dynamic_tables(const Source& s, const data::Manifest& dm, const fs::path& out, ExportReport& r) {
  const std::uint32_t dim = s.config.dim;
  const auto by_table = ids_by_table(s, dm.tables.size());
  json tables = json::array();
  r.rows = 0;
  for (std::size_t t = 0; t < by_table.size(); ++t) {
    const auto& live = by_table[t];
    const auto n = static_cast<std::int64_t>(live.size());
    auto rows = torch::zeros({n + 1, static_cast<std::int64_t>(dim)}, torch::kFloat32);
    auto ids = torch::empty({n}, torch::kInt64);
    float* dst = rows.data_ptr<float>();
    std::int64_t* id = ids.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      id[i] = static_cast<std::int64_t>(live[static_cast<std::size_t>(i)].first);
      std::memcpy(dst + (i + 1) * dim, s.row(live[static_cast<std::size_t>(i)].second), dim * 4);
    }
    const std::string file = "tables/" + dm.tables[t].name + ".pt", ids_file = "tables/" + dm.tables[t].name + ".ids.pt";
    write_bytes(out / file, torch::pickle_save(rows), r.bytes);
    write_bytes(out / ids_file, torch::pickle_save(ids), r.bytes);
    tables.push_back({{"name", dm.tables[t].name}, {"rows", n + 1}, {"file", file}, {"ids_file", ids_file}});
    r.rows += static_cast<std::uint64_t>(n);
  }
  r.rows_stored = r.rows;
  return tables;
}

torch::jit::Module script_model(CtrModel& model, const ModelConfig& config) {
  if (config.scripted()) {  // the user's own module, with the trained parameters
    torch::jit::Module m = worker::scripted_copy(model);
    if (!m.find_method("probability")) m.define(kProbabilityCode);
    return m;
  }
  torch::jit::Module m(c10::QualifiedName("__torch__.ember." + attribute_name(config.kind == "wide-deep" ? "wide_deep" : config.kind)));
  for (const auto& p : model.named_parameters()) {
    m.register_parameter(attribute_name(p.key()), p.value().detach().to(torch::kCPU).clone(), false);
  }
  if (config.kind == "dlrm") {
    const std::int64_t f = config.num_tables + (config.num_dense > 0 ? 1 : 0);
    const auto tri = torch::tril_indices(f, f, -1);  // as Dlrm's: each pair once
    m.register_buffer("li", tri[0].clone());
    m.register_buffer("lj", tri[1].clone());
  }
  m.define(forward_code(config));
  m.define(kProbabilityCode);
  m.eval();
  return m;
}

data::Manifest trained_on(const ExportOptions& o, std::string& vocab_bytes) {
  if (o.dataset.empty() == o.stream_format.empty())
    throw ConfigError("give --dataset (its tables and vocabulary) or, for a model trained on a stream, --stream-format");
  if (o.stream_multi_hot_sep.size() > 1 || (!o.stream_multi_hot_sep.empty() && o.stream_format.empty()))
    throw ConfigError("--stream-multi-hot-sep '" + o.stream_multi_hot_sep + "': one character, with --stream-format");
  if (!o.stream_format.empty())
    return data::stream_manifest(data::parse_source_format(o.stream_format),
                                 o.stream_multi_hot_sep.empty() ? 0 : o.stream_multi_hot_sep[0]);
  const fs::path manifest_file = o.dataset / "manifest.json";
  if (!fs::exists(manifest_file))
    throw DataError("dataset " + o.dataset.string() + ": no manifest.json (not written by `ember-data prep`?)");
  const data::Manifest dm = data::Manifest::from_json(read_file(manifest_file), manifest_file.string());
  if (dm.vocabulary) {
    data::Vocabulary::of_dataset(o.dataset, dm);  // whole and of these tables
    vocab_bytes = read_file(o.dataset / dm.vocabulary->file);
  } else {
    spdlog::warn("dataset {} has no vocabulary (prepared by an older ember-data): the export scores prepared splits only, not raw text",
                 o.dataset.string());
  }
  return dm;
}

ExportReport export_model(const ExportOptions& o) {
  if (o.checkpoint.empty() == o.dump.empty()) throw ConfigError("give either --checkpoint or --dump");
  if (o.output.empty()) throw ConfigError("--output is required");
  if (!o.dense.empty() && o.checkpoint.empty()) throw ConfigError("--dense goes with --checkpoint");
  std::string vocab_bytes;
  const data::Manifest dm = trained_on(o, vocab_bytes);
  const std::string data_name = o.dataset.empty() ? "a " + o.stream_format + " stream" : "the dataset " + o.dataset.string();
  StagingDir staging(o.output, o.overwrite);  // refuses an existing output before the work

  Source s = o.dump.empty() ? from_checkpoint(o.checkpoint, o.dense) : from_dump(o.dump);
  const ModelConfig& c = s.config;
  if (c.num_tables != dm.tables.size() || c.num_dense != dm.dense_names.size()) {
    throw DataError(s.what + ": a model of " + std::to_string(c.num_tables) + " tables and " + std::to_string(c.num_dense) +
                    " dense features, " + data_name + " has " + std::to_string(dm.tables.size()) + " and " +
                    std::to_string(dm.dense_names.size()));
  }
  if (dm.hashed_ids && s.slot_ids.empty()) {
    throw DataError(s.what + (o.dump.empty()
                                  ? ": a checkpoint of vocabulary ids, and " + data_name + "'s ids are hashed (another dataset?)"
                                  : ": no slot_ids.bin (a dump of a dataset of hashed ids names each slot's id; dump it again)"));
  }
  if (!dm.hashed_ids && s.num_keys != dm.total_table_rows()) {
    throw DataError(s.what + ": " + std::to_string(s.num_keys) + " rows, the tables of " + o.dataset.string() + " have " +
                    std::to_string(dm.total_table_rows()) + " (another dataset?)");
  }
  ExportReport r;
  r.source = s.what;
  r.iterations = s.iterations;
  r.rows = dm.total_table_rows();
  r.rows_stored = s.rows_stored;

  const fs::path out = staging.path();
  fs::create_directories(out / "tables");
  std::ostringstream dense;
  script_model(*s.model, c).save(dense);
  write_file_atomic(out / "dense.pt", dense.str());
  r.bytes += dense.str().size();

  json tables = json::array();
  const auto offsets = dm.table_offsets();
  if (dm.hashed_ids) tables = write_dynamic_tables(s, dm, out, r);
  for (std::size_t t = 0; t < dm.tables.size() && !dm.hashed_ids; ++t) {
    const auto rows = static_cast<std::int64_t>(dm.tables[t].rows);
    auto table = torch::empty({rows, static_cast<std::int64_t>(c.dim)}, torch::kFloat32);
    float* dst = table.data_ptr<float>();
    for (std::int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * c.dim, s.row(offsets[t] + static_cast<std::uint64_t>(i)), c.dim * 4);
    const std::string file = "tables/" + dm.tables[t].name + ".pt";
    write_bytes(out / file, torch::pickle_save(table), r.bytes);
    tables.push_back({{"name", dm.tables[t].name}, {"rows", dm.tables[t].rows}, {"file", file}});
  }
  if (dm.vocabulary) {
    write_file_atomic(out / data::kVocabularyFile, vocab_bytes);
    r.bytes += vocab_bytes.size();
  }
  const json m = export_manifest(s, r, dm, std::move(tables), vocab_bytes.size(), o.dataset.empty() ? data_name : o.dataset.string());
  const std::string text = m.dump(2) + "\n";
  write_file_atomic(out / "manifest.json", text);
  r.bytes += text.size();
  staging.commit();
  return r;
}

}  // namespace ember::serve
