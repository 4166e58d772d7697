// What the scheduler benchmarks share: a temporary Criteo-like dataset, and its global
// batches read into memory (so that only scheduling is timed).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_common.h"
#include "ember/data/dataset.h"
#include "ember/scheduler/global_batch.h"

namespace ember::bench {

// A directory under the system's temporary one, removed with its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// `rows` Criteo-like rows (Kaggle cardinalities x scale) generated and prepared in dir.
data::Dataset criteo_like(const std::filesystem::path& dir, std::uint64_t rows, double scale, const Output& out);
// The same with bags (ember-data gen --multi-hot `bags` --multi-hot-dist `dist`), in
// dir/NAME; one-hot when `bags` is empty.
data::Dataset criteo_like(const std::filesystem::path& dir, const std::string& name, std::uint64_t rows, double scale,
                          const std::string& bags, const std::string& dist, const Output& out);

// The same one-hot rows prepared with hashed ids (ember-data prep --ids hash), in
// dir/NAME: the dataset of dynamic tables.
data::Dataset criteo_like_hashed(const std::filesystem::path& dir, const std::string& name, std::uint64_t rows, double scale,
                                 const Output& out);
// The first `count` global batches of `samples` samples of the training split, in order.
std::vector<scheduler::GlobalBatch> global_batches(const data::Dataset& ds, std::uint64_t samples, std::uint64_t count,
                                                   const std::vector<std::uint64_t>& table_offsets);

}  // namespace ember::bench
