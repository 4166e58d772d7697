#include "ember/data/prep.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_sort.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "ember/common/byte_io.h"
#include "ember/common/error.h"
#include "ember/common/flat_map.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/common/process.h"
#include "ember/common/unique_fd.h"
#include "ember/data/hashed_ids.h"
#include "ember/data/line_parser.h"
#include "ember/data/text_input.h"
#include "ember/data/vocabulary.h"

namespace ember::data {
namespace {

constexpr std::size_t kMaxBadExamples = 5;

// Splits a block of whole lines into `n` pieces at line boundaries.
std::vector<std::string_view> split_block(std::string_view block, int n) {
  std::vector<std::string_view> out;
  std::size_t begin = 0;
  for (int i = 1; i <= n && begin < block.size(); ++i) {
    std::size_t end = i == n ? block.size() : block.size() * static_cast<std::size_t>(i) / static_cast<std::size_t>(n);
    if (end < begin) end = begin;
    if (end < block.size()) {
      std::size_t nl = block.find('\n', end == 0 ? 0 : end - 1);
      end = nl == std::string_view::npos ? block.size() : nl + 1;
    }
    out.push_back(block.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

// Calls f(line) for every line of `chunk` (the last may lack its newline).
template <typename F>
void for_each_line(std::string_view chunk, F&& f) {
  std::size_t pos = 0;
  while (pos < chunk.size()) {
    const char* nl = static_cast<const char*>(std::memchr(chunk.data() + pos, '\n', chunk.size() - pos));
    std::size_t end = nl == nullptr ? chunk.size() : static_cast<std::size_t>(nl - chunk.data());
    f(chunk.substr(pos, end - pos));
    pos = end + 1;
  }
}

bool blank(std::string_view line) { return line.empty() || (line.size() == 1 && line[0] == '\r'); }

// Pass-1 result of one chunk of a block.
struct CountChunk {
  std::uint64_t lines = 0;  // every line, blank and bad included (for line numbers)
  std::uint64_t good = 0;
  // keys[p * num_tables + t]: the raw keys of table t that partition p owns.
  std::vector<std::vector<std::uint64_t>> keys;
  std::vector<std::pair<std::uint64_t, std::string>> bad;  // (line index in chunk, why), capped
  std::uint64_t bad_count = 0;
  // Multi-hot: ids of each good row (all its bags), and each table's bag sizes.
  std::vector<std::uint32_t> row_ids;
  std::vector<std::uint64_t> bag_sum;
  std::vector<std::uint32_t> bag_max;
  // Hashed ids: the good rows encoded as spool records (spool_record below); `keys`
  // then holds only the wide value keys, whose ids may collide.
  std::string spool;
};

// A hashed-ids spool record: label u8, dense f32[num_dense], then one-hot ids
// u64[num_tables], or multi-hot bag sizes u32[num_tables] and ids u64[their sum].
using Vocab = Vocabulary::Map;

// Which vocabulary partition (and so which counting thread) owns a key.
inline unsigned partition_of(std::uint64_t h, unsigned parts) { return Vocabulary::partition_of(h, parts); }

// Counts keys[0..n) in `map`, prefetching a few keys ahead: the tables of big
// vocabularies miss the cache on nearly every key.
void count_keys(Vocab& map, const std::uint64_t* keys, std::size_t n) {
  constexpr std::size_t kAhead = 8;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) map.prefetch(Vocab::hash(keys[i + kAhead]));
    std::uint32_t& c = *map.try_emplace_hashed(keys[i], Vocab::hash(keys[i]), 0).first;
    if (c != UINT32_MAX) ++c;
  }
}

struct InputFile {
  std::filesystem::path path;
  std::unique_ptr<TextInput> input;
  std::unique_ptr<LineParser> parser;
};

// Output shard being written in place through a shared mapping. MappedOutput reserves
// its blocks when plan_outputs creates it: a full disk is an IoError naming the shard
// before pass 2, not a SIGBUS during it.
struct ShardOut {
  std::filesystem::path path;
  ShardLayout layout;
  std::uint64_t rows = 0;
  std::unique_ptr<MappedOutput> out;
  std::uint64_t released_rows = 0;
  std::uint64_t checksum = 0;
  bool summed = false;  // checksum taken (the hashed prep sums each shard as it lays it out)

  std::uint8_t* labels() { return reinterpret_cast<std::uint8_t*>(out->data() + layout.labels_offset); }
  float* dense() { return reinterpret_cast<float*>(out->data() + layout.dense_offset); }
  char* column(int t) { return out->data() + layout.table_offsets[static_cast<std::size_t>(t)]; }
  std::uint32_t* bag_offsets() { return reinterpret_cast<std::uint32_t*>(out->data() + layout.bag_offsets_offset); }
  char* bag_ids() { return out->data() + layout.bag_ids_offset; }
};

void drop_pages(char* begin, char* end) {
  static const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto b = (reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page;
  auto e = reinterpret_cast<std::uintptr_t>(end) / page * page;
  // Shared file mapping: dirty pages stay in the page cache and are written back; only
  // this process's mapping (and so its RSS) lets go of them.
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

class Preparer {
 public:
  explicit Preparer(const PrepOptions& o) : opt_(o), schema_(schema_for(o.format)) {
    threads_ = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, usable_cpus()));
    nt_ = schema_.num_tables();
    nd_ = schema_.num_dense();
    multi_hot_ = o.multi_hot_sep != 0;
    hashed_ = o.hashed_ids;
    validate();
  }

  PrepReport run() {
    StagingDir staging(opt_.output, opt_.overwrite);
    tbb::task_arena arena(threads_);
    open_inputs();
    if (hashed_) return run_hashed(staging, arena);
    Stopwatch sw;
    arena.execute([&] { count_pass(); });
    report_.pass1_seconds = sw.seconds();
    spdlog::debug("prep: RSS {:.0f} MB after counting (peak {:.0f} MB)", current_rss_bytes() / 1e6, peak_rss_bytes() / 1e6);
    if (total_good_ == 0) throw DataError("no data rows in the input");
    sw.reset();
    arena.execute([&] { build_vocabulary(staging.path() / kVocabularyFile); });
    report_.vocab_seconds = sw.seconds();
    spdlog::debug("prep: RSS {:.0f} MB after the vocabulary (peak {:.0f} MB)", current_rss_bytes() / 1e6, peak_rss_bytes() / 1e6);
    sw.reset();
    plan_outputs(staging.path());
    arena.execute([&] { encode_pass(); });
    report_.pass2_seconds = sw.seconds();
    spdlog::debug("prep: RSS {:.0f} MB after encoding (peak {:.0f} MB)", current_rss_bytes() / 1e6, peak_rss_bytes() / 1e6);
    return finish(staging, arena);
  }

 private:
  // Checksums and headers, the manifest, the dataset committed: the report.
  PrepReport finish(StagingDir& staging, tbb::task_arena& arena) {
    Stopwatch sw;
    arena.execute([&] { finish_outputs(); });
    write_file_atomic(staging.path() / "manifest.json", manifest_.to_json());
    staging.commit();
    report_.finish_seconds = sw.seconds();
    report_.manifest = manifest_;
    return report_;
  }

  void validate() {
    if (opt_.inputs.empty()) throw ConfigError("no input files given");
    if (opt_.output.empty()) throw ConfigError("--output is required");
    if (!(opt_.val_fraction >= 0 && opt_.val_fraction < 1)) throw ConfigError("--val-fraction must be in [0, 1)");
    if (!(opt_.test_fraction >= 0 && opt_.test_fraction < 1)) throw ConfigError("--test-fraction must be in [0, 1)");
    if (opt_.val_fraction + opt_.test_fraction >= 1) throw ConfigError("--val-fraction + --test-fraction must be < 1");
    if (opt_.min_count == 0) throw ConfigError("--min-count must be at least 1");
    if (hashed_ && opt_.min_count != 1) throw ConfigError("--min-count needs a vocabulary: it cannot be used with --ids hash");
    if (hashed_ && nt_ > kMaxHashedTables) throw ConfigError("--ids hash: at most 256 tables");
    if (opt_.shard_rows == 0 || !std::has_single_bit(opt_.shard_rows)) {
      throw ConfigError("--shard-rows must be a power of two, not " + std::to_string(opt_.shard_rows));
    }
  }

  void open_inputs() {
    bool first = true;
    for (const auto& p : opt_.inputs) {
      InputFile f;
      f.path = p;
      f.input = std::make_unique<TextInput>(p, opt_.block_bytes);
      report_.input_bytes += f.input->file_bytes();
      std::string first_line = read_first_line(p);
      if (first_line.empty()) throw DataError(p.string() + ":1: empty file");
      try {
        f.parser = std::make_unique<LineParser>(opt_.format, first_line, opt_.multi_hot_sep);
      } catch (const DataError& e) {
        throw DataError(p.string() + ":1: " + e.what());
      }
      if (first) {
        has_labels_ = f.parser->has_label();
      } else if (f.parser->has_label() != has_labels_) {
        throw DataError(p.string() + ":1: " +
                        (has_labels_ ? "has no label column but earlier inputs do" : "has a label column but earlier inputs do not"));
      }
      first = false;
      files_.push_back(std::move(f));
    }
  }

  // Iterates every block of every input, giving the block (header stripped), the file,
  // and the 1-based number of the block's first line.
  template <typename F>
  void for_each_block(int pass, F&& f) {
    std::uint64_t bytes_before = 0;
    for (auto& file : files_) {
      file.input->rewind();
      std::string_view block;
      std::uint64_t line_no = 1;
      bool first_block = true;
      while (file.input->next(block)) {
        if (first_block && file.parser->header_consumed()) {
          std::size_t nl = block.find('\n');
          block = nl == std::string_view::npos ? std::string_view() : block.substr(nl + 1);
          line_no = 2;
        }
        first_block = false;
        if (pass == 1) report_.text_bytes += block.size();
        line_no += f(file, block, line_no);
        file.input->release_current();
        if (opt_.on_progress) {
          PrepProgress p;
          p.pass = pass;
          p.bytes_total = report_.input_bytes;
          p.bytes_done = bytes_before + file.input->consumed_bytes();
          p.rows = pass == 1 ? total_good_ : rows_written_;
          opt_.on_progress(p);
        }
      }
      bytes_before += file.input->file_bytes();
    }
  }

  // The chunks' keys counted into vocab_, each thread owning one hash partition of
  // every table.
  void count_partitions(const std::vector<CountChunk>& chunks, unsigned parts) {
    tbb::parallel_for(
        0u, parts,
        [&](unsigned p) {
          for (const auto& ch : chunks) {
            for (int t = 0; t < nt_; ++t) {
              const auto& keys = ch.keys[p * static_cast<unsigned>(nt_) + static_cast<unsigned>(t)];
              count_keys(vocab_[static_cast<std::size_t>(t)][p], keys.data(), keys.size());
            }
          }
        },
        tbb::simple_partitioner());
  }

  // A chunk emptied for the next block's piece.
  void reset_chunk(CountChunk& ch, unsigned parts) const {
    ch.lines = ch.good = ch.bad_count = 0;
    ch.keys.resize(static_cast<std::size_t>(parts) * nt_);
    for (auto& k : ch.keys) k.clear();
    ch.bad.clear();
    ch.row_ids.clear();
    ch.spool.clear();
    ch.bag_sum.assign(static_cast<std::size_t>(nt_), 0);
    ch.bag_max.assign(static_cast<std::size_t>(nt_), 0);
  }

  // Pass 1's frame, shared by the vocabulary's counting and the hashed ids' spooling:
  // each block split into chunks, parsed in parallel by parse(chunk, file, piece, parts),
  // its bad lines and sizes merged in file order, handed to merged(chunks), and the
  // chunks' keys counted into vocab_, each thread owning one hash partition.
  template <typename Parse, typename Merged>
  void parse_blocks(Parse&& parse, Merged&& merged) {
    const unsigned parts = static_cast<unsigned>(threads_);
    bag_sum_.assign(static_cast<std::size_t>(nt_), 0);
    bag_max_.assign(static_cast<std::size_t>(nt_), 0);
    vocab_.assign(static_cast<std::size_t>(nt_), std::vector<Vocab>(parts));
    std::vector<CountChunk> chunks;
    for_each_block(1, [&](InputFile& file, std::string_view block, std::uint64_t line_no) -> std::uint64_t {
      auto pieces = split_block(block, threads_);
      chunks.resize(pieces.size());
      tbb::parallel_for(
          std::size_t{0}, pieces.size(), [&](std::size_t c) { parse(chunks[c], file, pieces[c], parts); }, tbb::simple_partitioner());
      const std::uint64_t lines = merge_count_chunks(file, chunks, line_no);
      merged(chunks);
      count_partitions(chunks, parts);
      return lines;
    });
  }

  void count_pass() {
    parse_blocks([this](CountChunk& ch, const InputFile& file, std::string_view piece,
                        unsigned parts) { parse_count_chunk(ch, file, piece, parts); },
                 [](const std::vector<CountChunk>&) {});
    for (auto& t : vocab_) {
      for (auto& m : t) report_.vocab_bytes += m.memory_bytes();
    }
  }

  // One chunk of a block parsed: its keys by (hash partition, table), its bad lines.
  void parse_count_chunk(CountChunk& ch, const InputFile& file, std::string_view piece, unsigned parts) const {
    reset_chunk(ch, parts);
    LineParser parser = *file.parser;  // parsers keep per-thread scratch
    Record rec;
    std::string err;
    for_each_line(piece, [&](std::string_view line) {
      std::uint64_t idx = ch.lines++;
      if (blank(line)) return;
      if (!parser.parse(line, rec, err, false)) {
        if (ch.bad.size() < kMaxBadExamples) ch.bad.emplace_back(idx, err);
        ++ch.bad_count;
        return;
      }
      auto count = [&](int t, std::uint64_t key) {
        ch.keys[partition_of(Vocab::hash(key), parts) * static_cast<unsigned>(nt_) + static_cast<unsigned>(t)].push_back(key);
      };
      if (multi_hot_) {
        std::uint64_t ids = 0;
        for (int t = 0; t < nt_; ++t) {
          const auto& bag = rec.bags[static_cast<std::size_t>(t)];
          for (std::uint64_t key : bag) count(t, key);
          ch.bag_sum[static_cast<std::size_t>(t)] += bag.size();
          ch.bag_max[static_cast<std::size_t>(t)] =
              std::max(ch.bag_max[static_cast<std::size_t>(t)], static_cast<std::uint32_t>(bag.size()));
          ids += bag.size();
        }
        ch.row_ids.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(ids, UINT32_MAX)));
      } else {
        for (int t = 0; t < nt_; ++t) {
          std::uint64_t key = rec.keys[static_cast<std::size_t>(t)];
          if (key != kMissingKey) count(t, key);
        }
      }
      ++ch.good;
    });
  }

