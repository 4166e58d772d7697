#include "ember/data/dataset.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"

namespace ember::data {
namespace {

constexpr std::uint64_t kAlign = 64;
std::uint64_t align_up(std::uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::uint64_t parse_hex64(const std::string& s, const std::string& origin) {
  if (s.size() != 16) throw DataError(origin + ": bad checksum '" + s + "'");
  return std::stoull(s, nullptr, 16);
}

}  // namespace

Split parse_split(const std::string& name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kSplitNames[i]) return static_cast<Split>(i);
  }
  throw ConfigError("unknown split '" + name + "' (train, val, test)");
}

void Manifest::require_fixed_tables(const std::string& dataset, const std::string& who) const {
  if (!hashed_ids) return;
  throw ConfigError("dataset " + dataset + " has hashed ids (ember-data prep --ids hash): " + who +
                    " needs tables of a fixed size, prepared with a vocabulary (--ids vocabulary)");
}

std::uint64_t Manifest::total_table_rows() const {
  std::uint64_t n = 0;
  for (const auto& t : tables) n += t.rows;
  return n;
}

std::vector<std::uint64_t> Manifest::table_offsets() const {
  std::vector<std::uint64_t> off(tables.size());
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    off[i] = acc;
    acc += tables[i].rows;
  }
  return off;
}

std::string Manifest::to_json() const {
  nlohmann::ordered_json j;
  j["format_version"] = format_version;
  j["source_format"] = source_format;
  j["inputs"] = inputs;
  j["rows"] = {{"train", rows[0]}, {"val", rows[1]}, {"test", rows[2]}};
  j["has_labels"] = has_labels;
  j["dense_features"] = dense_names.size();
  j["dense_names"] = dense_names;
  j["dense_transform"] = "log1p(max(x, 0)); missing = 0";
  auto& tj = j["tables"] = nlohmann::ordered_json::array();
  for (const auto& t : tables) {
    nlohmann::ordered_json tab = {{"name", t.name}, {"rows", t.rows}, {"id_bytes", t.id_bytes}, {"values_seen", t.values_seen}};
    if (multi_hot) {
      tab["max_bag"] = t.max_bag;
      tab["mean_bag"] = t.mean_bag;
    }
    tj.push_back(std::move(tab));
  }
  if (multi_hot) {
    j["bags"] =
        std::string("ids per (sample, table): offsets u32[rows * tables + 1] then ids ") + (hashed_ids ? "u64" : "u32") + ", sample-major";
    j["multi_hot_sep"] = std::string(1, multi_hot_sep);
  }
  if (hashed_ids) {
    j["ids"] = "hash";
    j["hashed_ids"] = {{"id", "table << 56 | mix55(value key) (values of at most 55 bits), or table << 56 | 1 << 55 | mix55(fold55(key))"},
                       {"wide_values", wide_values},
                       {"collisions", hash_collisions}};
  } else {
    j["ids"] = "vocabulary";
    j["reserved_rows"] = {{"missing", 0}, {"oov", 1}};
  }
  j["min_count"] = min_count;
  j["shuffled"] = shuffled;
  j["seed"] = seed;
  j["bad_lines_skipped"] = bad_lines_skipped;
  j["shard_rows"] = shard_rows;
  auto& sj = j["shards"];
  for (int s = 0; s < 3; ++s) {
    auto arr = nlohmann::ordered_json::array();
    for (const auto& sh : shards[s]) {
      arr.push_back({{"file", sh.file}, {"rows", sh.rows}, {"bytes", sh.bytes}, {"checksum", hex64(sh.checksum)}});
    }
    sj[kSplitNames[s]] = arr;
  }
  if (vocabulary) {
    j["vocabulary"] = {{"file", vocabulary->file},
                       {"bytes", vocabulary->bytes},
                       {"checksum", hex64(vocabulary->checksum)},
                       {"keys", "criteo: the hexadecimal value as an integer; avazu: XXH3-64 of the field's bytes"}};
  }
  return j.dump(2) + "\n";
}

