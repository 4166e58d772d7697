// `ember-data prep`: text files (Criteo TSV / CSV, Avazu CSV, plain or gzip) to Ember's
// binary dataset. Two streaming passes: pass 1 counts every categorical value, pass 2
// encodes rows. Memory is bounded by the vocabulary, never by the input's size. With
// hashed ids, one pass over the text into a spool, then the shards laid out from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ember/data/dataset.h"
#include "ember/data/schema.h"

namespace ember::data {

struct PrepProgress {
  int pass = 1;                  // 1 = counting, 2 = encoding
  std::uint64_t bytes_done = 0;  // input bytes (as stored on disk) consumed in this pass
  std::uint64_t bytes_total = 0;
  std::uint64_t rows = 0;  // good rows so far in this pass
};

struct PrepOptions {
  SourceFormat format = SourceFormat::kCriteoTsv;
  std::vector<std::filesystem::path> inputs;  // concatenated in order
  std::filesystem::path output;
  std::uint64_t min_count = 1;  // values seen fewer times share the table's OOV row
  double val_fraction = 0.0;    // contiguous ranges after train (time order kept)
  double test_fraction = 0.0;
  std::uint64_t skip_bad = 0;  // bad lines tolerated (skipped) before failing
  char multi_hot_sep = 0;      // != 0: categorical fields are bags of values split by it
  // Hashed ids (hashed_ids.h): one pass over the text, no vocabulary, 8-byte ids of
  // dynamic tables; false: a vocabulary of each table's values, rows numbered by count.
  bool hashed_ids = false;
  bool shuffle = false;  // permute rows by `seed` before splitting
  std::uint64_t seed = 0;
  std::uint64_t shard_rows = 1u << 20;  // power of two
  int threads = 0;                      // 0 = all cores
  bool overwrite = false;               // replace an existing output directory
  std::size_t block_bytes = 16u << 20;
  std::function<void(const PrepProgress&)> on_progress;  // called once per block
};

struct BadLine {
  std::string where;  // FILE:LINE
  std::string what;
};

struct PrepReport {
  Manifest manifest;
  std::uint64_t input_bytes = 0;  // bytes of the input files as stored
  std::uint64_t text_bytes = 0;   // bytes of text parsed per pass (uncompressed)
  std::uint64_t lines = 0;        // data lines (headers and empty lines excluded)
  std::uint64_t bad_lines = 0;
  std::vector<BadLine> bad_examples;  // the first few skipped lines
  std::uint64_t vocab_bytes = 0;      // hash-table memory of the vocabulary (hashed ids: of the wide values) at its peak
  double pass1_seconds = 0, vocab_seconds = 0, pass2_seconds = 0, finish_seconds = 0;
  double total_seconds() const { return pass1_seconds + vocab_seconds + pass2_seconds + finish_seconds; }
};

// Runs both passes and commits the dataset directory atomically. Throws DataError
// ("FILE:LINE: what is wrong") for bad input beyond skip_bad, ConfigError for bad
// options, IoError for the file system. On any failure the output is not created.
PrepReport prepare_dataset(const PrepOptions& options);

}  // namespace ember::data
