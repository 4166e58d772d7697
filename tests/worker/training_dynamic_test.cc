// Dynamic tables end to end: a dataset of hashed ids (ember-data prep --ids hash), rows
// made after two batches, expired and capped per shard. Vanilla and herald jobs (real
// ember-ps shards and ember-worker processes) train the one-process model on the same
// slots, the shards resetting made and dropped rows at their commits.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "../data/test_util.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/sparse_optimizer.h"
#include "job_fixture.h"
#ifdef EMBER_HAVE_KAFKA
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <fstream>
#include <memory>
#endif
#include "training_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

constexpr std::uint64_t kSlotsPerShard = 8192;  // a batch's 3,328 ids and the cap of 400 fit

class DynamicTraining : public Training {
 protected:
  static JobOptions dynamic_job(const std::string& policy) {
    JobOptions o;
    o.policy = policy;
    o.iterations = 12;
    o.cache_ratio = "0.05";
    with_dynamic_tables(o, kSlotsPerShard);
    o.sim_args = o.worker_args;
    for (const char* a : {"--ps", "2", "--slots-per-shard"}) o.sim_args.push_back(a);
    o.sim_args.push_back(std::to_string(kSlotsPerShard));
    return o;
  }
  // The one-process reference of `o` on `data` with the rules with_dynamic_tables gives.
  TrainConfig dynamic_reference_config(const fs::path& data, const JobOptions& o) {
    TrainConfig rc = reference_config(data, o);
    rc.create_after = 2;
    rc.expire_after = 4;
    rc.shard_max_rows = 400;
    return rc;
  }
  static ReferenceResult train_dynamic_reference(const TrainConfig& rc, std::uint32_t shards) {
    return train_reference(rc, sgd(), kDim, ReferenceSlots{shards, kSlotsPerShard});
  }
  static ps::OptimizerConfig sgd() {
    ps::OptimizerConfig sparse;
    sparse.kind = ps::OptimizerKind::kSgd;
    sparse.lr = 0.05f;
    return sparse;
  }
};

TEST_F(DynamicTraining, VanillaAndHeraldTrainTheOneProcessModelWithRowsMadeExpiredAndCapped) {
  const fs::path data = hashed_dataset();
  const JobOptions vanilla = dynamic_job("vanilla"), herald = dynamic_job("herald");
  const TrainConfig rc = dynamic_reference_config(data, herald);
  const ReferenceResult ref = train_dynamic_reference(rc, herald.shards);
  ASSERT_EQ(ref.rows.size(), herald.shards * kSlotsPerShard * kDim);

  // The reference trained rows made for ids (neither their slot's initial row nor
  // trained from it).
  std::size_t made = 0;
  std::vector<float> init(kDim);
  for (Key k = 0; k < herald.shards * kSlotsPerShard; ++k) {
    ps::initial_row(kSeed, k, kDim, init.data());
    const float* row = &ref.rows[k * kDim];
    bool zero = true, initial = true;
    for (std::uint32_t d = 0; d < kDim; ++d) zero &= row[d] == 0.0f, initial &= row[d] == init[d];
    made += !zero && !initial;
  }
  EXPECT_GT(made, 500u) << "rows made for ids";

  const JobResult v = run_job(data, vanilla, "dyn-vanilla");
  const JobResult h = run_job(data, herald, "dyn-herald");
  expect_same_model(ref, v, "vanilla on dynamic tables", 1e-6);
  expect_same_model(ref, h, "herald on dynamic tables", 1e-6);
  ASSERT_FALSE(h.reported.empty());
  EXPECT_LT(transmissions(h.reported), transmissions(v.reported)) << "herald should move fewer rows than vanilla";
  // The rows ember-sim predicts, in the plans and as the shards served them, and the
  // rows made and dropped on each shard (the workers' summaries: "dynamic.S.FIELD").
  ASSERT_EQ(h.reported.count("dynamic.1.capped"), 1u);
  EXPECT_GT(h.reported.at("dynamic.0.expired") + h.reported.at("dynamic.1.expired"), 0u);
  EXPECT_GT(h.reported.at("dynamic.0.capped") + h.reported.at("dynamic.1.capped"), 0u);
  for (auto [opts, job] : {std::pair{vanilla, &v}, std::pair{herald, &h}}) {
    auto sim = simulate(data, opts);
    expect_served_as_simulated(*job, sim, opts, opts.policy);
    expect_plans_as_simulated(*job, sim, opts.policy);
  }
  // The shards reset the rows made and dropped, named once each by one worker.
  EXPECT_EQ(v.served.at("reset.rows"), h.served.at("reset.rows"));
  EXPECT_GT(h.served.at("reset.rows"), made);
  EXPECT_GE(h.auc, 0.0);
  EXPECT_LE(h.auc, 1.0);
}