  // The chunks' bad lines in file order (failing at the first past --skip-bad) and their
  // counts into the pass's; returns the block's lines.
  std::uint64_t merge_count_chunks(const InputFile& file, std::vector<CountChunk>& chunks, std::uint64_t line_no) {
    // Bad lines, in file order: fail at the first one past the allowance.
    std::uint64_t first_line = line_no;
    for (auto& ch : chunks) {
      for (auto& [idx, why] : ch.bad) {
        std::string where = file.path.string() + ":" + std::to_string(first_line + idx);
        if (report_.bad_lines + 1 > opt_.skip_bad) {
          if (opt_.skip_bad == 0) throw DataError(where + ": " + why);
          throw DataError(where + ": " + why + " (more than --skip-bad " + std::to_string(opt_.skip_bad) + " bad lines)");
        }
        ++report_.bad_lines;
        if (report_.bad_examples.size() < kMaxBadExamples) report_.bad_examples.push_back({where, why});
      }
      // Lines beyond the capped examples are still counted.
      std::uint64_t uncounted = ch.bad_count - ch.bad.size();
      if (uncounted > 0) {
        if (report_.bad_lines + uncounted > opt_.skip_bad) {
          throw DataError(file.path.string() + ": more than --skip-bad " + std::to_string(opt_.skip_bad) +
                          " bad lines (first: " + ch.bad.front().second + ")");
        }
        report_.bad_lines += uncounted;
      }
      first_line += ch.lines;
      if (multi_hot_) {
        row_ids_.insert(row_ids_.end(), ch.row_ids.begin(), ch.row_ids.end());
        for (int t = 0; t < nt_; ++t) {
          bag_sum_[static_cast<std::size_t>(t)] += ch.bag_sum[static_cast<std::size_t>(t)];
          bag_max_[static_cast<std::size_t>(t)] = std::max(bag_max_[static_cast<std::size_t>(t)], ch.bag_max[static_cast<std::size_t>(t)]);
        }
      }
      chunk_rows_.push_back(ch.good);
      total_good_ += ch.good;
      report_.lines += ch.lines;
    }
    return first_line - line_no;
  }

