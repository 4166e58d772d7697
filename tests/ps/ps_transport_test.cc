// The PS service and client over every data plane: the same BSP rounds over TCP, over
// RDMA (the in-process verbs fake) and over several TCP connections per shard, with the
// workers' pushes arriving in different orders, leave bit-identical rows and optimizer
// state.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/protocol.h"
#include "ember/ps/ps_client.h"
#include "ember/ps/ps_service.h"
#include "ember/transport/rdma.h"
#include "ember/transport/tcp.h"
#include "ember/transport/transport.h"
#include "ember/transport/verbs_fake.h"

namespace ember::ps {
namespace {

namespace fs = std::filesystem;

const std::string kToken = "ps-token";
constexpr std::uint32_t kDim = 8;
constexpr std::uint64_t kKeys = 5000;

StoreConfig config(std::uint32_t shard, std::uint32_t shards) {
  StoreConfig c;
  c.num_keys = kKeys;
  c.dim = kDim;
  c.shard = shard;
  c.shards = shards;
  c.seed = 3;
  c.optimizer.kind = OptimizerKind::kAdagrad;
  c.optimizer.lr = 0.1f;
  return c;
}

// The data plane of `kind`: "tcp", or "rdma_fake" (RDMA on `fabric`, in process).
transport::Transport data_plane(const std::string& kind, const std::shared_ptr<transport::verbs::FakeFabric>& fabric,
                                std::uint32_t rdma_slot_bytes = 4u << 20) {
  transport::TransportOptions o;
  o.kind = kind == "tcp" ? transport::TransportKind::kTcp : transport::TransportKind::kRdma;
  o.token = kToken;
  o.rdma_slot_bytes = rdma_slot_bytes;
  return transport::Transport(std::move(o), fabric);
}

// S shards of config(s, S), serving over `data`.
struct Shards {
  std::vector<std::unique_ptr<PsService>> services;
  std::vector<std::unique_ptr<transport::Server>> servers;
  std::vector<ShardAddress> addrs;
};

Shards start_shards(const transport::Transport& data, std::uint32_t S, CommitApply apply = CommitApply::kHandler,
                    std::uint32_t apply_threads = 1) {
  Shards sh;
  for (std::uint32_t s = 0; s < S; ++s) {
    StoreConfig c = config(s, S);
    if (apply_threads > 1) {
      c.apply_threads = apply_threads;
      c.inline_apply_floats = 0;  // every commit to the pool, however small
    }
    // Over RDMA, replies leave from the store's chunks in place, as in ember-ps.
    transport::Transport shard_data = data;
    if (data.kind() == transport::TransportKind::kRdma) {
      auto regions = std::make_shared<transport::SendRegions>();
      c.on_chunk = [regions](const void* p, std::size_t bytes) { regions->add(p, bytes); };
      transport::TransportOptions o = data.options();
      o.send_regions = std::move(regions);
      shard_data = transport::Transport(std::move(o), data.fabric());
    }
    sh.services.push_back(std::make_unique<PsService>(c));
    PsService* svc = sh.services.back().get();
    svc->apply_commits_on(apply);
    sh.servers.push_back(shard_data.make_server(
        [svc](const transport::Message& r, transport::OutMessage& o, transport::Scratch& x) { svc->handle(r, o, x); }));
    sh.addrs.push_back({"127.0.0.1", sh.servers.back()->port()});
  }
  return sh;
}

// S shards and two workers for 6 BSP rounds; returns every row with its state. Key
// ranges make replies leave straight from the store and land straight in the pulled rows.

// Three workers push each round in the order rotated by `first` (0, 1 or 2): rows
// trained by all three must not depend on which push arrives first.
std::vector<float> run_rounds(const std::string& kind, std::uint32_t S, std::uint32_t connections = 1,
                              CommitApply apply = CommitApply::kHandler, std::uint32_t apply_threads = 1, int first = 0) {
  auto fabric = std::make_shared<transport::verbs::FakeFabric>();
  const transport::Transport data = data_plane(kind, fabric, 1 << 20);
  const Shards shards = start_shards(data, S, apply, apply_threads);
  const std::vector<ShardAddress>& addrs = shards.addrs;
  const std::uint32_t state = state_floats(OptimizerKind::kAdagrad, kDim);
  const Connector connect = data.make_connector();
  PsClient w0(addrs, kDim, state, connect, connections), w1(addrs, kDim, state, connect, connections),
      w2(addrs, kDim, state, connect, connections);
  PsClient* workers[3] = {&w0, &w1, &w2};
  std::vector<float> rows;
  for (std::uint64_t t = 0; t < 6; ++t) {
    // All three train keys [100t, 100t + 300) (3 trainers), workers 0 and 1 also
    // [100t + 300, 100t + 400) (2 trainers); each trains 500 keys of its own, with
    // repeats in the pull lists.
    for (int j = 0; j < 3; ++j) {
      const int w = (j + first) % 3;
      PsClient& c = *workers[w];
      std::vector<Key> keys;
      std::vector<std::uint32_t> trainers;
      for (Key k = 100 * t; k < 100 * t + 300; ++k) keys.push_back(k), trainers.push_back(3);
      if (w < 2) {
        for (Key k = 100 * t + 300; k < 100 * t + 400; ++k) keys.push_back(k), trainers.push_back(2);
      }
      for (Key k = 1500 + 1000 * w + 7 * t; k < 1500 + 1000 * w + 7 * t + 500; ++k) keys.push_back(k), trainers.push_back(1);
      std::vector<float> pulled;
      std::vector<Key> with_repeats = keys;
      with_repeats.insert(with_repeats.end(), keys.begin(), keys.begin() + 50);
      c.pull(with_repeats, pulled, true, t);
      std::vector<float> undeduplicated;  // the repeats fetched twice: the same rows
      c.pull(with_repeats, undeduplicated, true, t, PsClient::Dedup::kNo);
      EXPECT_EQ(undeduplicated, pulled);
      std::vector<float> grads(keys.size() * kDim);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        for (std::uint32_t d = 0; d < kDim; ++d)
          grads[i * kDim + d] = 0.01f * pulled[i * (kDim + state) + d] + 0.001f * static_cast<float>(w + d);
      }
      c.push_grad(t, keys, trainers, grads);
    }
    for (PsClient* c : workers) c->commit(t + 1);
  }
  std::vector<Key> all;
  for (Key k = 0; k < kKeys; ++k) all.push_back(k);
  w0.pull(all, rows, true, 6);
  if (kind != "tcp") {
    // Pulls of consecutive keys (per shard) went out gathered from the store, not copied.
    std::uint64_t in_place = 0;
    for (const auto& s : shards.servers) in_place += dynamic_cast<const transport::RdmaServer&>(*s).bytes_sent_in_place();
    EXPECT_GE(in_place, 4ull * kKeys * (kDim + state));  // at least the last pull's rows
    EXPECT_GT(fabric->gathered_sends(), 0u);
  }
  return rows;
}

class PsTransports : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(PsTransports, BspRoundsGiveTheSameRowsOverTcpAndRdma) {
  // The workers' pushes arrive in another order in each run but the first two.
  std::vector<float> tcp = run_rounds("tcp", GetParam());
  std::vector<float> rdma = run_rounds("rdma_fake", GetParam());
  std::vector<float> spread = run_rounds("tcp", GetParam(), 3, CommitApply::kHandler, 1, 1);   // three connections per shard
  std::vector<float> applier = run_rounds("tcp", GetParam(), 1, CommitApply::kApplier, 1, 2);  // commits applied by the store's thread
  // Three applier threads sharing every commit's batches (those of the shard's receiving
  // threads: three connections per shard spread the rows over them).
  std::vector<float> pool = run_rounds("tcp", GetParam(), 3, CommitApply::kApplier, 3, 1);
  ASSERT_EQ(tcp.size(), rdma.size());
  ASSERT_EQ(tcp, spread);
  ASSERT_EQ(tcp, applier);
  ASSERT_EQ(tcp, pool);
  std::size_t moved = 0;
  std::vector<float> fresh;
  for (std::size_t i = 0; i < tcp.size(); ++i) {
    ASSERT_EQ(tcp[i], rdma[i]) << "float " << i;
  }
  // And training did change rows (the comparison is not between two untouched tables).
  StoreConfig c = config(0, 1);
  ShardStore untouched(c);
  std::vector<Key> all;
  for (Key k = 0; k < kKeys; ++k) all.push_back(k);
  fresh.resize(tcp.size());
  untouched.pull_with_state(all, fresh.data());
  for (std::size_t i = 0; i < tcp.size(); ++i) moved += tcp[i] != fresh[i];
  EXPECT_GT(moved, 10000u);
}

INSTANTIATE_TEST_SUITE_P(Shards, PsTransports, ::testing::Values(1u, 2u, 3u));

// --apply-commits auto: the applier for rows of 1 KB and up (value and state) when the
// shard's I/O and applier threads take at most half the cores; the handler otherwise.
TEST(CommitApplyChoice, AutoTakesTheApplierForLargeRowsWithSpareCores) {
  EXPECT_EQ(choose_commit_apply("auto", 1024, 4, 4, 16).where, CommitApply::kApplier);
  EXPECT_EQ(choose_commit_apply("auto", 512, 4, 4, 16).where, CommitApply::kHandler);  // 256 B of value, 256 of state
  EXPECT_EQ(choose_commit_apply("auto", 1024, 4, 4, 15).where, CommitApply::kHandler);
  EXPECT_EQ(choose_commit_apply("auto", 4096, 4, 4, 2).where, CommitApply::kHandler);  // a 2-core host
  EXPECT_EQ(choose_commit_apply("auto", 4096, 4, 4, 0).where, CommitApply::kHandler);  // cores unknown
  EXPECT_EQ(choose_commit_apply("handler", 4096, 1, 1, 64).where, CommitApply::kHandler);
  EXPECT_EQ(choose_commit_apply("applier", 64, 4, 4, 2).where, CommitApply::kApplier);
  const CommitApplyChoice c = choose_commit_apply("auto", 1024, 4, 4, 16);
  EXPECT_EQ(c.why, "auto: rows of 1024 B, 8 I/O and applier threads on 16 cores");
  EXPECT_EQ(choose_commit_apply("auto", 1024, 4, 4, 1).why, "auto: rows of 1024 B, 8 I/O and applier threads on 1 core");
  EXPECT_THROW(choose_commit_apply("fast", 1024, 4, 4, 16), ConfigError);
}

// A pull whose connection breaks is sent again on a new one (pulls change nothing);
// a push whose connection breaks fails (it may have been applied).
TEST(PsClientRetry, PullsRetryOnceOnANewConnectionPushesDoNot) {
  PsService svc(config(0, 1));
  std::atomic<int> pulls{0}, pushes{0};
  transport::TcpServerOptions o;
  o.token = kToken;
  transport::TcpServer server(o, [&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) {
    // The first pull and every push kill their connection (an exception that is not a refusal).
    if (r.header.type == transport::MessageType::kPull && pulls++ == 0) throw std::runtime_error("injected failure");
    if (r.header.type == transport::MessageType::kPushGrad && pushes++ >= 0) throw std::runtime_error("injected failure");
    svc.handle(r, out, x);
  });
  PsClient c({{"127.0.0.1", server.port()}}, kToken, kDim, state_floats(OptimizerKind::kAdagrad, kDim), std::chrono::milliseconds(2000));
  std::vector<Key> keys = {1, 2, 3, 2};
  std::vector<float> rows;
  c.pull(keys, rows, false, 0);
  EXPECT_EQ(c.retries(), 1u);
  ASSERT_EQ(rows.size(), 4u * kDim);
  EXPECT_EQ(rows[3 * kDim], rows[1 * kDim]);
  std::vector<float> g(3 * kDim, 0.1f);
  EXPECT_THROW(c.push_grad(0, {1, 2, 3}, {1, 1, 1}, g), IoError);
  EXPECT_EQ(pushes.load(), 1);
  // On the wire: the pull went out twice (3 distinct keys each time) and was answered
  // once; the push went out and nothing came back.
  constexpr std::uint64_t H = transport::kHeaderBytes;
  EXPECT_EQ(c.tally().pull.out, 2 * (H + 8 * 3));
  EXPECT_EQ(c.tally().pull.in, H + 4 * 3 * kDim);
  EXPECT_EQ(c.tally().push_grad.out, H + 8 * 6 + 4 * 3 * kDim);
  EXPECT_EQ(c.tally().push_grad.in, 0u);
}

// Dynamic tables: rows reset before commit(t) change at that commit, after its updates
// and before any pull of t, over two shards and two connections each; the shards count
// the resets they were sent.
TEST(PsResets, ResetsSentBeforeACommitTakeEffectAtIt) {
  auto fabric = std::make_shared<transport::verbs::FakeFabric>();
  const transport::Transport data = data_plane("tcp", fabric);
  const Shards shards = start_shards(data, 2);
  const std::uint32_t state = state_floats(OptimizerKind::kAdagrad, kDim);
  PsClient c(shards.addrs, kDim, state, data.make_connector(), 2);
  const std::vector<Key> slots = {4, 5, 10, 11};
  const std::vector<std::uint64_t> ids = {0x01000000000000aaULL, kFreeSlot, 0x02000000000000bbULL, 0x02000000000000ccULL};
  std::vector<float> before, after;
  c.pull(slots, before, false, 0);
  c.push_grad(0, {4}, {1}, std::vector<float>(kDim, 0.5f));  // an update of the slot's old id, applied first
  c.start_reset_rows(1, slots, ids).wait();
  std::vector<float> still;
  c.pull(slots, still, false, 0);
  EXPECT_EQ(still, before) << "no reset before its commit";
  c.commit(1);
  c.pull(slots, after, false, 1);
  std::vector<float> want(kDim);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (ids[i] == kFreeSlot)
      want.assign(kDim, 0.0f);
    else
      initial_row(3, ids[i], kDim, want.data());
    EXPECT_EQ(std::vector<float>(after.begin() + i * kDim, after.begin() + (i + 1) * kDim), want) << "slot " << slots[i];
  }
  std::uint64_t reset = 0;
  for (const auto& svc : shards.services) reset += svc->served().kinds[ServedCounts::kReset].rows.load();
  EXPECT_EQ(reset, slots.size());
  EXPECT_EQ(c.tally().reset.rows, slots.size());
}