namespace {

// One entry of the manifest's "tables", checked against the dataset's kind (m's
// multi_hot and hashed_ids, read before it).
TableInfo table_from_json(const nlohmann::json& t, const Manifest& m, const std::string& origin) {
  TableInfo ti;
  ti.name = t.at("name").get<std::string>();
  ti.rows = t.at("rows").get<std::uint64_t>();
  ti.id_bytes = t.value("id_bytes", 4u);
  ti.values_seen = t.value("values_seen", std::uint64_t{0});
  if (ti.id_bytes != 4 && ti.id_bytes != 8) throw DataError(origin + ": table " + ti.name + ": id_bytes must be 4 or 8");
  if (m.hashed_ids && (ti.id_bytes != 8 || ti.rows != 0)) {
    throw DataError(origin + ": table " + ti.name + ": hashed ids are 8 bytes wide and the table has no row count");
  }
  if (m.multi_hot) {
    if (!m.hashed_ids && ti.id_bytes != 4) throw DataError(origin + ": table " + ti.name + ": multi-hot ids are 4 bytes");
    ti.max_bag = t.value("max_bag", 1u);
    ti.mean_bag = t.value("mean_bag", 1.0);
  }
  return ti;
}

}  // namespace

Manifest Manifest::from_json(const std::string& text, const std::string& origin) {
  Manifest m;
  try {
    auto j = nlohmann::json::parse(text);
    m.format_version = j.at("format_version").get<std::uint32_t>();
    if (m.format_version != kDatasetFormatVersion && m.format_version != kMultiHotFormatVersion) {
      throw DataError(origin + ": format_version " + std::to_string(m.format_version) + " is not supported (expected " +
                      std::to_string(kDatasetFormatVersion) + " or " + std::to_string(kMultiHotFormatVersion) + ")");
    }
    m.multi_hot = m.format_version == kMultiHotFormatVersion;
    if (m.multi_hot) {
      const std::string sep = j.value("multi_hot_sep", std::string("|"));
      if (sep.size() != 1) throw DataError(origin + ": multi_hot_sep must be one character");
      m.multi_hot_sep = sep[0];
    }
    m.source_format = j.at("source_format").get<std::string>();
    const std::string ids = j.value("ids", std::string("vocabulary"));
    if (ids != "vocabulary" && ids != "hash") throw DataError(origin + ": ids must be \"vocabulary\" or \"hash\", not \"" + ids + "\"");
    m.hashed_ids = ids == "hash";
    if (m.hashed_ids) {
      m.wide_values = j.at("hashed_ids").at("wide_values").get<std::uint64_t>();
      m.hash_collisions = j.at("hashed_ids").at("collisions").get<std::uint64_t>();
    }
    if (j.contains("inputs")) m.inputs = j.at("inputs").get<std::vector<std::string>>();
    for (int s = 0; s < 3; ++s) m.rows[s] = j.at("rows").at(kSplitNames[s]).get<std::uint64_t>();
    m.has_labels = j.value("has_labels", true);
    m.dense_names = j.at("dense_names").get<std::vector<std::string>>();
    if (j.at("dense_features").get<std::size_t>() != m.dense_names.size()) {
      throw DataError(origin + ": dense_features does not match dense_names");
    }
    for (const auto& t : j.at("tables")) m.tables.push_back(table_from_json(t, m, origin));
    m.min_count = j.value("min_count", std::uint64_t{1});
    m.shuffled = j.value("shuffled", false);
    m.seed = j.value("seed", std::uint64_t{0});
    m.bad_lines_skipped = j.value("bad_lines_skipped", std::uint64_t{0});
    m.shard_rows = j.at("shard_rows").get<std::uint64_t>();
    for (int s = 0; s < 3; ++s) {
      for (const auto& sh : j.at("shards").at(kSplitNames[s])) {
        ShardInfo si;
        si.file = sh.at("file").get<std::string>();
        si.rows = sh.at("rows").get<std::uint64_t>();
        si.bytes = sh.at("bytes").get<std::uint64_t>();
        si.checksum = parse_hex64(sh.at("checksum").get<std::string>(), origin);
        if (si.file.find('/') != std::string::npos) throw DataError(origin + ": shard file '" + si.file + "' has a path");
        m.shards[s].push_back(si);
      }
    }
    if (j.contains("vocabulary")) {
      const auto& v = j.at("vocabulary");
      VocabularyInfo vi;
      vi.file = v.at("file").get<std::string>();
      vi.bytes = v.at("bytes").get<std::uint64_t>();
      vi.checksum = parse_hex64(v.at("checksum").get<std::string>(), origin);
      if (vi.file.empty() || vi.file.find('/') != std::string::npos)
        throw DataError(origin + ": vocabulary file '" + vi.file + "' has a path");
      m.vocabulary = vi;
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(origin + ": " + e.what());
  }
  if (m.shard_rows == 0 || !std::has_single_bit(m.shard_rows)) {
    throw DataError(origin + ": shard_rows must be a power of two");
  }
  return m;
}

ShardLayout shard_layout(std::uint64_t rows, std::uint32_t num_dense, const std::vector<std::uint32_t>& id_bytes) {
  ShardLayout l;
  l.header_bytes = align_up(sizeof(ShardHeader) + id_bytes.size() * sizeof(TableColumn) + sizeof(std::uint64_t));
  std::uint64_t off = l.header_bytes;
  l.labels_offset = off;
  off = align_up(off + rows);
  l.dense_offset = off;
  off = align_up(off + rows * num_dense * sizeof(float));
  for (std::uint32_t b : id_bytes) {
    l.table_offsets.push_back(off);
    off = align_up(off + rows * b);
  }
  l.file_bytes = off;
  return l;
}

ShardLayout multi_hot_shard_layout(std::uint64_t rows, std::uint32_t num_dense, std::uint32_t num_tables, std::uint64_t ids,
                                   std::uint32_t id_bytes) {
  ShardLayout l;
  l.multi_hot = true;
  l.bag_id_bytes = id_bytes;
  l.header_bytes = align_up(sizeof(ShardHeader) + sizeof(BagSection) + sizeof(std::uint64_t));
  std::uint64_t off = l.header_bytes;
  l.labels_offset = off;
  off = align_up(off + rows);
  l.dense_offset = off;
  off = align_up(off + rows * num_dense * sizeof(float));
  l.bag_offsets_offset = off;
  off = align_up(off + (rows * num_tables + 1) * sizeof(std::uint32_t));
  l.bag_ids_offset = off;
  l.bag_ids = ids;
  l.file_bytes = align_up(off + ids * id_bytes);
  return l;
}

void finish_shard_header(char* base, const ShardLayout& l, std::uint64_t rows, std::uint32_t num_dense,
                         const std::vector<std::uint32_t>& id_bytes, std::uint64_t payload_checksum) {
  std::memset(base, 0, l.header_bytes);
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof h.magic);
  h.version = l.multi_hot ? kMultiHotFormatVersion : kDatasetFormatVersion;
  h.header_bytes = static_cast<std::uint32_t>(l.header_bytes);
  h.rows = rows;
  h.file_bytes = l.file_bytes;
  h.num_dense = num_dense;
  h.num_tables = static_cast<std::uint32_t>(id_bytes.size());
  h.labels_offset = l.labels_offset;
  h.dense_offset = l.dense_offset;
  h.payload_checksum = payload_checksum;
  std::memcpy(base, &h, sizeof h);
  std::size_t covered = sizeof h;
  if (l.multi_hot) {
    BagSection b{l.bag_offsets_offset, l.bag_ids_offset, l.bag_ids, l.bag_id_bytes};
    std::memcpy(base + covered, &b, sizeof b);
    covered += sizeof b;
  } else {
    for (std::size_t t = 0; t < id_bytes.size(); ++t) {
      TableColumn c{l.table_offsets[t], id_bytes[t], 0};
      std::memcpy(base + sizeof h + t * sizeof c, &c, sizeof c);
    }
    covered += id_bytes.size() * sizeof(TableColumn);
  }
  std::uint64_t hc = checksum64(base, covered);
  std::memcpy(base + covered, &hc, sizeof hc);
}

