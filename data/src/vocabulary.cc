#include "ember/data/vocabulary.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include "ember/common/binary_header.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/data/dataset.h"

namespace ember::data {
namespace {

constexpr BinaryFormat kVocabFormat{{'E', 'M', 'B', 'R', 'V', 'O', 'C', 'B'}, "vocabulary", 1, 1};

struct FileHeader {
  char magic[8];  // binary_header.h's
  std::uint32_t version;
  std::uint32_t tables;
};
struct TableHeader {
  std::uint64_t values;
  std::uint32_t key_bytes;
  std::uint32_t reserved;
};
static_assert(sizeof(FileHeader) == 16 && sizeof(TableHeader) == 16);
static_assert(offsetof(FileHeader, tables) == kBinaryHeaderBytes);

std::uint64_t pad8(std::uint64_t n) { return (n + 7) / 8 * 8; }

bool blank(std::string_view line) { return line.empty() || (line.size() == 1 && line[0] == '\r'); }

}  // namespace

Vocabulary::Vocabulary(std::vector<std::vector<Map>> maps) : maps_(std::move(maps)) {
  for (const auto& parts : maps_) {
    if (parts.empty()) throw Error("Vocabulary: a table without partitions");
  }
}

void Vocabulary::rows(int table, const std::uint64_t* keys, std::size_t n, std::uint32_t* out, std::size_t stride) const {
  constexpr std::size_t kAhead = 8;
  const auto& parts = maps_[static_cast<std::size_t>(table)];
  const auto np = static_cast<unsigned>(parts.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && keys[i + kAhead] != kMissingKey) {
      const std::uint64_t h = Map::hash(keys[i + kAhead]);
      parts[partition_of(h, np)].prefetch(h);
    }
    out[i * stride] = row(table, keys[i]);
  }
}

Vocabulary Vocabulary::read(const std::filesystem::path& file, const std::vector<std::uint64_t>& expect_rows) {
  const std::string name = file.string();
  const std::string buf = read_file(file);
  auto fail = [&](const std::string& why) -> DataError { return DataError(name + ": " + why); };
  if (buf.size() < sizeof(FileHeader) + sizeof(std::uint64_t)) throw fail("truncated vocabulary");
  read_binary_header(kVocabFormat, name, buf);
  FileHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  std::uint64_t sum;
  std::memcpy(&sum, buf.data() + buf.size() - sizeof sum, sizeof sum);
  if (sum != checksum64(buf.data(), buf.size() - sizeof sum)) throw fail("checksum mismatch (corrupt or truncated vocabulary)");
  if (!expect_rows.empty() && h.tables != expect_rows.size()) {
    throw fail("has " + std::to_string(h.tables) + " tables, the dataset " + std::to_string(expect_rows.size()));
  }
  std::vector<std::vector<Map>> maps(h.tables);
  std::size_t pos = sizeof h;
  const std::size_t end = buf.size() - sizeof sum;
  for (std::uint32_t t = 0; t < h.tables; ++t) {
    TableHeader th;
    if (end - pos < sizeof th) throw fail("truncated at table " + std::to_string(t));
    std::memcpy(&th, buf.data() + pos, sizeof th);
    pos += sizeof th;
    if (th.key_bytes != 4 && th.key_bytes != 8) throw fail("table " + std::to_string(t) + ": key width must be 4 or 8");
    if (th.values > (end - pos) / th.key_bytes) throw fail("truncated at table " + std::to_string(t));
    if (!expect_rows.empty() && th.values + kFirstValueRow != expect_rows[t]) {
      throw fail("table " + std::to_string(t) + " has " + std::to_string(th.values + kFirstValueRow) + " rows, the dataset " +
                 std::to_string(expect_rows[t]));
    }
    Map m(th.values);
    const char* p = buf.data() + pos;
    for (std::uint64_t i = 0; i < th.values; ++i) {
      std::uint64_t key = 0;
      if (th.key_bytes == 4) {
        std::uint32_t k32;
        std::memcpy(&k32, p + i * 4, 4);
        key = k32;
      } else {
        std::memcpy(&key, p + i * 8, 8);
      }
      if (key == kMissingKey || !m.try_emplace(key, static_cast<std::uint32_t>(kFirstValueRow + i)).second) {
        throw fail("table " + std::to_string(t) + ": key " + std::to_string(key) + " twice");
      }
    }
    pos += pad8(th.values * th.key_bytes);
    maps[t].push_back(std::move(m));
  }
  if (pos != end) throw fail("size does not match its tables");
  return Vocabulary(std::move(maps));
}

Vocabulary Vocabulary::of_dataset(const std::filesystem::path& dir, const Manifest& manifest) {
  if (!manifest.vocabulary) {
    throw DataError("dataset " + dir.string() +
                    " has no vocabulary (prepared by an older ember-data): raw values cannot be mapped to its rows; prepare it "
                    "again with ember-data prep");
  }
  const std::filesystem::path file = dir / manifest.vocabulary->file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) throw IoError(file.string() + ": " + ec.message());
  if (size != manifest.vocabulary->bytes) {
    throw DataError(file.string() + ": " + std::to_string(size) + " bytes, the manifest lists " +
                    std::to_string(manifest.vocabulary->bytes));
  }
  std::vector<std::uint64_t> rows;
  for (const auto& t : manifest.tables) rows.push_back(t.rows);
  return read(file, rows);
}