// Futures: write-backs, gradients and a pull in flight together, waited in any order,
// give what the same calls one after another give; a refused request fails its own
// future and nothing else.
class PsFutures : public ::testing::TestWithParam<std::string> {};

TEST_P(PsFutures, OperationsInFlightTogetherMatchOneAtATime) {
  const transport::Transport data = data_plane(GetParam(), std::make_shared<transport::verbs::FakeFabric>());
  const std::uint32_t S = 2, state = state_floats(OptimizerKind::kAdagrad, kDim);
  auto run = [&](bool together) {
    const Shards shards = start_shards(data, S);
    PsClient c(shards.addrs, kDim, state, data.make_connector(), 2);
    std::vector<float> trace;
    for (std::uint64_t t = 0; t < 4; ++t) {
      std::vector<Key> own, written, pulled_keys;
      for (Key k = 10 * t; k < 10 * t + 40; ++k) own.push_back(k);
      for (Key k = 1000 + 50 * t; k < 1000 + 50 * t + 30; ++k) written.push_back(k);
      for (Key k = 3000 + 20 * t; k < 3000 + 20 * t + 60; ++k) pulled_keys.push_back(k);
      pulled_keys.push_back(pulled_keys[5]);  // a repeat: copied at wait()
      std::vector<float> base;
      c.pull(own, base, true, t);
      std::vector<float> grads(own.size() * kDim), values(written.size() * (kDim + state));
      for (std::size_t i = 0; i < grads.size(); ++i)
        grads[i] = 0.01f * base[i / kDim * (kDim + state) + i % kDim] + 0.002f * static_cast<float>(t);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f + 0.001f * static_cast<float>(i + t);
      std::vector<std::uint32_t> trainers(own.size(), 1);
      std::vector<float> pulled;
      if (together) {
        PsFuture v = c.start_push_value(written, values);
        PsFuture g = c.start_push_grad(t, own, trainers, grads);
        PsFuture p = c.start_pull(pulled_keys, pulled, true, t);
        values.assign(values.size(), -1.0f);  // inputs are read before start_* returns
        grads.assign(grads.size(), -1.0f);
        EXPECT_EQ(p.wait(), 0u);  // the pull first: the pushes' replies are kept for them
        EXPECT_EQ(g.wait(), 0u);
        EXPECT_EQ(v.wait(), 0u);
        EXPECT_EQ(v.wait(), 0u);  // a second wait returns the same
        EXPECT_EQ(c.start_commit(t + 1).wait(), own.size());
      } else {
        c.push_value(written, values);
        c.push_grad(t, own, trainers, grads);
        c.pull(pulled_keys, pulled, true, t);
        EXPECT_EQ(c.commit(t + 1), own.size());
      }
      const std::size_t per = kDim + state, last = pulled_keys.size() - 1;
      EXPECT_TRUE(std::equal(pulled.begin() + last * per, pulled.end(), pulled.begin() + 5 * per));  // the repeat
      trace.insert(trace.end(), pulled.begin(), pulled.end());
    }
    std::vector<Key> all;
    for (Key k = 0; k < kKeys; ++k) all.push_back(k);
    std::vector<float> rows;
    c.pull(all, rows, true, 4);
    trace.insert(trace.end(), rows.begin(), rows.end());
    // A refused push fails its future only; the pull beside it is answered.
    std::vector<float> g(kDim, 0.1f), r;
    PsFuture bad = c.start_push_grad(4, {kKeys + 7}, {1}, g);
    PsFuture good = c.start_pull({1, 2, 3}, r, false, 4);
    EXPECT_NO_THROW(good.wait());
    EXPECT_EQ(r.size(), 3u * kDim);
    try {
      bad.wait();
      ADD_FAILURE() << "a push of a key beyond the tables was accepted";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("beyond"), std::string::npos) << e.what();
    }
    {
      // A future left unwaited is waited when it goes: its rows are in place.
      std::vector<float> late;
      { PsFuture f = c.start_pull({4, 5}, late, false, 4); }
      std::vector<float> again;
      c.pull({4, 5}, again, false, 4);
      EXPECT_EQ(late, again);
    }
    return trace;
  };
  const std::vector<float> one_at_a_time = run(false), together = run(true);
  ASSERT_EQ(one_at_a_time.size(), together.size());
  EXPECT_TRUE(one_at_a_time == together);
}