  // Row ids by decreasing count (ties by value), after the missing and OOV rows: hot
  // rows get small ids. Counts are replaced by ids in place. One table at a time (each
  // sorted in parallel), so the transient sort buffer is one table's, not all of them;
  // each table's kept values go to the vocabulary file in row order.
  void build_vocabulary(const std::filesystem::path& vocab_file) {
    manifest_.tables.assign(static_cast<std::size_t>(nt_), TableInfo{});
    VocabularyWriter writer(vocab_file, static_cast<std::uint32_t>(nt_));
    std::vector<std::uint64_t> keys;
    for (int t = 0; t < nt_; ++t) {
      auto& parts = vocab_[static_cast<std::size_t>(t)];
      struct Kept {
        std::uint32_t count;
        std::uint64_t key;
        std::uint32_t* slot;  // stable: the maps do not grow any more
      };
      std::vector<Kept> kept;
      std::uint64_t seen = 0;
      for (auto& m : parts) {
        seen += m.size();
        m.for_each([&](std::uint64_t key, std::uint32_t& count) {
          if (count >= opt_.min_count) kept.push_back({count, key, &count});
          count = static_cast<std::uint32_t>(kOovRow);
        });
      }
      tbb::parallel_sort(kept.begin(), kept.end(),
                         [](const Kept& a, const Kept& b) { return a.count != b.count ? a.count > b.count : a.key < b.key; });
      TableInfo& info = manifest_.tables[static_cast<std::size_t>(t)];
      info.name = schema_.table_names[static_cast<std::size_t>(t)];
      info.rows = kFirstValueRow + kept.size();
      info.id_bytes = 4;  // checked below; the format also allows 8
      info.values_seen = seen;
      if (multi_hot_) {
        info.max_bag = bag_max_[static_cast<std::size_t>(t)];
        info.mean_bag =
            static_cast<double>(bag_sum_[static_cast<std::size_t>(t)]) / static_cast<double>(std::max<std::uint64_t>(1, total_good_));
      }
      if (info.rows > UINT32_MAX) throw DataError("table " + info.name + " has more than 2^32 rows");
      keys.resize(kept.size());
      for (std::size_t i = 0; i < kept.size(); ++i) {
        *kept[i].slot = static_cast<std::uint32_t>(kFirstValueRow + i);
        keys[i] = kept[i].key;
      }
      writer.add_table(keys);
    }
    manifest_.vocabulary = writer.finish();
    vocabulary_ = Vocabulary(std::move(vocab_));
    vocab_.clear();
  }

