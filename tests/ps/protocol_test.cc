// What the PS shards and the workers agree on (protocol.h, job_config.h): the job
// configuration shard 0 publishes, the checkpoint schedule both follow, and the commit
// ack's header fields.
#include "ember/ps/protocol.h"

#include <gtest/gtest.h>

#include <string>

#include "ember/common/error.h"
#include "ember/ps/job_config.h"

namespace ember::ps {
namespace {

JobConfig sample() {
  JobConfig c;
  c.num_keys = 1000;
  c.dim = 16;
  c.optimizer.kind = OptimizerKind::kAdagrad;
  c.optimizer.lr = 0.5f;
  c.optimizer.weight_decay = 0.25f;
  c.seed = 7;
  c.shards = 2;
  c.transport = "rdma";
  c.checkpoint_every = 5;
  c.checkpoints = true;
  c.restored_iteration = 40;
  c.disk_tier = true;
  return c;
}

// The published text is the format workers of other builds read: its keys must not change.
TEST(JobConfig, PublishesTheKeysWorkersRead) {
  EXPECT_EQ(sample().to_json(), R"({"checkpoint_every":5,"checkpoints":true,"dim":16,"lr":0.5,"num_keys":1000,"optimizer":"adagrad",)"
                                R"("restored_iteration":40,"row_tier":true,"seed":7,"shards":2,"transport":"rdma","weight_decay":0.25})");
  EXPECT_STREQ(kJobConfigKey, "ps_config");
}

TEST(JobConfig, ReadsBackWhatItWrites) {
  JobConfig c = sample();
  c.optimizer.lr = 0.01f;  // not exact in binary: read back to the same float
  c.restored_iteration = -1;
  const JobConfig r = JobConfig::from_json(c.to_json());
  EXPECT_EQ(r.num_keys, c.num_keys);
  EXPECT_EQ(r.dim, c.dim);
  EXPECT_EQ(r.optimizer.kind, c.optimizer.kind);
  EXPECT_EQ(r.optimizer.lr, c.optimizer.lr);
  EXPECT_EQ(r.optimizer.weight_decay, c.optimizer.weight_decay);
  EXPECT_EQ(r.seed, c.seed);
  EXPECT_EQ(r.shards, c.shards);
  EXPECT_TRUE(r.disk_tier);
  EXPECT_EQ(r.transport, c.transport);
  EXPECT_EQ(r.checkpoint_every, c.checkpoint_every);
  EXPECT_EQ(r.checkpoints, c.checkpoints);
  EXPECT_EQ(r.restored_iteration, c.restored_iteration);
  EXPECT_EQ(r.to_json(), c.to_json());
}

TEST(JobConfig, KeysLeftOutTakeTheirDefaults) {
  const std::string required = R"("num_keys":10,"dim":4,"optimizer":"sgd","lr":0.125,"weight_decay":0,"seed":3)";
  const JobConfig c = JobConfig::from_json("{" + required + "}");
  EXPECT_EQ(c.num_keys, 10u);
  EXPECT_EQ(c.optimizer.kind, OptimizerKind::kSgd);
  EXPECT_EQ(c.optimizer.lr, 0.125f);
  EXPECT_EQ(c.shards, 1u);
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_EQ(c.checkpoint_every, 0u);
  EXPECT_FALSE(c.checkpoints);
  EXPECT_EQ(c.restored_iteration, -1);
  // Periodic checkpoints imply a checkpoint directory unless the PS says otherwise.
  EXPECT_TRUE(JobConfig::from_json("{" + required + R"(,"checkpoint_every":4})").checkpoints);
  EXPECT_FALSE(JobConfig::from_json("{" + required + R"(,"checkpoint_every":4,"checkpoints":false})").checkpoints);
}

TEST(JobConfig, MalformedTextIsAProtocolError) {
  const std::string prefix = "the PS published a malformed configuration: ";
  for (const std::string& bad : {
           std::string("not json"),
           std::string(R"({"dim":4,"optimizer":"sgd","lr":0.1,"weight_decay":0,"seed":3})"),                   // no num_keys
           std::string(R"({"num_keys":"ten","dim":4,"optimizer":"sgd","lr":0.1,"weight_decay":0,"seed":3})"),  // a string
           std::string(R"({"num_keys":10,"dim":4,"optimizer":"lion","lr":0.1,"weight_decay":0,"seed":3})"),    // unknown optimizer
       }) {
    try {
      JobConfig::from_json(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const ProtocolError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    }
  }
}

TEST(CheckpointSchedule, CheckpointsEveryNthCommitAndFlushesTheIterationBefore) {
  const CheckpointSchedule never;
  const CheckpointSchedule every5(5);
  EXPECT_EQ(never.every(), 0u);
  for (std::uint64_t i = 0; i < 40; ++i) {
    EXPECT_FALSE(never.checkpoints_at_commit(i));
    EXPECT_FALSE(never.flush_after(i));
    EXPECT_EQ(every5.checkpoints_at_commit(i), (i + 1) % 5 == 0) << i;
    EXPECT_EQ(every5.flush_after(i), (i + 2) % 5 == 0) << i;  // commit(i + 1) checkpoints
    EXPECT_EQ(every5.flush_after(i), every5.checkpoints_at_commit(i + 1)) << i;
  }
  EXPECT_TRUE(every5.checkpoints_at_commit(4));
  EXPECT_TRUE(every5.flush_after(3));
  EXPECT_TRUE(CheckpointSchedule(1).checkpoints_at_commit(0));
  EXPECT_EQ(sample().schedule().every(), 5u);
}

TEST(CommitAck, HeaderFieldsCarryRowsCheckpointAndStop) {
  transport::MessageHeader h;
  h.type = transport::MessageType::kAck;
  CommitAck a;
  a.rows_updated = 1234;
  encode_commit_ack(a, h);
  EXPECT_EQ(h.flags, 1234u);
  EXPECT_EQ(h.iteration, 0u);  // no checkpoint ahead: the transport echoes the commit's iteration
  h.iteration = 9;
  CommitAck r = decode_commit_ack(h, 9);
  EXPECT_EQ(r.rows_updated, 1234u);
  EXPECT_EQ(r.checkpoint_at, 0u);
  EXPECT_FALSE(r.stop);

  a.checkpoint_at = 15;
  a.stop = true;
  encode_commit_ack(a, h);
  EXPECT_EQ(h.flags, 1234u | kAckStop);
  EXPECT_EQ(h.iteration, 15u);
  r = decode_commit_ack(h, 9);
  EXPECT_EQ(r.rows_updated, 1234u);
  EXPECT_EQ(r.checkpoint_at, 15u);
  EXPECT_TRUE(r.stop);

  // The row count never reaches the stop bit.
  a = CommitAck{};
  a.rows_updated = std::uint64_t{1} << 40;
  encode_commit_ack(a, h);
  EXPECT_EQ(h.flags, kAckStop - 1);
  EXPECT_FALSE(decode_commit_ack(h, 15).stop);
  // A push's ack: no rows, nothing named.
  transport::MessageHeader push;
  push.type = transport::MessageType::kAck;
  EXPECT_EQ(decode_commit_ack(push, 0).rows_updated, 0u);
}

}  // namespace
}  // namespace ember::ps