// ember-worker --reference on a dataset of hashed ids takes the job's slots from
// --reference-shards and --reference-slots-per-shard, and trains the library's
// one-process model (its last loss); without them it refuses in one line naming them.
TEST_F(DynamicTraining, TheCommandLineReferenceTrainsOnTheJobsSlots) {
  const fs::path data = hashed_dataset();
  const JobOptions o = dynamic_job("herald");
  const ReferenceResult ref = train_dynamic_reference(dynamic_reference_config(data, o), o.shards);
  ASSERT_FALSE(ref.losses.empty());
  const std::string cmd = test::bin("ember-worker") + " --reference --dataset " + data.string() + " --workers " +
                          std::to_string(o.workers) + " --batch-per-worker " + std::to_string(o.batch) + " --iterations " +
                          std::to_string(o.iterations) + " --seed " + std::to_string(kSeed) + " --model " + o.model +
                          " --bottom-mlp 16 --top-mlp 16 --deep-mlp 16 --dense-lr 0.05 --dense-optimizer " + o.dense_optimizer + " --dim " +
                          std::to_string(kDim) + " --optimizer sgd --lr 0.05 --create-after 2 --expire-after 4" +
                          " --shard-max-rows 400 --log-level warn";
  std::string out;
  ASSERT_EQ(
      test::run_command(
          cmd + " --reference-shards " + std::to_string(o.shards) + " --reference-slots-per-shard " + std::to_string(kSlotsPerShard), out),
      0)
      << out;
  const std::size_t at = out.find("\"loss\":");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NEAR(std::stod(out.substr(at + 7)), ref.losses.back(), 2e-6) << out;
  EXPECT_EQ(test::run_command(cmd, out), 2) << out;
  EXPECT_NE(out.find("--reference-shards"), std::string::npos) << out;
  // One without the other; slots below the cap (the job's ember-ps would refuse them too).
  EXPECT_EQ(test::run_command(cmd + " --reference-shards 2", out), 2) << out;
  EXPECT_NE(out.find("go together"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(cmd + " --reference-shards 2 --reference-slots-per-shard 100", out), 2) << out;
  EXPECT_NE(out.find("--shard-max-rows 400 is above the shard's 100 slots"), std::string::npos) << out;
}

// A job on a stream (ember-worker --stream): a directory's files, the second put in place
// while the job waits for it, train the model one process trains on `prep --ids hash` of
// the same files, and move the rows ember-sim predicts for that dataset.
TEST_F(DynamicTraining, AJobOnAStreamOfFilesTrainsThePreparedFilesModel) {
  const fs::path in = dir_ / "stream", staged = dir_ / "staged", data = dir_ / "prepared";
  fs::create_directories(in);
  fs::create_directories(staged);
  std::string log;
  for (const char* k : {"1", "2"}) {
    ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 800 --scale 0.002 --new-ids 0.2 --seed " + k +
                                    " --force -o " + (staged / (std::string("part-") + k + ".tsv")).string(),
                                log),
              0)
        << log;
  }
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " prep --ids hash --format criteo --force -o " + data.string() + " " +
                                  (staged / "part-1.tsv").string() + " " + (staged / "part-2.tsv").string(),
                              log),
            0)
      << log;
  fs::copy_file(staged / "part-1.tsv", in / "part-1.tsv");
  JobOptions herald = dynamic_job("herald");
  herald.stream = in.string();  // 12 batches of 128: 6 in part-1, the rest need part-2
  const TrainConfig rc = dynamic_reference_config(data, herald);
  const ReferenceResult ref = train_dynamic_reference(rc, herald.shards);

  const JobResult h = run_job(data, herald, "stream-herald", [&](Processes&, Processes&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    fs::copy_file(staged / "part-2.tsv", in / ".part-2.tsv");  // written under a hidden name, then put in place
    fs::rename(in / ".part-2.tsv", in / "part-2.tsv");
  });
  expect_same_model(ref, h, "herald on a stream", 1e-6);
  auto sim = simulate(data, herald);
  expect_served_as_simulated(h, sim, herald, herald.policy);
  // The one-process reference reads the stream as the workers do: the same model, bit for bit.
  TrainConfig on_stream = rc;
  on_stream.dataset.clear();
  on_stream.stream = in.string();
  const ReferenceResult from_stream = train_dynamic_reference(on_stream, herald.shards);
  EXPECT_EQ(from_stream.rows, ref.rows);
  EXPECT_EQ(from_stream.dense, ref.dense);
}