Shard::Shard(const std::filesystem::path& path, const Manifest& m, const ShardInfo& info, bool verify_payload)
    : file_(path, MappedFile::Access::kRandom) {
  const std::string name = path.string();
  auto fail = [&](const std::string& why) { throw DataError(name + ": " + why); };
  if (file_.size() < sizeof(ShardHeader)) fail("truncated (shorter than its header)");
  ShardHeader h;
  std::memcpy(&h, file_.data(), sizeof h);
  if (std::memcmp(h.magic, kShardMagic, sizeof h.magic) != 0) fail("not an Ember shard (bad magic)");
  const std::uint32_t want = m.multi_hot ? kMultiHotFormatVersion : kDatasetFormatVersion;
  if (h.version != want) {
    fail("shard version " + std::to_string(h.version) + " is not supported here (the manifest's format is " + std::to_string(want) + ")");
  }
  std::size_t covered = sizeof h + (m.multi_hot ? sizeof(BagSection) : static_cast<std::size_t>(h.num_tables) * sizeof(TableColumn));
  if (h.num_tables != m.tables.size() || h.num_dense != m.dense_names.size()) {
    fail("has " + std::to_string(h.num_tables) + " tables and " + std::to_string(h.num_dense) + " dense features; the manifest says " +
         std::to_string(m.tables.size()) + " and " + std::to_string(m.dense_names.size()));
  }
  if (file_.size() < covered + 8) fail("truncated header");
  std::uint64_t hc;
  std::memcpy(&hc, file_.data() + covered, sizeof hc);
  if (hc != checksum64(file_.data(), covered)) fail("header checksum mismatch (corrupt file)");
  if (h.rows != info.rows) fail("has " + std::to_string(h.rows) + " rows; the manifest says " + std::to_string(info.rows));
  if (h.file_bytes != file_.size()) {
    fail("is " + std::to_string(file_.size()) + " bytes; its header says " + std::to_string(h.file_bytes) + " (truncated or extended)");
  }
  std::vector<std::uint32_t> widths;
  std::vector<TableColumn> cols;
  ShardLayout l;
  if (m.multi_hot) {
    BagSection b;
    std::memcpy(&b, file_.data() + sizeof h, sizeof b);
    if (b.ids > UINT32_MAX) fail("holds " + std::to_string(b.ids) + " ids; a shard holds at most 2^32 - 1");
    const std::uint32_t width = b.id_bytes == 0 ? 4 : static_cast<std::uint32_t>(b.id_bytes);
    if (width != m.tables.front().id_bytes) fail("bag id width differs from the manifest's");
    l = multi_hot_shard_layout(h.rows, h.num_dense, h.num_tables, b.ids, width);
    if (l.bag_offsets_offset != b.offsets_offset || l.bag_ids_offset != b.ids_offset)
      fail("bag sections are inconsistent (corrupt header)");
  } else {
    cols.resize(h.num_tables);
    std::memcpy(cols.data(), file_.data() + sizeof h, cols.size() * sizeof(TableColumn));
    for (std::size_t t = 0; t < cols.size(); ++t) {
      if (cols[t].id_bytes != m.tables[t].id_bytes) fail("table " + m.tables[t].name + ": id width differs from manifest");
      widths.push_back(cols[t].id_bytes);
    }
    l = shard_layout(h.rows, h.num_dense, widths);
    for (std::size_t t = 0; t < cols.size(); ++t) {
      if (cols[t].offset != l.table_offsets[t]) fail("section offsets are inconsistent (corrupt header)");
    }
  }
  if (l.file_bytes != h.file_bytes || l.labels_offset != h.labels_offset || l.dense_offset != h.dense_offset) {
    fail("section offsets are inconsistent (corrupt header)");
  }
  if (h.payload_checksum != info.checksum) fail("checksum differs from the manifest's");
  if (verify_payload && checksum64(file_.data() + l.header_bytes, file_.size() - l.header_bytes) != h.payload_checksum) {
    fail("payload checksum mismatch (corrupt file)");
  }
  rows_ = h.rows;
  num_dense_ = h.num_dense;
  num_tables_ = h.num_tables;
  labels_ = reinterpret_cast<const std::uint8_t*>(file_.data() + l.labels_offset);
  dense_ = reinterpret_cast<const float*>(file_.data() + l.dense_offset);
  if (m.multi_hot) {
    bag_offsets_ = reinterpret_cast<const std::uint32_t*>(file_.data() + l.bag_offsets_offset);
    bag_ids_ = file_.data() + l.bag_ids_offset;
    bag_id_bytes_ = l.bag_id_bytes;
    // Offsets index the ids: a bad one would read outside the file, so check every one
    // (4 bytes a bag, read once at open).
    const std::uint64_t n = h.rows * h.num_tables;
    if (bag_offsets_[0] != 0 || bag_offsets_[n] != l.bag_ids) fail("bag offsets do not span the ids (corrupt file)");
    for (std::uint64_t k = 0; k < n; ++k) {
      if (bag_offsets_[k] > bag_offsets_[k + 1]) {
        fail("bag offsets decrease at row " + std::to_string(k / h.num_tables) + " (corrupt file)");
      }
    }
  } else {
    for (std::size_t t = 0; t < cols.size(); ++t) cols_.push_back({file_.data() + l.table_offsets[t], widths[t]});
  }
}