  // --ids hash: one pass over the text. Rows are encoded as they are read into a spool
  // file beside the shards (the split sizes are known only at the end), then laid out
  // into the shards from the spool: binary copies, no second parse.
  PrepReport run_hashed(StagingDir& staging, tbb::task_arena& arena) {
    const std::filesystem::path spool = staging.path() / "spool.tmp";
    Stopwatch sw;
    arena.execute([&] { spool_pass(spool); });
    report_.pass1_seconds = sw.seconds();
    if (total_good_ == 0) throw DataError("no data rows in the input");
    sw.reset();
    arena.execute([&] { count_collisions(); });
    fill_hashed_tables();
    report_.vocab_seconds = sw.seconds();
    sw.reset();
    if (multi_hot_) index_spool();  // before plan_outputs puts row_ids_ in destination order
    plan_outputs(staging.path());
    {
      const MappedFile in(spool, MappedFile::Access::kRandom);
      arena.execute([&] { layout_pass(in.data(), in.size()); });
    }
    std::filesystem::remove(spool);
    report_.pass2_seconds = sw.seconds();
    return finish(staging, arena);
  }

  void spool_pass(const std::filesystem::path& spool) {
    UniqueFd fd(::open(spool.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw IoError(errno_message("create " + spool.string()));
    // The chunks' records to the spool in file order; their wide keys counted (the
    // collisions are counted at the end).
    parse_blocks([this](CountChunk& ch, const InputFile& file, std::string_view piece,
                        unsigned parts) { parse_spool_chunk(ch, file, piece, parts); },
                 [&](const std::vector<CountChunk>& chunks) {
                   for (const auto& ch : chunks) write_all(fd.get(), ch.spool, spool);
                 });
    rows_written_ = total_good_;
  }

  // One chunk parsed into spool records; its wide keys by (partition of their folded
  // value, table): keys that may share an id land in one partition.
  void parse_spool_chunk(CountChunk& ch, const InputFile& file, std::string_view piece, unsigned parts) const {
    reset_chunk(ch, parts);
    LineParser parser = *file.parser;
    Record rec;
    std::string err;
    auto id = [&](int t, std::uint64_t key) {
      if (is_wide_key(key)) {
        const unsigned p = partition_of(Vocab::hash(fold55(key)), parts);
        ch.keys[p * static_cast<unsigned>(nt_) + static_cast<unsigned>(t)].push_back(key);
      }
      put(ch.spool, hashed_id(static_cast<unsigned>(t), key));
    };
    for_each_line(piece, [&](std::string_view line) {
      std::uint64_t idx = ch.lines++;
      if (blank(line)) return;
      if (!parser.parse(line, rec, err, true)) {
        if (ch.bad.size() < kMaxBadExamples) ch.bad.emplace_back(idx, err);
        ++ch.bad_count;
        return;
      }
      put(ch.spool, rec.label);
      ch.spool.append(reinterpret_cast<const char*>(rec.dense.data()), sizeof(float) * static_cast<std::size_t>(nd_));
      if (multi_hot_) {
        std::uint64_t ids = 0;
        for (int t = 0; t < nt_; ++t) {
          const auto size = static_cast<std::uint32_t>(rec.bags[static_cast<std::size_t>(t)].size());
          put(ch.spool, size);
          ch.bag_sum[static_cast<std::size_t>(t)] += size;
          ch.bag_max[static_cast<std::size_t>(t)] = std::max(ch.bag_max[static_cast<std::size_t>(t)], size);
          ids += size;
        }
        for (int t = 0; t < nt_; ++t) {
          for (std::uint64_t key : rec.bags[static_cast<std::size_t>(t)]) id(t, key);
        }
        ch.row_ids.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(ids, UINT32_MAX)));
      } else {
        for (int t = 0; t < nt_; ++t) id(t, rec.keys[static_cast<std::size_t>(t)]);
      }
      ++ch.good;
    });
  }