// Bags of ids on a stream (--stream-multi-hot-sep): the job trains the one-process model
// of `prep --ids hash --multi-hot-sep` of the same lines, and the reference on the stream
// equals it, bit for bit.
TEST_F(DynamicTraining, AJobOnAStreamOfBagsTrainsThePreparedFilesModel) {
  const fs::path in = dir_ / "bags", data = dir_ / "prepared-bags";
  fs::create_directories(in);
  std::string log;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 1600 --scale 0.002 --new-ids 0.2 --multi-hot 2 " +
                                  "--seed 4 --force -o " + (in / "part-1.tsv").string(),
                              log),
            0)
      << log;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " prep --ids hash --format criteo --multi-hot-sep '|' --force -o " + data.string() +
                                  " " + (in / "part-1.tsv").string(),
                              log),
            0)
      << log;
  JobOptions herald = dynamic_job("herald");
  herald.stream = in.string();
  herald.worker_args.insert(herald.worker_args.end(), {"--stream-multi-hot-sep", "|", "--stream-max-bag", "2"});
  const TrainConfig rc = dynamic_reference_config(data, herald);
  const ReferenceResult ref = train_dynamic_reference(rc, herald.shards);
  const JobResult h = run_job(data, herald, "bags-herald");
  expect_same_model(ref, h, "herald on a stream of bags", 1e-6);
  TrainConfig on_stream = rc;
  on_stream.dataset.clear();
  on_stream.stream = in.string();
  on_stream.stream_multi_hot_sep = "|";
  on_stream.stream_max_bag = 2;
  const ReferenceResult from_stream = train_dynamic_reference(on_stream, herald.shards);
  EXPECT_EQ(from_stream.rows, ref.rows);
  EXPECT_EQ(from_stream.dense, ref.dense);
}

#ifdef EMBER_HAVE_KAFKA
// The same from a Kafka topic of 2 partitions on librdkafka's mock cluster (in this
// process, over loopback): the workers consume the whole topic each, partitions in turn,
// and train the one-process model of the lines in that order.
TEST_F(DynamicTraining, AJobOnAKafkaTopicTrainsThePreparedLinesModel) {
  const fs::path tsv = dir_ / "lines.tsv", data = dir_ / "prepared";
  std::string log;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 1600 --scale 0.002 --new-ids 0.2 --seed 4 --force -o " +
                                  tsv.string() + " && " + test::bin("ember-data") + " prep --ids hash --format criteo --force -o " +
                                  data.string() + " " + tsv.string(),
                              log),
            0)
      << log;
  char err[256];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  ASSERT_EQ(rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", err, sizeof err), RD_KAFKA_CONF_OK) << err;
  std::unique_ptr<rd_kafka_t, void (*)(rd_kafka_t*)> producer(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err), rd_kafka_destroy);
  ASSERT_NE(producer, nullptr) << err;
  rd_kafka_mock_cluster_t* cluster = rd_kafka_handle_mock_cluster(producer.get());
  ASSERT_EQ(rd_kafka_mock_topic_create(cluster, "clicks", 2, 1), RD_KAFKA_RESP_ERR_NO_ERROR);
  // Line k to partition k % 2: the stream's order is the file's. The second half while
  // the job waits for it.
  std::vector<std::string> lines;
  {
    std::ifstream in(tsv);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  const auto produce = [&](std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) {
      ASSERT_EQ(
          rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC("clicks"), RD_KAFKA_V_PARTITION(static_cast<std::int32_t>(k % 2)),
                            RD_KAFKA_V_VALUE(lines[k].data(), lines[k].size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
          RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    ASSERT_EQ(rd_kafka_flush(producer.get(), 10000), RD_KAFKA_RESP_ERR_NO_ERROR);
  };
  produce(0, 800);
  JobOptions herald = dynamic_job("herald");
  herald.stream = std::string("kafka://") + rd_kafka_mock_cluster_bootstraps(cluster) + "/clicks";
  const TrainConfig rc = dynamic_reference_config(data, herald);
  const ReferenceResult ref = train_dynamic_reference(rc, herald.shards);
  const JobResult h = run_job(data, herald, "kafka-herald", [&](Processes&, Processes&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    produce(800, lines.size());
  });
  expect_same_model(ref, h, "herald on a Kafka topic", 1e-6);
}
#endif

}  // namespace
}  // namespace ember::worker