INSTANTIATE_TEST_SUITE_P(Transports, PsFutures, ::testing::Values("tcp", "rdma_fake"));

// The client's tally of bytes on the wire: every message it sent and every reply it read,
// headers included, under the kind of its operation, exactly as the transports frame
// them (message.h: a 48-byte header, 8 bytes a key, 4 a float), whichever data plane.
class PsWireTally : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr std::uint64_t H = transport::kHeaderBytes;
  static void expect_same(const WireTally::Dir& a, const WireTally::Dir& b, const char* kind) {
    EXPECT_EQ(a.out, b.out) << kind;
    EXPECT_EQ(a.in, b.in) << kind;
  }
  const transport::Transport data = data_plane(GetParam(), std::make_shared<transport::verbs::FakeFabric>());
};

TEST_P(PsWireTally, EachKindCountsItsRequestsAndRepliesWithHeaders) {
  const std::uint32_t state = state_floats(OptimizerKind::kAdagrad, kDim);
  const Shards one = start_shards(data, 1);
  PsClient c(one.addrs, kDim, state, data.make_connector());
  const WireTally& w = c.tally();
  EXPECT_EQ(w.out(), 0u);  // the connection's hello is no request
  EXPECT_EQ(w.in(), 0u);
  constexpr std::uint64_t n = 25;
  std::vector<Key> keys;
  for (Key k = 40; k < 40 + n; ++k) keys.push_back(k);
  std::vector<float> rows;
  // A pull: its keys out, dim floats a row back.
  c.pull(keys, rows, false, 0);
  EXPECT_EQ(w.pull.out, H + 8 * n);
  EXPECT_EQ(w.pull.in, H + 4 * n * kDim);
  // With state: the same request, state_floats more floats a row back.
  WireTally before = w;
  c.pull(keys, rows, true, 0);
  EXPECT_EQ(w.pull.out - before.pull.out, H + 8 * n);
  EXPECT_EQ(w.pull.in - before.pull.in, H + 4 * n * (kDim + state));
  // Repeated keys cross the wire once, unless the caller says its keys are distinct.
  std::vector<Key> repeats = keys;
  repeats.insert(repeats.end(), keys.begin(), keys.begin() + 5);
  before = w;
  c.pull(repeats, rows, false, 0);
  EXPECT_EQ(w.pull.out - before.pull.out, H + 8 * n);
  EXPECT_EQ(w.pull.in - before.pull.in, H + 4 * n * kDim);
  before = w;
  c.pull(repeats, rows, false, 0, PsClient::Dedup::kNo);
  EXPECT_EQ(w.pull.out - before.pull.out, H + 8 * (n + 5));
  EXPECT_EQ(w.pull.in - before.pull.in, H + 4 * (n + 5) * kDim);
  expect_same(w.push_grad, {}, "push_grad");
  expect_same(w.push_value, {}, "push_value");
  expect_same(w.commit, {}, "commit");

  // Gradients: keys and a trainer count each (8 bytes apiece), dim floats a row, one
  // header; an acknowledgement (a header) back.
  before = w;
  std::vector<float> grads(n * kDim, 0.01f);
  c.push_grad(0, keys, std::vector<std::uint32_t>(n, 1), grads);
  const std::uint64_t grad_payload = 8 * 2 * n + 4 * n * kDim;
  EXPECT_GE(w.push_grad.out, grad_payload);
  EXPECT_LE(w.push_grad.out, grad_payload + H);
  EXPECT_EQ(w.push_grad.out, grad_payload + H);
  EXPECT_EQ(w.push_grad.in, H);
  // Write-backs: keys and dim + state floats a row.
  std::vector<Key> written;
  for (Key k = 2000; k < 2000 + n; ++k) written.push_back(k);
  c.push_value(written, std::vector<float>(n * (kDim + state), 0.5f));
  const std::uint64_t value_payload = 8 * n + 4 * n * (kDim + state);
  EXPECT_GE(w.push_value.out, value_payload);
  EXPECT_LE(w.push_value.out, value_payload + H);
  EXPECT_EQ(w.push_value.out, value_payload + H);
  EXPECT_EQ(w.push_value.in, H);
  expect_same(w.pull, before.pull, "pull");
  expect_same(w.commit, {}, "commit");

  // A commit: a header each way, counted under commit only.
  before = w;
  EXPECT_EQ(c.commit(1), n);
  EXPECT_EQ(w.commit.out, H);
  EXPECT_EQ(w.commit.in, H);
  expect_same(w.pull, before.pull, "pull");
  expect_same(w.push_grad, before.push_grad, "push_grad");
  expect_same(w.push_value, before.push_value, "push_value");
  // A refused push: its request went out, and its refusal's header came back.
  before = w;
  EXPECT_THROW(c.push_grad(1, {kKeys + 7}, {1}, std::vector<float>(kDim, 0.1f)), ProtocolError);
  EXPECT_EQ(w.push_grad.out - before.push_grad.out, H + 8 * 2 + 4 * kDim);
  EXPECT_EQ(w.push_grad.in - before.push_grad.in, H);
  EXPECT_EQ(w.out(), w.pull.out + w.push_grad.out + w.push_value.out + w.commit.out);
  EXPECT_EQ(w.in(), w.pull.in + w.push_grad.in + w.push_value.in + w.commit.in);
}