void ShardColumns::clear() {
  labels.clear();
  dense.clear();
  for (auto& c : columns) c.clear();
  bag_offsets.clear();
  bag_ids.clear();
}

Shard::Shard(ShardColumns columns) : held_(std::move(columns)) {
  rows_ = held_.rows();
  num_dense_ = held_.num_dense;
  num_tables_ = held_.num_tables;
  labels_ = held_.labels.data();
  dense_ = held_.dense.data();
  if (held_.multi_hot()) {
    bag_offsets_ = held_.bag_offsets.data();
    bag_ids_ = reinterpret_cast<const char*>(held_.bag_ids.data());
    bag_id_bytes_ = 8;
  } else {
    for (const auto& c : held_.columns) cols_.push_back({reinterpret_cast<const char*>(c.data()), 8});
  }
}

Batch Batch::whole(const Shard& shard, std::uint64_t index) {
  Batch b;
  b.size_ = static_cast<std::size_t>(shard.rows());
  b.index_ = index;
  b.single_ = &shard;
  return b;
}

Dataset Dataset::without_rows(Manifest manifest) {
  Dataset d;
  d.manifest_ = std::move(manifest);
  return d;
}

SplitData::SplitData(std::vector<std::unique_ptr<Shard>> shards, std::uint64_t shard_rows)
    : shards_(std::move(shards)), shift_(std::countr_zero(shard_rows)), mask_(shard_rows - 1) {
  for (auto& s : shards_) rows_ += s->rows();
}