  // Distinct wide values of a table whose folded value another one has: they share its id.
  void count_collisions() {
    std::vector<std::uint64_t> per_part(static_cast<std::size_t>(threads_) * nt_, 0), wide(per_part.size(), 0);
    tbb::parallel_for(std::size_t{0}, per_part.size(), [&](std::size_t i) {
      Vocab& m = vocab_[i / static_cast<std::size_t>(threads_)][i % static_cast<std::size_t>(threads_)];
      std::vector<std::uint64_t> folded;
      folded.reserve(m.size());
      m.for_each([&](std::uint64_t key, std::uint32_t&) { folded.push_back(fold55(key)); });
      std::sort(folded.begin(), folded.end());
      for (std::size_t k = 1; k < folded.size(); ++k) per_part[i] += folded[k] == folded[k - 1];
      wide[i] = folded.size();
    });
    for (std::size_t i = 0; i < per_part.size(); ++i) {
      manifest_.hash_collisions += per_part[i];
      manifest_.wide_values += wide[i];
    }
    for (auto& t : vocab_) {
      for (auto& m : t) report_.vocab_bytes += m.memory_bytes();
    }
    vocab_.clear();
  }

  void fill_hashed_tables() {
    manifest_.hashed_ids = true;
    manifest_.tables.assign(static_cast<std::size_t>(nt_), TableInfo{});
    for (int t = 0; t < nt_; ++t) {
      TableInfo& info = manifest_.tables[static_cast<std::size_t>(t)];
      info.name = schema_.table_names[static_cast<std::size_t>(t)];
      info.rows = 0;  // dynamic
      info.id_bytes = 8;
      if (multi_hot_) {
        info.max_bag = bag_max_[static_cast<std::size_t>(t)];
        info.mean_bag =
            static_cast<double>(bag_sum_[static_cast<std::size_t>(t)]) / static_cast<double>(std::max<std::uint64_t>(1, total_good_));
      }
    }
  }

  // Where each row's record starts in the spool (multi-hot records vary in size).
  void index_spool() {
    spool_off_.resize(total_good_);
    std::uint64_t at = 0;
    const std::uint64_t fixed = 1 + 4 * static_cast<std::uint64_t>(nd_) + 4 * static_cast<std::uint64_t>(nt_);
    for (std::uint64_t g = 0; g < total_good_; ++g) {
      spool_off_[g] = at;
      at += fixed + 8 * static_cast<std::uint64_t>(row_ids_[g]);
    }
  }

  // Every shard filled from the spool, in parallel over shards: destination row by
  // destination row, its source row by the shuffle's inverse.
  void layout_pass(const char* spool, std::uint64_t spool_bytes) {
    std::vector<std::uint64_t> source;
    if (!perm_.empty()) {
      source.resize(perm_.size());
      for (std::uint64_t g = 0; g < perm_.size(); ++g) source[perm_[g]] = g;
    }
    std::vector<std::pair<ShardOut*, std::uint64_t>> all;  // shard, its first destination row
    std::uint64_t split_begin = 0;
    for (int s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < shards_[s].size(); ++i) all.emplace_back(shards_[s][i].get(), split_begin + i * opt_.shard_rows);
      split_begin += split_rows_[s];
    }
    tbb::parallel_for(std::size_t{0}, all.size(), [&](std::size_t i) {
      auto [out, first] = all[i];
      layout_shard(*out, first, spool, source);
      release_laid_out(*out, first, spool, spool_bytes, !source.empty());
    });
  }