// Pulled bytes grow with dim and with the state, by exactly the floats added.
TEST_P(PsWireTally, PulledBytesGrowByTheFloatsEachRowAdds) {
  constexpr std::uint64_t n = 30;
  std::vector<Key> keys;
  for (Key k = 100; k < 100 + n; ++k) keys.push_back(k);
  auto pulled = [&](std::uint32_t dim, bool with_state) {
    StoreConfig sc = config(0, 1);
    sc.dim = dim;
    PsService svc(sc);
    const auto server =
        data.make_server([&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { svc.handle(r, out, x); });
    PsClient c({{"127.0.0.1", server->port()}}, dim, state_floats(OptimizerKind::kAdagrad, dim), data.make_connector());
    std::vector<float> rows;
    c.pull(keys, rows, with_state, 0);
    EXPECT_EQ(c.tally().pull.out, H + 8 * n);  // the request does not depend on the rows
    return c.tally().pull.in;
  };
  const std::uint64_t base = pulled(kDim, false);
  EXPECT_EQ(base, H + 4 * n * kDim);
  EXPECT_EQ(pulled(2 * kDim, false) - base, 4 * n * kDim);
  EXPECT_EQ(pulled(kDim, true) - base, 4 * n * state_floats(OptimizerKind::kAdagrad, kDim));
  EXPECT_EQ(pulled(2 * kDim, true) - base, 4 * n * (kDim + state_floats(OptimizerKind::kAdagrad, 2 * kDim)));
}

// Over several shards each request is one message per shard, each with its header.
TEST_P(PsWireTally, EveryShardsMessageCarriesAHeader) {
  const std::uint32_t S = 3, state = state_floats(OptimizerKind::kAdagrad, kDim);
  const Shards shards = start_shards(data, S);
  PsClient c(shards.addrs, kDim, state, data.make_connector());
  constexpr std::uint64_t n = 30;  // 10 keys on each shard
  std::vector<Key> keys;
  for (Key k = 0; k < n; ++k) keys.push_back(k);
  std::vector<float> rows;
  c.pull(keys, rows, true, 0);
  EXPECT_EQ(c.tally().pull.out, S * H + 8 * n);
  EXPECT_EQ(c.tally().pull.in, S * H + 4 * n * (kDim + state));
  c.push_grad(0, keys, std::vector<std::uint32_t>(n, 1), std::vector<float>(n * kDim, 0.01f));
  EXPECT_EQ(c.tally().push_grad.out, S * H + 8 * 2 * n + 4 * n * kDim);
  EXPECT_EQ(c.tally().push_grad.in, S * H);
  EXPECT_EQ(c.commit(1), n);
  EXPECT_EQ(c.tally().commit.out, S * H);
  EXPECT_EQ(c.tally().commit.in, S * H);
  EXPECT_EQ(c.tally().push_value.out + c.tally().push_value.in, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, PsWireTally, ::testing::Values("tcp", "rdma_fake"));

// A large request sent while a large pull's rows are unread, with small socket buffers:
// the pull is read first, so neither end blocks writing to the other (else both block
// until the client's send times out).
TEST(PsFuturesTcp, ALargePushAfterALargePullDoesNotStall) {
  StoreConfig sc;
  sc.num_keys = 1 << 16;
  sc.dim = 64;
  PsService svc(sc);
  transport::TransportOptions o;
  o.token = kToken;
  o.timeout = std::chrono::milliseconds(3000);
  o.socket_buffer_bytes = 64 << 10;
  const transport::Transport data(std::move(o));
  const auto server =
      data.make_server([&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { svc.handle(r, out, x); });
  PsClient c({{"127.0.0.1", server->port()}}, sc.dim, 0, data.make_connector());
  std::vector<Key> pulled(1 << 15), pushed(1 << 15);  // 8 MiB each way
  for (Key k = 0; k < pulled.size(); ++k) pulled[k] = k, pushed[k] = (1 << 15) + k;
  std::vector<float> rows, grads(pushed.size() * sc.dim, 0.01f);
  std::vector<std::uint32_t> trainers(pushed.size(), 1);
  PsFuture p = c.start_pull(pulled, rows, false, 0, PsClient::Dedup::kNo);
  PsFuture g = c.start_push_grad(0, pushed, trainers, grads);
  EXPECT_NO_THROW(g.wait());
  EXPECT_NO_THROW(p.wait());
  EXPECT_EQ(c.commit(1), pushed.size());
  std::vector<float> first(sc.dim);
  svc.store().pull({&pulled[7], 1}, first.data());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), rows.begin() + 7 * sc.dim));
}