VocabularyWriter::VocabularyWriter(const std::filesystem::path& file, std::uint32_t tables) : file_(file), tables_(tables) {
  fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(errno_message("open " + file.string()));
  state_ = XXH3_createState();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
  FileHeader h{};
  write_binary_header(kVocabFormat, &h);
  h.tables = tables;
  put(&h, sizeof h);
}

VocabularyWriter::~VocabularyWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (state_ != nullptr) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void VocabularyWriter::put(const void* data, std::size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
  write_all(fd_, std::string_view(static_cast<const char*>(data), n), file_);
  bytes_ += n;
}

void VocabularyWriter::add_table(std::span<const std::uint64_t> keys) {
  if (written_ >= tables_) throw Error("VocabularyWriter: more tables than announced");
  TableHeader th{};
  th.values = keys.size();
  th.key_bytes = 4;
  for (const std::uint64_t k : keys) {
    if (k > UINT32_MAX) th.key_bytes = 8;
  }
  put(&th, sizeof th);
  buf_.assign(pad8(keys.size() * th.key_bytes), '\0');
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (th.key_bytes == 4) {
      const auto k = static_cast<std::uint32_t>(keys[i]);
      std::memcpy(buf_.data() + i * 4, &k, 4);
    } else {
      std::memcpy(buf_.data() + i * 8, &keys[i], 8);
    }
  }
  put(buf_.data(), buf_.size());
  buf_.clear();
  buf_.shrink_to_fit();
  ++written_;
}

VocabularyInfo VocabularyWriter::finish() {
  if (written_ != tables_) throw Error("VocabularyWriter: " + std::to_string(written_) + " of " + std::to_string(tables_) + " tables");
  const std::uint64_t sum = XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
  put(&sum, sizeof sum);
  if (::fsync(fd_) != 0) throw IoError(errno_message("fsync " + file_.string()));
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw IoError(errno_message("close " + file_.string()));
  }
  fd_ = -1;
  return {file_.filename().string(), bytes_, sum};
}

void encode_lines(const LineParser& parser, const Vocabulary& vocabulary, std::string_view text, EncodedRows& out, std::size_t max_bad) {
  encode_lines(
      parser, [&vocabulary](int t, const std::uint64_t* keys, std::size_t n, std::uint32_t* rows) { vocabulary.rows(t, keys, n, rows); },
      text, out, max_bad);
}

void encode_lines(const LineParser& parser, const KeyRows& rows_of, std::string_view text, EncodedRows& out, std::size_t max_bad) {
  const int nd = parser.schema().num_dense();
  const int nt = parser.schema().num_tables();
  const bool bags = parser.multi_hot();
  out.labels.clear();
  out.dense.clear();
  out.bag_sizes.clear();
  out.bag_ids.clear();
  out.ids.resize(bags ? 0 : static_cast<std::size_t>(nt));
  out.lines = 0;
  out.bad.clear();
  out.bad_count = 0;
  // Keys table by table, then the rows of each table in one prefetching sweep.
  thread_local std::vector<std::vector<std::uint64_t>> keys;
  keys.resize(static_cast<std::size_t>(nt));
  for (auto& k : keys) k.clear();
  Record rec;
  std::string err;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const char* nl = static_cast<const char*>(std::memchr(text.data() + pos, '\n', text.size() - pos));
    const std::size_t end = nl == nullptr ? text.size() : static_cast<std::size_t>(nl - text.data());
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const std::uint64_t index = out.lines++;
    if (blank(line)) continue;
    if (!parser.parse(line, rec, err)) {
      if (out.bad.size() < max_bad) out.bad.emplace_back(index, err);
      ++out.bad_count;
      continue;
    }
    out.labels.push_back(rec.label);
    out.dense.insert(out.dense.end(), rec.dense.begin(), rec.dense.begin() + nd);
    for (int t = 0; t < nt; ++t) {
      const auto ti = static_cast<std::size_t>(t);
      if (bags) {
        keys[ti].insert(keys[ti].end(), rec.bags[ti].begin(), rec.bags[ti].end());
        out.bag_sizes.push_back(static_cast<std::uint32_t>(rec.bags[ti].size()));
      } else {
        keys[ti].push_back(rec.keys[ti]);
      }
    }
  }
  const std::size_t n = out.labels.size();
  if (bags) {
    // Each table's keys to rows in one sweep, then the bags interleaved row by row.
    thread_local std::vector<std::vector<std::uint32_t>> rows;
    rows.resize(static_cast<std::size_t>(nt));
    std::size_t total = 0;
    for (int t = 0; t < nt; ++t) {
      const auto& k = keys[static_cast<std::size_t>(t)];
      auto& r = rows[static_cast<std::size_t>(t)];
      r.resize(k.size());
      rows_of(t, k.data(), k.size(), r.data());
      total += k.size();
    }
    out.bag_ids.reserve(total);
    std::vector<std::size_t> next(static_cast<std::size_t>(nt), 0);
    for (std::size_t b = 0; b < out.bag_sizes.size(); ++b) {
      const std::size_t t = b % static_cast<std::size_t>(nt);
      const auto& r = rows[t];
      out.bag_ids.insert(out.bag_ids.end(), r.begin() + static_cast<std::ptrdiff_t>(next[t]),
                         r.begin() + static_cast<std::ptrdiff_t>(next[t] + out.bag_sizes[b]));
      next[t] += out.bag_sizes[b];
    }
    return;
  }
  for (int t = 0; t < nt; ++t) {
    auto& ids = out.ids[static_cast<std::size_t>(t)];
    ids.resize(n);
    rows_of(t, keys[static_cast<std::size_t>(t)].data(), n, ids.data());
  }
}

}  // namespace ember::data