  // A shard laid out is checksummed as it leaves this process's memory, and so do the
  // spool's records it read when they were one range (unshuffled): prep's RSS stays near
  // one shard's, not the dataset's.
  void release_laid_out(ShardOut& out, std::uint64_t first, const char* spool, std::uint64_t spool_bytes, bool shuffled) {
    sum_and_release(out);
    if (shuffled || out.rows == 0) return;
    const std::uint64_t record = 1 + 4 * static_cast<std::uint64_t>(nd_) + 8 * static_cast<std::uint64_t>(nt_);
    const std::uint64_t end = first + out.rows;
    const std::uint64_t from = multi_hot_ ? spool_off_[first] : first * record;
    const std::uint64_t to = multi_hot_ ? (end < spool_off_.size() ? spool_off_[end] : spool_bytes) : end * record;
    drop_pages(const_cast<char*>(spool) + from, const_cast<char*>(spool) + to);
  }

  void layout_shard(ShardOut& out, std::uint64_t first, const char* spool, const std::vector<std::uint64_t>& source) {
    const std::uint64_t fixed = 1 + 4 * static_cast<std::uint64_t>(nd_);
    const std::uint64_t one_hot_bytes = fixed + 8 * static_cast<std::uint64_t>(nt_);
    for (std::uint64_t r = 0; r < out.rows; ++r) {
      const std::uint64_t pos = first + r;
      const std::uint64_t g = source.empty() ? pos : source[pos];
      const char* rec = spool + (multi_hot_ ? spool_off_[g] : g * one_hot_bytes);
      out.labels()[r] = static_cast<std::uint8_t>(rec[0]);
      std::memcpy(out.dense() + r * static_cast<std::uint64_t>(nd_), rec + 1, 4 * static_cast<std::size_t>(nd_));
      rec += fixed;
      if (!multi_hot_) {
        for (int t = 0; t < nt_; ++t) std::memcpy(out.column(t) + 8 * r, rec + 8 * t, 8);
        continue;
      }
      std::uint32_t at = row_ids_[pos];  // the row's first id in the shard (place_bags)
      std::uint32_t* offsets = out.bag_offsets() + r * static_cast<std::uint64_t>(nt_);
      const std::uint32_t begin = at;
      for (int t = 0; t < nt_; ++t) {
        offsets[t] = at;
        std::uint32_t size;
        std::memcpy(&size, rec + 4 * t, 4);
        at += size;
      }
      std::memcpy(out.bag_ids() + 8 * static_cast<std::uint64_t>(begin), rec + 4 * nt_, 8 * static_cast<std::size_t>(at - begin));
    }
  }