// A future whose client went first reports it instead of reading a closed connection.
TEST(PsFuturesTcp, AFutureOutlivingItsClientSaysSo) {
  PsService svc(config(0, 1));
  transport::TcpServerOptions o;
  o.token = kToken;
  transport::TcpServer server(
      o, [&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { svc.handle(r, out, x); });
  std::vector<float> rows;
  PsFuture f;
  {
    PsClient c({{"127.0.0.1", server.port()}}, kToken, kDim, 0);
    f = c.start_pull({1, 2}, rows, false, 0);
  }
  try {
    f.wait();
    ADD_FAILURE() << "a pull answered after its client closed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("client closed"), std::string::npos) << e.what();
  }
}

// Every worker commits each iteration; the shard writes a checkpoint iteration's file
// once, at its first commit, while the other workers' commits wait (they used to write
// it once each, the later ones while acknowledged workers read on, which crashed the
// PS). The file holds the rows of that iteration; a checkpoint that cannot be written
// is logged and counted, and the commit still stands.
class PsCheckpoints : public test::TempDirTest {};

// A shard with a checkpoint directory and no period (it writes only what is asked for;
// keeps all), served over TCP, and one worker's client of it.
struct OnCommandShard {
  // What one commit's acks said.
  struct Ack {
    std::uint64_t updated, checkpoint_at, stop_at;
  };
  // An empty `dir`: a shard without a checkpoint directory.
  explicit OnCommandShard(const fs::path& dir) : dir(dir), svc(config(0, 1)) {
    if (!dir.empty()) svc.checkpoint_every(0, CheckpointDir(dir, 0, 1, 0));
    transport::TcpServerOptions o;
    o.token = kToken;
    server.emplace(o, [this](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { svc.handle(r, out, x); });
    w.emplace(std::vector<ShardAddress>{{"127.0.0.1", server->port()}}, kToken, kDim, 0);
  }
  // Iteration `it` of the worker: three rows it alone trained pushed, then commit(it)
  // with `flags` (kCommitCheckpoint, kCommitStop).
  Ack commit(std::uint64_t it, std::uint32_t flags = 0) {
    std::vector<Key> keys = {it, it + 100, it + 200};
    std::vector<float> g(keys.size() * kDim, 0.25f);
    std::vector<std::uint32_t> one(keys.size(), 1);
    w->push_grad(it, keys, one, g);
    PsFuture f = w->start_commit(it, flags);
    const std::uint64_t updated = f.wait();
    return Ack{updated, f.checkpoint_at(), f.stop_at()};
  }
  // Whether the checkpoint of `it` is written whole.
  bool written(std::int64_t it) const { return fs::exists(checkpoint_dir(dir, it) / "manifest.json"); }
  fs::path dir;
  PsService svc;
  std::optional<transport::TcpServer> server;
  std::optional<PsClient> w;
};

// Checkpoints without --checkpoint-every: one asked for on command lands kCheckpointLead
// iterations after the last commit, and until then every commit's ack names it; a
// commit flagged kCommitCheckpoint (workers that flushed for it) writes one; a shard
// restored from an iteration does not write that one again.
TEST_F(PsCheckpoints, OnCommandAndFlaggedCommitsCheckpointAtTheIterationNamed) {
  OnCommandShard shard(dir_ / "ckpt");
  PsService& svc = shard.svc;
  auto commit = [&](std::uint64_t it, bool flagged = false) { return shard.commit(it, flagged ? kCommitCheckpoint : 0).checkpoint_at; };
  for (std::uint64_t it = 0; it < 3; ++it) EXPECT_EQ(commit(it), 0u) << "nothing asked yet";
  EXPECT_EQ(svc.checkpoints_written(), 0u);
  const std::int64_t at = svc.request_checkpoint();
  ASSERT_EQ(at, 2 + kCheckpointLead);
  commit(3);
  EXPECT_EQ(svc.request_checkpoint(), at) << "asked again while one is ahead: the same one (the workers may be flushing for it)";
  for (std::uint64_t it = 4; it < static_cast<std::uint64_t>(at); ++it)
    EXPECT_EQ(commit(it), static_cast<std::uint64_t>(at)) << "commit " << it;
  EXPECT_EQ(svc.checkpoints_written(), 0u);
  EXPECT_EQ(commit(static_cast<std::uint64_t>(at)), 0u) << "the checkpoint is written: no longer ahead";
  EXPECT_TRUE(shard.written(at));
  EXPECT_EQ(svc.checkpoints_written(), 1u);
  EXPECT_EQ(commit(9), 0u);
  EXPECT_FALSE(shard.written(9));
  EXPECT_EQ(commit(10, true), 0u);  // flagged
  EXPECT_TRUE(shard.written(10));
  // Restored from 12: the workers resuming there commit 12 again, flagged; not rewritten.
  svc.restored_from(12);
  commit(12, true);
  EXPECT_FALSE(shard.written(12));
  EXPECT_EQ(svc.last_written_checkpoint(), 12);  // (an exit checkpoint of 12 keeps the restored one)
  commit(13, true);
  EXPECT_TRUE(shard.written(13));
  EXPECT_EQ(svc.checkpoints_written(), 3u);
  // Asked for again once the last one is written: a new one, after the last commit.
  EXPECT_EQ(svc.request_checkpoint(), 13 + kCheckpointLead);
  // Without a checkpoint directory there is nothing to ask for.
  PsService none(config(0, 1));
  EXPECT_EQ(none.request_checkpoint(), -1);
}

// A stop (SIGTERM with --checkpoint-on-exit) is a checkpoint on command that the commit
// acks also flag kAckStop, so the workers finish there: the acks name it and say so, the
// rows-updated count beside the flag stays right, and a stop asked for while a plain
// checkpoint is still ahead waits for it (the workers may have planned past stopping there).
TEST_F(PsCheckpoints, AStopIsACheckpointTheAcksSayTheJobEndsAt) {
  OnCommandShard shard(dir_ / "ckpt");
  PsService& svc = shard.svc;
  using Ack = OnCommandShard::Ack;
  shard.commit(0);
  shard.commit(1);
  // A plain checkpoint ahead at 7: a stop waits for it.
  ASSERT_EQ(svc.request_checkpoint(), 1 + kCheckpointLead);
  EXPECT_EQ(svc.request_stop(), -2);
  EXPECT_EQ(svc.stop_at(), -1);
  for (std::uint64_t it = 2; it < 7; ++it) {
    const Ack a = shard.commit(it);
    EXPECT_EQ(a.checkpoint_at, 7u);
    EXPECT_EQ(a.stop_at, 0u) << "a plain checkpoint is no stop";
  }
  shard.commit(7, kCommitCheckpoint);
  EXPECT_TRUE(shard.written(7));
  // Now the stop: kCheckpointLead after the last commit, flagged in every ack until then.
  const std::int64_t at = svc.request_stop();
  ASSERT_EQ(at, 7 + kCheckpointLead);
  EXPECT_EQ(svc.stop_at(), at);
  EXPECT_EQ(svc.request_stop(), at) << "asked again: the same one";
  EXPECT_EQ(svc.request_checkpoint(), at) << "a checkpoint asked for meanwhile is the stop's";
  for (std::uint64_t it = 8; it < static_cast<std::uint64_t>(at); ++it) {
    const Ack a = shard.commit(it);
    EXPECT_EQ(a.updated, 3u) << "the rows updated, without the stop flag's bit";
    EXPECT_EQ(a.checkpoint_at, static_cast<std::uint64_t>(at));
    EXPECT_EQ(a.stop_at, static_cast<std::uint64_t>(at));
  }
  const Ack last = shard.commit(static_cast<std::uint64_t>(at), kCommitCheckpoint);
  EXPECT_EQ(last.stop_at, 0u) << "written: no longer ahead";
  EXPECT_TRUE(shard.written(at));
  EXPECT_EQ(svc.last_written_checkpoint(), at) << "so the exit checkpoint keeps it";
  PsService none(config(0, 1));
  EXPECT_EQ(none.request_stop(), -1) << "no directory: no checkpoint to stop at";
}

// A worker signalled to stop flags its commits kCommitStop until an ack names the stop:
// the shard stops the job as request_stop() does, a lead after that commit (after a
// plain checkpoint still ahead, which it cannot turn into the stop); later flags change
// nothing; a shard without a checkpoint directory names none.
TEST_F(PsCheckpoints, AWorkerAsksForTheStopByFlaggingItsCommits) {
  OnCommandShard shard(dir_ / "ckpt");
  PsService& svc = shard.svc;
  using Ack = OnCommandShard::Ack;
  shard.commit(0);
  ASSERT_EQ(svc.request_checkpoint(), kCheckpointLead);
  Ack a = shard.commit(1, kCommitStop);
  EXPECT_EQ(a.checkpoint_at, static_cast<std::uint64_t>(kCheckpointLead));
  EXPECT_EQ(a.stop_at, 0u) << "a plain checkpoint is ahead: the workers may plan past stopping there";
  EXPECT_EQ(svc.stop_at(), -1);
  for (std::uint64_t it = 2; it < static_cast<std::uint64_t>(kCheckpointLead); ++it) shard.commit(it);
  shard.commit(kCheckpointLead, kCommitCheckpoint);
  ASSERT_TRUE(shard.written(kCheckpointLead));
  const std::uint64_t asked_at = kCheckpointLead + 1, stop = asked_at + kCheckpointLead;
  a = shard.commit(asked_at, kCommitStop);
  EXPECT_EQ(a.stop_at, stop) << "named by the very ack of the flagged commit";
  EXPECT_EQ(a.updated, 3u);
  EXPECT_EQ(svc.stop_at(), static_cast<std::int64_t>(stop));
  for (std::uint64_t it = asked_at + 1; it < stop; ++it) {
    a = shard.commit(it, kCommitStop);  // another worker's flag, or one sent before it heard
    EXPECT_EQ(a.stop_at, stop) << "commit " << it;
    EXPECT_EQ(a.checkpoint_at, stop);
  }
  a = shard.commit(stop, kCommitCheckpoint);
  EXPECT_EQ(a.stop_at, 0u);
  EXPECT_TRUE(shard.written(static_cast<std::int64_t>(stop)));
  EXPECT_EQ(svc.last_written_checkpoint(), static_cast<std::int64_t>(stop));

  OnCommandShard none({});
  EXPECT_EQ(none.commit(0, kCommitStop).stop_at, 0u) << "no directory: no checkpoint to stop at";
  EXPECT_EQ(none.commit(1, kCommitStop).checkpoint_at, 0u);
  EXPECT_EQ(none.svc.stop_at(), -1);
}

TEST_F(PsCheckpoints, EveryWorkerCommitsOneCheckpointIsWritten) {
  constexpr int kWorkers = 3;
  constexpr std::uint64_t kIterations = 6, kEvery = 2;
  PsService svc(config(0, 1));
  ShardStore reference(config(0, 1));
  svc.checkpoint_every(kEvery, CheckpointDir(dir_ / "ckpt", 0, 1, 2));  // keeps the newest 2
  transport::TcpServerOptions o;
  o.token = kToken;
  transport::TcpServer server(
      o, [&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { svc.handle(r, out, x); });
  std::vector<std::unique_ptr<PsClient>> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.push_back(std::make_unique<PsClient>(std::vector<ShardAddress>{{"127.0.0.1", server.port()}}, kToken, kDim, 0));
  auto rows_of = [](int w, std::uint64_t it) {  // each worker's own rows: one trainer each
    std::vector<Key> keys;
    for (Key k = 0; k < 50; ++k) keys.push_back((it * 50 + k) * kWorkers + static_cast<Key>(w));
    return keys;
  };
  std::vector<float> at_last_checkpoint;
  std::vector<Key> trained;
  for (std::uint64_t it = 0; it < kIterations; ++it) {
    for (int w = 0; w < kWorkers; ++w) {
      std::vector<Key> keys = rows_of(w, it);
      std::vector<float> g(keys.size() * kDim, 0.01f * static_cast<float>(w + 1));
      std::vector<std::uint32_t> one(keys.size(), 1);
      workers[w]->push_grad(it, keys, one, g);
      reference.push_grad(it, keys, one, g.data());
      trained.insert(trained.end(), keys.begin(), keys.end());
    }
    reference.commit();
    // All commit at once; each then reads rows nobody touched yet, as a worker's next
    // pull does, while the others' commits may still be in.
    std::vector<std::thread> ts;
    for (int w = 0; w < kWorkers; ++w) {
      ts.emplace_back([&, w] {
        workers[w]->commit(it);
        std::vector<Key> fresh;
        for (Key k = 0; k < 200; ++k) fresh.push_back(4000 + it * 150 + k + 10 * static_cast<Key>(w));
        std::vector<float> rows;
        workers[w]->pull(fresh, rows, false, it);
      });
    }
    for (auto& t : ts) t.join();
    if ((it + 1) % kEvery == 0) {
      at_last_checkpoint.resize(trained.size() * kDim);
      reference.pull(trained, at_last_checkpoint.data());
    }
  }
  EXPECT_EQ(svc.checkpoints_written(), kIterations / kEvery);
  EXPECT_EQ(svc.checkpoint_failures(), 0u);
  EXPECT_EQ(svc.last_checkpoint_iteration(), static_cast<std::int64_t>(kIterations - 1));
  // Iterations 1, 3 and 5 were checkpointed, each whole (one shard): 1 was pruned.
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "iter-000000001"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "iter-000000003" / "manifest.json"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "iter-000000005" / "manifest.json"));
  const RestorePlan plan = plan_restore(dir_ / "ckpt");
  EXPECT_EQ(plan.dir, dir_ / "ckpt" / "iter-000000005");
  ShardStore restored(config(0, 1));
  EXPECT_EQ(restored.load(plan.files), 5);
  std::vector<float> got(trained.size() * kDim);
  restored.pull(trained, got.data());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], at_last_checkpoint[i], 1e-6) << "key " << trained[i / kDim];

  // A checkpoint that cannot be written (its directory is gone): the commit is
  // acknowledged, the worker stays connected, the failure is counted.
  PsService broken(config(0, 1));
  write_file_atomic(dir_ / "not-a-directory", "x");
  broken.checkpoint_every(1, CheckpointDir(dir_ / "not-a-directory", 0, 1, 2));
  transport::TcpServer server2(
      o, [&](const transport::Message& r, transport::OutMessage& out, transport::Scratch& x) { broken.handle(r, out, x); });
  PsClient c({{"127.0.0.1", server2.port()}}, kToken, kDim, 0);
  std::vector<Key> keys = {1, 2, 3};
  std::vector<float> g(keys.size() * kDim, 0.5f);
  std::vector<std::uint32_t> one(keys.size(), 1);
  c.push_grad(0, keys, one, g);
  EXPECT_EQ(c.commit(0), keys.size());
  EXPECT_EQ(broken.checkpoint_failures(), 1u);
  EXPECT_EQ(broken.checkpoints_written(), 0u);
  std::vector<float> rows;
  EXPECT_NO_THROW(c.pull(keys, rows, false, 0));  // the same connection serves on
  EXPECT_EQ(server2.connections_dropped(), 0u);
}

}  // namespace
}  // namespace ember::ps