Dataset Dataset::open(const std::filesystem::path& dir, OpenOptions options) {
  Dataset d;
  d.dir_ = dir;
  auto manifest_path = dir / "manifest.json";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw IoError("dataset " + dir.string() + ": not a directory");
  if (!std::filesystem::exists(manifest_path, ec)) {
    throw DataError("dataset " + dir.string() + ": no manifest.json (not written by `ember-data prep`?)");
  }
  d.manifest_ = Manifest::from_json(read_file(manifest_path), manifest_path.string());
  const Manifest& m = d.manifest_;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::unique_ptr<Shard>> shards;
    std::uint64_t rows = 0;
    for (std::size_t i = 0; i < m.shards[s].size(); ++i) {
      const ShardInfo& info = m.shards[s][i];
      bool last = i + 1 == m.shards[s].size();
      if (info.rows > m.shard_rows || (!last && info.rows != m.shard_rows)) {
        throw DataError(manifest_path.string() + ": shard " + info.file + " has " + std::to_string(info.rows) +
                        " rows; every shard but the last must have shard_rows");
      }
      shards.push_back(std::make_unique<Shard>(dir / info.file, m, info, options.verify_checksums));
      rows += info.rows;
    }
    if (rows != m.rows[s]) {
      throw DataError(manifest_path.string() + ": " + kSplitNames[s] + " shards hold " + std::to_string(rows) +
                      " rows; the manifest says " + std::to_string(m.rows[s]));
    }
    d.splits_[s] = SplitData(std::move(shards), m.shard_rows);
  }
  if (m.vocabulary) {
    // Training does not read it: its size here, its checksum when it is read (Vocabulary).
    const std::filesystem::path vocab = dir / m.vocabulary->file;
    const auto size = std::filesystem::file_size(vocab, ec);
    if (ec) throw DataError(manifest_path.string() + ": vocabulary " + vocab.string() + ": " + ec.message());
    if (size != m.vocabulary->bytes) {
      throw DataError(vocab.string() + ": " + std::to_string(size) + " bytes, the manifest lists " + std::to_string(m.vocabulary->bytes));
    }
  }
  return d;
}

BatchReader::BatchReader(const SplitData& split, BatchOptions options) : split_(&split), options_(options) {
  if (options_.batch_size == 0) throw ConfigError("batch size must be positive");
  start_epoch(0);
}

std::uint64_t BatchReader::batches_per_epoch() const {
  std::uint64_t n = split_->rows();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

void BatchReader::start_epoch(std::uint64_t epoch) {
  next_ = 0;
  batch_index_ = 0;
  if (!options_.shuffle) return;
  order_.resize(split_->rows());
  std::iota(order_.begin(), order_.end(), std::uint64_t{0});
  std::mt19937_64 rng(mix64(options_.seed ^ mix64(epoch + 1)));
  // Fisher-Yates with our own bounded draws: std::shuffle's use of the engine is not
  // specified, and every worker process must see the same order.
  for (std::uint64_t i = order_.size(); i > 1; --i) {
    std::uint64_t j = rng() % i;
    std::swap(order_[i - 1], order_[j]);
  }
}

bool BatchReader::next(Batch& b) {
  std::uint64_t n = split_->rows();
  if (next_ >= n) return false;
  std::uint64_t size = std::min<std::uint64_t>(options_.batch_size, n - next_);
  if (size < options_.batch_size && options_.drop_last) return false;
  b.split_ = split_;
  b.order_ = options_.shuffle ? order_.data() : nullptr;
  b.begin_ = next_;
  b.size_ = static_cast<std::size_t>(size);
  b.index_ = batch_index_++;
  b.single_ = nullptr;
  if (!options_.shuffle) {
    std::uint64_t r0, r1;
    const Shard& first = split_->shard_of(next_, r0);
    const Shard& last = split_->shard_of(next_ + size - 1, r1);
    if (&first == &last) {
      b.single_ = &first;
      b.single_row_ = r0;
    }
  }
  next_ += size;
  return true;
}

}  // namespace ember::data