  void plan_outputs(const std::filesystem::path& dir) {
    std::uint64_t n = total_good_;
    auto test = static_cast<std::uint64_t>(std::floor(static_cast<double>(n) * opt_.test_fraction));
    auto val = static_cast<std::uint64_t>(std::floor(static_cast<double>(n) * opt_.val_fraction));
    split_rows_[2] = test;
    split_rows_[1] = val;
    split_rows_[0] = n - val - test;
    manifest_.source_format = std::string(format_name(opt_.format));
    for (const auto& p : opt_.inputs) manifest_.inputs.push_back(p.string());
    manifest_.has_labels = has_labels_;
    manifest_.dense_names = schema_.dense_names;
    manifest_.shard_rows = opt_.shard_rows;
    manifest_.min_count = opt_.min_count;
    manifest_.shuffled = opt_.shuffle;
    manifest_.seed = opt_.seed;
    manifest_.bad_lines_skipped = report_.bad_lines;
    manifest_.multi_hot = multi_hot_;
    manifest_.multi_hot_sep = opt_.multi_hot_sep;
    manifest_.format_version = multi_hot_ ? kMultiHotFormatVersion : kDatasetFormatVersion;
    for (int s = 0; s < 3; ++s) manifest_.rows[s] = split_rows_[s];
    for (const auto& t : manifest_.tables) id_bytes_.push_back(t.id_bytes);
    if (opt_.shuffle) {
      // Destination of each row; 8 bytes per row, only when shuffling was asked for.
      perm_.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) perm_[i] = i;
      std::mt19937_64 rng(mix64(opt_.seed + 0x5eed));
      for (std::uint64_t i = n; i > 1; --i) std::swap(perm_[i - 1], perm_[rng() % i]);
    }
    if (multi_hot_) place_bags();
    std::size_t shard_index = 0;  // in split order, as place_bags counts them
    for (int s = 0; s < 3; ++s) {
      std::uint64_t left = split_rows_[s];
      for (int i = 0; left > 0; ++i) {
        auto sh = std::make_unique<ShardOut>();
        sh->rows = std::min(left, opt_.shard_rows);
        left -= sh->rows;
        char name[64];
        std::snprintf(name, sizeof name, "%s-%05d.ember", kSplitNames[s], i);
        sh->path = dir / name;
        if (multi_hot_) {
          const std::uint64_t ids = shard_ids_[shard_index];
          sh->layout =
              multi_hot_shard_layout(sh->rows, static_cast<std::uint32_t>(nd_), static_cast<std::uint32_t>(nt_), ids, hashed_ ? 8 : 4);
        } else {
          sh->layout = shard_layout(sh->rows, static_cast<std::uint32_t>(nd_), id_bytes_);
        }
        sh->out = std::make_unique<MappedOutput>(sh->path, sh->layout.file_bytes);
        if (multi_hot_) sh->bag_offsets()[sh->rows * static_cast<std::uint64_t>(nt_)] = static_cast<std::uint32_t>(sh->layout.bag_ids);
        ++shard_index;
        shards_[s].push_back(std::move(sh));
      }
    }
  }

  // Multi-hot: where each row's ids start in its shard, in destination order (rows
  // counted in pass 1, moved by the shuffle), and each shard's ids. 4 bytes per row.
  void place_bags() {
    const std::uint64_t n = total_good_;
    if (row_ids_.size() != n) throw IoError("input changed between passes");
    if (!perm_.empty()) {
      std::vector<std::uint32_t> dest(n);
      for (std::uint64_t g = 0; g < n; ++g) dest[perm_[g]] = row_ids_[g];
      row_ids_.swap(dest);
    }
    // Destination positions to shard-local exclusive prefix sums, shard by shard (each
    // split starts a new shard).
    std::uint64_t pos = 0;
    for (int s = 0; s < 3; ++s) {
      for (std::uint64_t done = 0; done < split_rows_[s];) {
        const std::uint64_t rows = std::min(opt_.shard_rows, split_rows_[s] - done);
        std::uint64_t acc = 0;
        for (std::uint64_t r = pos; r < pos + rows; ++r) {
          const std::uint64_t ids = row_ids_[r];
          row_ids_[r] = static_cast<std::uint32_t>(acc);
          acc += ids;
          if (acc > UINT32_MAX) {
            throw DataError("shard " + std::string(kSplitNames[s]) + " " + std::to_string(shard_ids_.size()) +
                            " would hold more than 2^32 - 1 ids; lower --shard-rows");
          }
        }
        shard_ids_.push_back(acc);
        pos += rows;
        done += rows;
      }
    }
  }

  ShardOut& locate(std::uint64_t pos, std::uint64_t& row) {
    int s = pos < split_rows_[0] ? 0 : pos < split_rows_[0] + split_rows_[1] ? 1 : 2;
    std::uint64_t idx = pos - (s >= 1 ? split_rows_[0] : 0) - (s == 2 ? split_rows_[1] : 0);
    row = idx & (opt_.shard_rows - 1);
    return *shards_[s][idx / opt_.shard_rows];
  }

  // Pass-2 state of one chunk: its encoded rows (encode_lines, as ember-predict encodes
  // text), and the shard and row each goes to.
  struct EncodeChunk {
    EncodedRows rows;
    std::vector<std::pair<ShardOut*, std::uint64_t>> dest;
  };

  void encode_pass() {
    std::size_t chunk_index = 0;
    std::uint64_t row_base = 0;
    std::vector<EncodeChunk> chunks;
    for_each_block(2, [&](InputFile& file, std::string_view block, std::uint64_t) -> std::uint64_t {
      auto pieces = split_block(block, threads_);
      chunks.resize(pieces.size());
      std::vector<std::uint64_t> starts(pieces.size());
      for (std::size_t c = 0; c < pieces.size(); ++c) {
        if (chunk_index + c >= chunk_rows_.size()) throw IoError(file.path.string() + ": input changed between passes");
        starts[c] = row_base;
        row_base += chunk_rows_[chunk_index + c];
      }
      tbb::parallel_for(
          std::size_t{0}, pieces.size(),
          [&](std::size_t c) {
            EncodeChunk& ch = chunks[c];
            LineParser parser = *file.parser;
            encode_lines(parser, vocabulary_, pieces[c], ch.rows, 0);  // bad lines: counted in pass 1
            const EncodedRows& er = ch.rows;
            const std::size_t rows = er.size();
            if (rows != chunk_rows_[chunk_index + c]) return;  // reported below
            ch.dest.resize(rows);
            for (std::size_t r = 0; r < rows; ++r) {
              std::uint64_t g = starts[c] + r;
              std::uint64_t row;
              ShardOut& out = locate(perm_.empty() ? g : perm_[g], row);
              ch.dest[r] = {&out, row};
              out.labels()[row] = er.labels[r];
              if (nd_ > 0)
                std::memcpy(out.dense() + row * static_cast<std::uint64_t>(nd_), &er.dense[r * static_cast<std::size_t>(nd_)],
                            sizeof(float) * static_cast<std::size_t>(nd_));
            }
            if (multi_hot_) {
              const std::uint32_t* sizes = er.bag_sizes.data();
              const std::uint32_t* ids = er.bag_ids.data();
              for (std::size_t r = 0; r < rows; ++r) {
                const std::uint64_t g = starts[c] + r;
                std::uint32_t at = row_ids_[perm_.empty() ? g : perm_[g]];
                auto [out, row] = ch.dest[r];
                // The row's ids must fill exactly the room pass 1 counted for it (up to the
                // next row's start, or the shard's end): a bag that grew would write over
                // another row.
                const std::uint64_t p = perm_.empty() ? g : perm_[g];
                const std::uint64_t end = row + 1 < out->rows ? row_ids_[p + 1] : out->layout.bag_ids;
                std::uint64_t total = 0;
                for (int t = 0; t < nt_; ++t) total += sizes[t];
                if (at + total != end) throw IoError(file.path.string() + ": input changed between passes (a bag's size)");
                std::uint32_t* offsets = out->bag_offsets() + row * static_cast<std::uint64_t>(nt_);
                const std::uint32_t begin = at;
                for (int t = 0; t < nt_; ++t) {
                  offsets[t] = at;
                  at += *sizes++;
                }
                std::memcpy(out->bag_ids() + sizeof(std::uint32_t) * begin, ids, sizeof(std::uint32_t) * (at - begin));
                ids += at - begin;
              }
            } else {
              for (int t = 0; t < nt_; ++t) {
                const std::uint32_t* ids = er.ids[static_cast<std::size_t>(t)].data();
                for (std::size_t r = 0; r < rows; ++r)
                  reinterpret_cast<std::uint32_t*>(ch.dest[r].first->column(t))[ch.dest[r].second] = ids[r];
              }
            }
          },
          tbb::simple_partitioner());
      std::uint64_t lines = 0;
      for (std::size_t c = 0; c < pieces.size(); ++c) {
        if (chunks[c].rows.size() != chunk_rows_[chunk_index + c]) {
          throw IoError(file.path.string() + ": input changed between passes");
        }
        lines += chunks[c].rows.lines;
      }
      chunk_index += pieces.size();
      rows_written_ = row_base;
      if (perm_.empty()) release_written(row_base);
      return lines;
    });
    if (chunk_index != chunk_rows_.size()) throw IoError("input changed between passes");
  }

  // Rows below `done` (file order, unshuffled) are final: unmap their pages.
  void release_written(std::uint64_t done) {
    std::uint64_t split_begin = 0;
    for (int s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < shards_[s].size(); ++i) {
        ShardOut& sh = *shards_[s][i];
        std::uint64_t first = split_begin + i * opt_.shard_rows;
        if (done <= first) return;
        std::uint64_t upto = std::min(sh.rows, done - first);
        if (upto <= sh.released_rows) continue;
        char* base = sh.out->data();
        std::uint64_t from = sh.released_rows;
        drop_pages(base + sh.layout.labels_offset + from, base + sh.layout.labels_offset + upto);
        drop_pages(base + sh.layout.dense_offset + from * nd_ * 4, base + sh.layout.dense_offset + upto * nd_ * 4);
        if (multi_hot_) {
          const std::uint64_t T = static_cast<std::uint64_t>(nt_);
          char* offsets = reinterpret_cast<char*>(sh.bag_offsets());
          drop_pages(offsets + from * T * 4, offsets + upto * T * 4);
          // Rows' ids lie in row order: up to where row `upto` starts (or the end).
          const std::uint64_t id_from = row_ids_[first + from];
          const std::uint64_t id_to = upto == sh.rows ? sh.layout.bag_ids : row_ids_[first + upto];
          char* ids = reinterpret_cast<char*>(sh.bag_ids());
          const std::uint64_t w = sh.layout.bag_id_bytes;
          drop_pages(ids + id_from * w, ids + id_to * w);
        } else {
          for (int t = 0; t < nt_; ++t) {
            std::uint64_t w = id_bytes_[static_cast<std::size_t>(t)];
            drop_pages(sh.column(t) + from * w, sh.column(t) + upto * w);
          }
        }
        sh.released_rows = upto;
      }
      split_begin += split_rows_[s];
    }
  }

  // Hashes the shard's payload a window at a time, dropping each window after: RSS
  // stays flat.
  static void sum_and_release(ShardOut& sh) {
    char* base = sh.out->data();
    const std::uint64_t size = sh.layout.file_bytes;
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    constexpr std::uint64_t kWindow = 4u << 20;
    for (std::uint64_t off = sh.layout.header_bytes; off < size; off += kWindow) {
      const std::uint64_t len = std::min(kWindow, size - off);
      XXH3_64bits_update(st, base + off, len);
      drop_pages(base + off, base + off + len);
    }
    sh.checksum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    sh.summed = true;
  }

  // Checksums (those not taken at layout), headers, msync + fsync, in parallel over shards.
  void finish_outputs() {
    std::vector<ShardOut*> all;
    for (auto& v : shards_) {
      for (auto& s : v) all.push_back(s.get());
    }
    tbb::parallel_for(std::size_t{0}, all.size(), [&](std::size_t i) {
      ShardOut& sh = *all[i];
      if (!sh.summed) sum_and_release(sh);
      finish_shard_header(sh.out->data(), sh.layout, sh.rows, static_cast<std::uint32_t>(nd_), id_bytes_, sh.checksum);
      sh.out->close();
    });
    for (int s = 0; s < 3; ++s) {
      for (auto& sh : shards_[s]) {
        manifest_.shards[s].push_back({sh->path.filename().string(), sh->rows, sh->layout.file_bytes, sh->checksum});
      }
    }
  }

  const PrepOptions& opt_;
  const Schema& schema_;
  int threads_ = 1;
  int nt_ = 0, nd_ = 0;
  bool has_labels_ = true;
  std::vector<InputFile> files_;
  std::vector<std::vector<Vocab>> vocab_;  // [table][partition]: counts, then row ids (moved into vocabulary_)
  Vocabulary vocabulary_;
  std::vector<std::uint64_t> chunk_rows_;  // good rows per pass-1 chunk, in order
  std::uint64_t total_good_ = 0;
  std::uint64_t rows_written_ = 0;
  std::uint64_t split_rows_[3] = {0, 0, 0};
  std::vector<std::uint32_t> id_bytes_;
  bool multi_hot_ = false;
  bool hashed_ = false;
  std::vector<std::uint64_t> spool_off_;  // hashed multi-hot: each row's record in the spool
  std::vector<std::uint32_t> row_ids_;    // multi-hot: pass 1's ids per row; then each row's start in its shard
  std::vector<std::uint64_t> bag_sum_;    // per table
  std::vector<std::uint32_t> bag_max_;
  std::vector<std::uint64_t> shard_ids_;  // multi-hot: ids of each shard, in split order
  std::vector<std::unique_ptr<ShardOut>> shards_[3];
  std::vector<std::uint64_t> perm_;
  Manifest manifest_;
  PrepReport report_;
};

}  // namespace

PrepReport prepare_dataset(const PrepOptions& options) { return Preparer(options).run(); }

}  // namespace ember::data
