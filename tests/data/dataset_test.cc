#include "ember/data/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/data/prep.h"
#include "test_util.h"

namespace ember::data {
namespace {
namespace fs = std::filesystem;

class DatasetTest : public test::TempDirTest {
 protected:
  fs::path make(int rows, std::uint64_t shard_rows = 64) {
    std::string text;
    for (int i = 0; i < rows; ++i) text += test::criteo_line(i, i % 2) + "\n";
    PrepOptions o;
    o.inputs = {write("in.tsv", text)};
    o.output = dir_ / "ds";
    o.shard_rows = shard_rows;
    o.overwrite = true;
    prepare_dataset(o);
    return o.output;
  }
  // Dense I1 of criteo_line(i) is (7 i) % 50: a per-sample signature for checks.
  static int signature(const Batch& b, std::size_t i) { return static_cast<int>(std::lround(std::expm1(b.dense(i)[0]))); }
};

TEST_F(DatasetTest, SequentialBatchesCoverEveryRowInOrder) {
  Dataset ds = Dataset::open(make(1000, 256));
  BatchReader reader(ds.split(Split::kTrain), {100, false, 0, true});
  EXPECT_EQ(reader.batches_per_epoch(), 10u);
  Batch b;
  std::uint64_t next = 0;
  int contiguous = 0;
  while (reader.next(b)) {
    ASSERT_EQ(b.size(), 100u);
    for (std::size_t i = 0; i < b.size(); ++i, ++next) {
      ASSERT_EQ(b.sample(i), next);
      ASSERT_EQ(signature(b, i), static_cast<int>((next * 7) % 50));
      ASSERT_EQ(b.label(i), next % 2);
    }
    contiguous += b.contiguous_shard() != nullptr;
  }
  EXPECT_EQ(next, 1000u);
  EXPECT_GT(contiguous, 0);
  EXPECT_LT(contiguous, 10);  // some batches of 100 cross shards of 256
}

TEST_F(DatasetTest, DropLastAndPartialBatch) {
  Dataset ds = Dataset::open(make(250));
  BatchReader keep(ds.split(Split::kTrain), {100, false, 0, false});
  BatchReader drop(ds.split(Split::kTrain), {100, false, 0, true});
  Batch b;
  std::vector<std::size_t> sizes;
  while (keep.next(b)) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<std::size_t>{100, 100, 50}));
  int n = 0;
  while (drop.next(b)) ++n;
  EXPECT_EQ(n, 2);
}

TEST_F(DatasetTest, ShuffledBatchesArePermutationsDeterministicPerSeed) {
  Dataset ds = Dataset::open(make(1000));
  auto order = [&](std::uint64_t seed, std::uint64_t epoch) {
    BatchReader r(ds.split(Split::kTrain), {128, true, seed, false});
    r.start_epoch(epoch);
    Batch b;
    std::vector<std::uint64_t> out;
    while (r.next(b)) {
      for (std::size_t i = 0; i < b.size(); ++i) {
        out.push_back(b.sample(i));
        EXPECT_EQ(signature(b, i), static_cast<int>((b.sample(i) * 7) % 50));
      }
    }
    return out;
  };
  auto a = order(1, 0);
  ASSERT_EQ(a.size(), 1000u);
  EXPECT_EQ(std::set<std::uint64_t>(a.begin(), a.end()).size(), 1000u);
  EXPECT_EQ(a, order(1, 0));
  EXPECT_NE(a, order(2, 0));
  EXPECT_NE(a, order(1, 1));
}

TEST_F(DatasetTest, CorruptOrTruncatedShardIsRefused) {
  fs::path dir = make(300);
  fs::path shard = dir / "train-00001.ember";
  std::string bytes = read_file(shard);
  // One flipped payload byte.
  std::string corrupt = bytes;
  corrupt[corrupt.size() - 100] ^= 0x40;
  write_file_atomic(shard, corrupt);
  try {
    Dataset::open(dir);
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("train-00001.ember: payload checksum mismatch"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Dataset::open(dir, {false}));  // header intact: opens without payload check
  write_file_atomic(shard, bytes.substr(0, bytes.size() - 64));
  try {
    Dataset::open(dir, {false});
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::string bad_header = bytes;
  bad_header[20] ^= 1;
  write_file_atomic(shard, bad_header);
  EXPECT_THROW(Dataset::open(dir, {false}), DataError);
  write_file_atomic(shard, "not a shard");
  EXPECT_THROW(Dataset::open(dir), DataError);
}

TEST_F(DatasetTest, BadManifestIsRefused) {
  fs::path dir = make(10);
  write_file_atomic(dir / "manifest.json", "{\"format_version\": 99}");
  try {
    Dataset::open(dir);
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("format_version 99"), std::string::npos) << e.what();
  }
  write_file_atomic(dir / "manifest.json", "{not json");
  EXPECT_THROW(Dataset::open(dir), DataError);
  EXPECT_THROW(Dataset::open(dir_ / "nothing"), IoError);
}

TEST_F(DatasetTest, TableOffsetsMakeGlobalKeys) {
  Dataset ds = Dataset::open(make(100));
  auto off = ds.manifest().table_offsets();
  ASSERT_EQ(off.size(), 26u);
  EXPECT_EQ(off[0], 0u);
  for (std::size_t t = 1; t < off.size(); ++t) EXPECT_EQ(off[t], off[t - 1] + ds.manifest().tables[t - 1].rows);
  EXPECT_EQ(ds.manifest().total_table_rows(), off.back() + ds.manifest().tables.back().rows);
}

}  // namespace
}  // namespace ember::data
